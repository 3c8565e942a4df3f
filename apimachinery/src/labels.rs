//! Label selectors, written once for every component: the string form of `?labelSelector=`
//! (`app=web,tier!=db,env in (a,b),release,!canary,n>3`), the `metav1.LabelSelector` of
//! objects (`matchLabels`, `matchExpressions`), the conversions between them, and one
//! evaluation against an object's labels. Pure.
//!
//! The rules, Kubernetes' own:
//! - an empty selector selects everything; an absent one (`None`) selects nothing;
//! - an operator other than `In`, `NotIn`, `Exists` and `DoesNotExist` is an error when the
//!   selector is built (parsing, validation), and so are an invalid key or value, `In` or
//!   `NotIn` without values, and `Exists` or `DoesNotExist` with values;
//! - a selector that cannot be built selects nothing ([`selector_or_nothing`], [`selects`]):
//!   a controller or the scheduler never acts on a selector the apiserver would refuse;
//! - `NotIn` and `!=` hold for an object without the key; `>` and `<` need the key and an
//!   integer value.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde_json::Value;

/// Why a selector could not be built; the apiserver answers it as 400 or 422.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError(pub String);

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SelectorError {}

/// What a requirement asks of one label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operator {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Gt(i64),
    Lt(i64),
}

/// One requirement on one label key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Operator,
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(&self.key).map(String::as_str))
    }

    /// Does the requirement hold for an object whose label `key` is `value` (None: absent)?
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match &self.op {
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Equals(x) => value == Some(x.as_str()),
            Operator::NotEquals(x) => value != Some(x.as_str()),
            Operator::In(xs) => value.is_some_and(|v| xs.iter().any(|x| x == v)),
            Operator::NotIn(xs) => !value.is_some_and(|v| xs.iter().any(|x| x == v)),
            Operator::Gt(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
            Operator::Lt(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
        }
    }

    /// A `matchLabels` entry: `key=value`.
    pub fn match_label(key: &str, value: &str) -> Result<Self, SelectorError> {
        validate_key(key)?;
        validate_value(value)?;
        Ok(Requirement { key: key.to_string(), op: Operator::Equals(value.to_string()) })
    }

    /// A `matchExpressions` entry (`LabelSelectorRequirement`).
    pub fn match_expression(key: &str, operator: &str, values: Vec<String>) -> Result<Self, SelectorError> {
        validate_key(key)?;
        let op = match operator {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError("for 'in', 'notin' operators, values set can't be empty".into()))
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError("values set must be empty for exists and does not exist".into()))
            }
            "In" | "NotIn" => {
                for v in &values {
                    validate_value(v)?;
                }
                if operator == "In" {
                    Operator::In(values)
                } else {
                    Operator::NotIn(values)
                }
            }
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(not_a_label_selector_operator(other)),
        };
        Ok(Requirement { key: key.to_string(), op })
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        match &self.op {
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
            Operator::Equals(v) => write!(f, "{k}={v}"),
            Operator::NotEquals(v) => write!(f, "{k}!={v}"),
            Operator::In(vs) => write!(f, "{k} in ({})", vs.join(",")),
            Operator::NotIn(vs) => write!(f, "{k} notin ({})", vs.join(",")),
            Operator::Gt(n) => write!(f, "{k}>{n}"),
            Operator::Lt(n) => write!(f, "{k}<{n}"),
        }
    }
}

/// A label selector: every requirement must hold. The default (no requirements) selects
/// everything; [`Selector::nothing`] selects nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl Selector {
    pub fn everything() -> Self {
        Selector::default()
    }

    /// The selector of an absent `LabelSelector`, or of one that could not be built.
    pub fn nothing() -> Self {
        Selector { requirements: Vec::new(), nothing: true }
    }

    /// True for a selector without requirements (selects everything).
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    pub fn is_nothing(&self) -> bool {
        self.nothing
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// This selector with one more requirement (a selector of nothing stays one).
    pub fn with_requirement(mut self, requirement: Requirement) -> Self {
        if !self.nothing {
            self.requirements.push(requirement);
        }
        self
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Match an object's `metadata.labels` (JSON).
    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.is_empty() {
            return true;
        }
        self.matches(&labels_of(obj))
    }

    /// Parse the string form: `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>1,n<9`. The empty
    /// string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_top_level(s)? {
            let part = part.trim();
            if part.is_empty() {
                if s.trim().is_empty() {
                    continue;
                }
                return Err(SelectorError(format!("unable to parse requirement: found empty requirement in {s:?}")));
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Selector { requirements, nothing: false })
    }

    /// A present `metav1.LabelSelector`: matchLabels, then matchExpressions, in their order.
    pub fn from_label_selector(sel: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            requirements.push(Requirement::match_label(k, v)?);
        }
        for e in sel.match_expressions.iter().flatten() {
            requirements.push(Requirement::match_expression(
                &e.key,
                &e.operator,
                e.values.clone().unwrap_or_default(),
            )?);
        }
        Ok(Selector { requirements, nothing: false })
    }

    /// [`Selector::from_label_selector`] for a selector still in JSON (the apiserver's
    /// objects), keeping the order of its fields.
    pub fn from_label_selector_json(sel: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                let v = v.as_str().ok_or_else(|| SelectorError(format!("matchLabels[{k}] is not a string")))?;
                requirements.push(Requirement::match_label(k, v)?);
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
                let operator = e.get("operator").and_then(Value::as_str).unwrap_or_default();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                requirements.push(Requirement::match_expression(key, operator, values)?);
            }
        }
        Ok(Selector { requirements, nothing: false })
    }

    /// The `metav1.LabelSelector` of this selector: `=` and `==` become matchLabels, set
    /// and existence requirements matchExpressions. `!=`, `>` and `<` have no such form,
    /// and neither has a selector of nothing.
    pub fn to_label_selector(&self) -> Result<LabelSelector, SelectorError> {
        if self.nothing {
            return Err(SelectorError("a selector that selects nothing has no LabelSelector form".into()));
        }
        let mut match_labels = BTreeMap::new();
        let mut match_expressions = Vec::new();
        for r in &self.requirements {
            let expr = |operator: &str, values: Option<&Vec<String>>| LabelSelectorRequirement {
                key: r.key.clone(),
                operator: operator.into(),
                values: values.cloned(),
            };
            match &r.op {
                Operator::Equals(v) => {
                    match_labels.insert(r.key.clone(), v.clone());
                }
                Operator::In(vs) => match_expressions.push(expr("In", Some(vs))),
                Operator::NotIn(vs) => match_expressions.push(expr("NotIn", Some(vs))),
                Operator::Exists => match_expressions.push(expr("Exists", None)),
                Operator::DoesNotExist => match_expressions.push(expr("DoesNotExist", None)),
                Operator::NotEquals(_) => return Err(not_a_label_selector_operator("!=")),
                Operator::Gt(_) => return Err(not_a_label_selector_operator("gt")),
                Operator::Lt(_) => return Err(not_a_label_selector_operator("lt")),
            }
        }
        Ok(LabelSelector {
            match_labels: (!match_labels.is_empty()).then_some(match_labels),
            match_expressions: (!match_expressions.is_empty()).then_some(match_expressions),
        })
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        write!(f, "{}", parts.join(","))
    }
}

/// The selector of an object's optional `LabelSelector` field: absent or invalid selects
/// nothing, empty everything.
pub fn selector_or_nothing(sel: Option<&LabelSelector>) -> Selector {
    sel.and_then(|s| Selector::from_label_selector(s).ok()).unwrap_or_else(Selector::nothing)
}

/// Does `sel` select `labels`? (Absent or invalid: no; empty: yes.) For one test; build the
/// selector once with [`selector_or_nothing`] to test many objects.
pub fn selects(sel: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    selector_or_nothing(sel).matches(labels)
}

/// `metadata.labels` of an object as a map (non-string values are ignored).
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
        .unwrap_or_default()
}

fn not_a_label_selector_operator(op: &str) -> SelectorError {
    SelectorError(format!("{op:?} is not a valid label selector operator"))
}

/// Split on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<String>, SelectorError> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(format!("unable to parse requirement: unbalanced ')' in {s:?}")));
                }
                cur.push(c)
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!("unable to parse requirement: unbalanced '(' in {s:?}")));
    }
    parts.push(cur);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, SelectorError> {
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(Requirement { key: key.to_string(), op: Operator::DoesNotExist });
    }
    // Set-based: key in (...), key notin (...)
    if let Some(open) = part.find('(') {
        let head = part[..open].trim();
        let close = part
            .rfind(')')
            .ok_or_else(|| SelectorError(format!("unable to parse requirement: missing ')' in {part:?}")))?;
        if !part[close + 1..].trim().is_empty() || close < open {
            return Err(SelectorError(format!("unable to parse requirement: {part:?}")));
        }
        let mut words = head.split_whitespace();
        let key = words.next().unwrap_or_default();
        let op = words.next().unwrap_or_default();
        if words.next().is_some() {
            return Err(SelectorError(format!("unable to parse requirement: {part:?}")));
        }
        validate_key(key)?;
        let values: Vec<String> = part[open + 1..close].split(',').map(|v| v.trim().to_string()).collect();
        let values: Vec<String> = if values.len() == 1 && values[0].is_empty() { vec![] } else { values };
        for v in &values {
            validate_value(v)?;
        }
        if values.is_empty() {
            return Err(SelectorError(format!(
                "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty: {part:?}"
            )));
        }
        let op = match op {
            "in" => Operator::In(values),
            "notin" => Operator::NotIn(values),
            other => {
                return Err(SelectorError(format!("unable to parse requirement: found '{other}', expected: in, notin")))
            }
        };
        return Ok(Requirement { key: key.to_string(), op });
    }
    for (sym, kind) in [("!=", 0), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
        if let Some(i) = part.find(sym) {
            let key = part[..i].trim();
            let value = part[i + sym.len()..].trim();
            validate_key(key)?;
            let op = match kind {
                0 => {
                    validate_value(value)?;
                    Operator::NotEquals(value.to_string())
                }
                1 => {
                    validate_value(value)?;
                    Operator::Equals(value.to_string())
                }
                _ => {
                    let n: i64 = value.parse().map_err(|_| {
                        SelectorError(format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {part:?}"))
                    })?;
                    if kind == 2 {
                        Operator::Gt(n)
                    } else {
                        Operator::Lt(n)
                    }
                }
            };
            return Ok(Requirement { key: key.to_string(), op });
        }
    }
    let key = part.trim();
    if key.contains(char::is_whitespace) {
        return Err(SelectorError(format!("unable to parse requirement: {part:?}")));
    }
    validate_key(key)?;
    Ok(Requirement { key: key.to_string(), op: Operator::Exists })
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    crate::validation::qualified_name_errors(key)
        .map(|msg| Err(SelectorError(format!("unable to parse requirement: invalid label key {key:?}: {msg}"))))
        .unwrap_or(Ok(()))
}

fn validate_value(v: &str) -> Result<(), SelectorError> {
    crate::validation::label_value_errors(v)
        .map(|msg| Err(SelectorError(format!("unable to parse requirement: invalid label value: {v:?}: {msg}"))))
        .unwrap_or(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn typed(v: Value) -> LabelSelector {
        serde_json::from_value(v).expect("a LabelSelector")
    }

    #[test]
    fn equality_based() {
        let s = Selector::parse("app=web,tier!=db").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "fe")])));
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "api")])));
        let s = Selector::parse("app==web").unwrap();
        assert!(s.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn set_based() {
        let s = Selector::parse("env in (prod, staging),tier notin (db),release,!canary").unwrap();
        assert_eq!(s.requirements().len(), 4);
        assert!(s.matches(&labels(&[("env", "prod"), ("release", "1")])));
        assert!(!s.matches(&labels(&[("env", "dev"), ("release", "1")])));
        assert!(!s.matches(&labels(&[("env", "prod")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("release", "1"), ("canary", "")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("release", "1"), ("tier", "db")])));
        assert_eq!(s.to_string(), "env in (prod,staging),tier notin (db),release,!canary");
    }

    #[test]
    fn gt_lt() {
        let s = Selector::parse("n>3,n<10").unwrap();
        assert!(s.matches(&labels(&[("n", "5")])));
        assert!(!s.matches(&labels(&[("n", "10")])));
        assert!(!s.matches(&labels(&[("n", "x")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn empty_matches_all() {
        let s = Selector::parse("").unwrap();
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
        assert!(s.matches_object(&json!({"metadata": {}})));
    }

    #[test]
    fn parse_errors() {
        for bad in ["a b", "env in ()", "env in (a", "env foo (a)", "x=,", "=v", "a=b c", "n>x", "a)", "-a"] {
            let r = Selector::parse(bad);
            assert!(r.is_err(), "{bad} parsed as {r:?}");
        }
        // An empty value is a value.
        assert!(Selector::parse("app=").is_ok());
    }

    #[test]
    fn label_selector_semantics() {
        let s = typed(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "canary", "operator": "DoesNotExist"},
                                 {"key": "zone", "operator": "NotIn", "values": ["z1"]},
                                 {"key": "release", "operator": "Exists"}]
        }));
        let s = Selector::from_label_selector(&s).unwrap();
        assert_eq!(s.to_string(), "app=web,tier in (a,b),!canary,zone notin (z1),release");
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "a"), ("release", "1")])));
        // NotIn holds without the key; the other requirements do not.
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("release", "1"), ("zone", "z1")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a"), ("release", "1"), ("canary", "y")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c"), ("release", "1")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a")])));
    }

    #[test]
    fn absent_selects_nothing_empty_everything() {
        let l = labels(&[("app", "web")]);
        assert!(!selects(None, &l));
        assert!(selects(Some(&LabelSelector::default()), &l));
        assert!(selects(Some(&typed(json!({"matchLabels": {}, "matchExpressions": []}))), &l));
        assert!(!Selector::nothing().matches(&labels(&[])));
        assert!(!Selector::nothing().is_empty());
        assert!(!Selector::nothing().matches_object(&json!({})));
        // A selector of nothing stays one.
        let r = Requirement { key: "app".into(), op: Operator::Exists };
        assert!(Selector::nothing().with_requirement(r.clone()).is_nothing());
        assert!(Selector::everything().with_requirement(r).matches(&l));
    }

    #[test]
    fn an_unknown_operator_is_an_error_and_selects_nothing() {
        let bogus = typed(json!({"matchExpressions": [{"key": "app", "operator": "Bogus"}]}));
        let err = Selector::from_label_selector(&bogus).unwrap_err();
        assert_eq!(err.0, "\"Bogus\" is not a valid label selector operator");
        // Operators are case-sensitive: the string form's `in` is not `In`.
        let lower = typed(json!({"matchExpressions": [{"key": "app", "operator": "in", "values": ["web"]}]}));
        assert!(Selector::from_label_selector(&lower).is_err());
        let l = labels(&[("app", "web")]);
        assert!(!selects(Some(&bogus), &l));
        // Even where the rest alone would select everything (NotIn of an absent value).
        let mixed = typed(json!({"matchExpressions": [
            {"key": "x", "operator": "NotIn", "values": ["y"]},
            {"key": "app", "operator": "Bogus", "values": ["web"]}]}));
        assert!(!selects(Some(&mixed), &l));
        assert!(selector_or_nothing(Some(&mixed)).is_nothing());
    }

    #[test]
    fn invalid_requirements_are_errors_and_select_nothing() {
        let l = labels(&[("app", "web")]);
        for bad in [
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn"}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["web"]}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["not valid"]}]}),
            json!({"matchExpressions": [{"key": "bad key", "operator": "Exists"}]}),
            json!({"matchLabels": {"bad key": "web"}}),
            json!({"matchLabels": {"app": "-web"}}),
        ] {
            assert!(Selector::from_label_selector(&typed(bad.clone())).is_err(), "{bad}");
            assert!(Selector::from_label_selector_json(&bad).is_err(), "{bad}");
            assert!(!selects(Some(&typed(bad.clone())), &l), "{bad}");
        }
        assert_eq!(
            Selector::from_label_selector_json(&json!({"matchExpressions": [{"key": "a", "operator": "In"}]}))
                .unwrap_err()
                .0,
            "for 'in', 'notin' operators, values set can't be empty"
        );
        assert!(Selector::from_label_selector_json(&json!({"matchLabels": {"app": 1}})).is_err());
    }

    #[test]
    fn json_and_typed_agree() {
        let v = json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
        });
        let from_json = Selector::from_label_selector_json(&v).unwrap();
        assert_eq!(from_json, Selector::from_label_selector(&typed(v)).unwrap());
        assert_eq!(from_json.to_string(), "app=web,tier in (a,b)");
    }

    #[test]
    fn conversions_between_the_forms() {
        let s = Selector::parse("app=web,tier in (a,b),release,!canary").unwrap();
        let ls = s.to_label_selector().unwrap();
        assert_eq!(
            serde_json::to_value(&ls).unwrap(),
            json!({"matchLabels": {"app": "web"}, "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "release", "operator": "Exists"},
                {"key": "canary", "operator": "DoesNotExist"}]})
        );
        let back = Selector::from_label_selector(&ls).unwrap();
        for l in [labels(&[("app", "web"), ("tier", "b"), ("release", "")]), labels(&[("app", "web"), ("tier", "b")])] {
            assert_eq!(back.matches(&l), s.matches(&l));
        }
        assert_eq!(Selector::parse("").unwrap().to_label_selector().unwrap(), LabelSelector::default());
        for no_form in ["a!=b", "n>1", "n<1"] {
            assert!(Selector::parse(no_form).unwrap().to_label_selector().is_err(), "{no_form}");
        }
        assert!(Selector::nothing().to_label_selector().is_err());
    }

    #[test]
    fn labels_of_objects() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": 2}}});
        assert_eq!(labels_of(&o), labels(&[("a", "1")]));
        assert!(Selector::parse("a=1").unwrap().matches_object(&o));
        assert!(labels_of(&json!({})).is_empty());
    }
}
