//! Label and field selectors: parsing (Kubernetes' string syntax) and matching. Pure.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// A parse failure; answered as 400 BadRequest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelOp {
    Exists,
    NotExists,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Gt(i64),
    Lt(i64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: LabelOp,
}

/// A label selector: all requirements must hold. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match &self.op {
            LabelOp::Exists => v.is_some(),
            LabelOp::NotExists => v.is_none(),
            LabelOp::Equals(x) => v == Some(x),
            LabelOp::NotEquals(x) => v != Some(x),
            LabelOp::In(xs) => v.is_some_and(|v| xs.contains(v)),
            LabelOp::NotIn(xs) => !v.is_some_and(|v| xs.contains(v)),
            LabelOp::Gt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
            LabelOp::Lt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        match &self.op {
            LabelOp::Exists => write!(f, "{k}"),
            LabelOp::NotExists => write!(f, "!{k}"),
            LabelOp::Equals(v) => write!(f, "{k}={v}"),
            LabelOp::NotEquals(v) => write!(f, "{k}!={v}"),
            LabelOp::In(vs) => write!(f, "{k} in ({})", vs.join(",")),
            LabelOp::NotIn(vs) => write!(f, "{k} notin ({})", vs.join(",")),
            LabelOp::Gt(n) => write!(f, "{k}>{n}"),
            LabelOp::Lt(n) => write!(f, "{k}<{n}"),
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(|r| r.to_string()).collect();
        write!(f, "{}", parts.join(","))
    }
}

impl LabelSelector {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Match an object's `metadata.labels`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        if self.is_empty() {
            return true;
        }
        self.matches(&labels_of(obj))
    }

    /// Parse Kubernetes' selector syntax: `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
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
        Ok(LabelSelector { requirements })
    }

    /// Build from a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_label_selector_json(sel: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in ml {
                let v = v.as_str().ok_or_else(|| SelectorError(format!("matchLabels[{k}] is not a string")))?;
                validate_key(k)?;
                validate_value(v)?;
                requirements.push(Requirement { key: k.clone(), op: LabelOp::Equals(v.to_string()) });
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e.get("key").and_then(Value::as_str).unwrap_or_default().to_string();
                validate_key(&key)?;
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str).unwrap_or_default() {
                    "In" | "NotIn" if values.is_empty() => {
                        return Err(SelectorError("for 'in', 'notin' operators, values set can't be empty".into()))
                    }
                    "In" => LabelOp::In(values),
                    "NotIn" => LabelOp::NotIn(values),
                    "Exists" | "DoesNotExist" if !values.is_empty() => {
                        return Err(SelectorError("values set must be empty for exists and does not exist".into()))
                    }
                    "Exists" => LabelOp::Exists,
                    "DoesNotExist" => LabelOp::NotExists,
                    other => return Err(SelectorError(format!("{other:?} is not a valid label selector operator"))),
                };
                requirements.push(Requirement { key, op });
            }
        }
        Ok(LabelSelector { requirements })
    }
}

/// `metadata.labels` of an object as a map (non-string values are ignored).
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
        .unwrap_or_default()
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
        return Ok(Requirement { key: key.to_string(), op: LabelOp::NotExists });
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
            "in" => LabelOp::In(values),
            "notin" => LabelOp::NotIn(values),
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
                    LabelOp::NotEquals(value.to_string())
                }
                1 => {
                    validate_value(value)?;
                    LabelOp::Equals(value.to_string())
                }
                _ => {
                    let n: i64 = value.parse().map_err(|_| {
                        SelectorError(format!("unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {part:?}"))
                    })?;
                    if kind == 2 {
                        LabelOp::Gt(n)
                    } else {
                        LabelOp::Lt(n)
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
    Ok(Requirement { key: key.to_string(), op: LabelOp::Exists })
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

// ---------------------------------------------------------------------------------------
// Field selectors

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub value: String,
    pub negate: bool,
}

/// A field selector: `metadata.name=x,status.phase!=Running`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector::default());
        }
        for part in split_unescaped(s, ',') {
            let (field, value, negate) = if let Some((f, v)) = split_op(&part, "!=") {
                (f, v, true)
            } else if let Some((f, v)) = split_op(&part, "==") {
                (f, v, false)
            } else if let Some((f, v)) = split_op(&part, "=") {
                (f, v, false)
            } else {
                return Err(SelectorError(format!("invalid selector: '{s}'; can't understand '{part}'")));
            };
            let field = field.trim().to_string();
            if field.is_empty() {
                return Err(SelectorError(format!("invalid selector: '{s}'; empty field name")));
            }
            requirements.push(FieldRequirement { field, value: unescape(&value), negate });
        }
        Ok(FieldSelector { requirements })
    }

    /// The value `metadata.name=<v>` pins, if any (lets a list read one key).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.requirements.iter().find(|r| r.field == field && !r.negate).map(|r| r.value.as_str())
    }

    /// Match using `get` to read a field's value as a string (None = unsupported field, which
    /// the caller has rejected before).
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let v = get(&r.field).unwrap_or_default();
            (v == r.value) != r.negate
        })
    }
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

/// Split at the first unescaped occurrence of `op`.
fn split_op(s: &str, op: &str) -> Option<(String, String)> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i..].starts_with(op) {
            // `=` must not be the second char of `!=` or `==`
            return Some((s[..i].to_string(), s[i + op.len()..].to_string()));
        }
        i += 1;
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn equality_based() {
        let s = LabelSelector::parse("app=web,tier!=db").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "fe")])));
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "api")])));
        let s = LabelSelector::parse("app==web").unwrap();
        assert!(s.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn set_based() {
        let s = LabelSelector::parse("env in (prod, staging),tier notin (db),release,!canary").unwrap();
        assert_eq!(s.requirements.len(), 4);
        assert!(s.matches(&labels(&[("env", "prod"), ("release", "1")])));
        assert!(!s.matches(&labels(&[("env", "dev"), ("release", "1")])));
        assert!(!s.matches(&labels(&[("env", "prod")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("release", "1"), ("canary", "")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("release", "1"), ("tier", "db")])));
        assert_eq!(s.to_string(), "env in (prod,staging),tier notin (db),release,!canary");
    }

    #[test]
    fn gt_lt() {
        let s = LabelSelector::parse("n>3,n<10").unwrap();
        assert!(s.matches(&labels(&[("n", "5")])));
        assert!(!s.matches(&labels(&[("n", "10")])));
        assert!(!s.matches(&labels(&[("n", "x")])));
    }

    #[test]
    fn empty_matches_all() {
        let s = LabelSelector::parse("").unwrap();
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn parse_errors() {
        for bad in ["app=", "a b", "env in ()", "env in (a", "env foo (a)", "x=,", "=v", "a=b c", "n>x"] {
            let r = LabelSelector::parse(bad);
            // "app=" is valid in Kubernetes (empty value); everything else must fail.
            if bad == "app=" {
                assert!(r.is_ok(), "{bad}");
            } else {
                assert!(r.is_err(), "{bad} parsed as {r:?}");
            }
        }
    }

    #[test]
    fn from_json_selector() {
        let s = LabelSelector::from_label_selector_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
        }))
        .unwrap();
        assert_eq!(s.to_string(), "app=web,tier in (a,b)");
        assert!(LabelSelector::from_label_selector_json(&json!({
            "matchExpressions": [{"key": "tier", "operator": "Bogus"}]
        }))
        .is_err());
    }

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse("metadata.name=x,status.phase!=Running").unwrap();
        assert_eq!(f.exact("metadata.name"), Some("x"));
        fn obj(name: &'static str, phase: &'static str) -> impl Fn(&str) -> Option<String> {
            move |field: &str| match field {
                "metadata.name" => Some(name.to_string()),
                "status.phase" => Some(phase.to_string()),
                _ => None,
            }
        }
        assert!(f.matches(obj("x", "Pending")));
        assert!(!f.matches(obj("x", "Running")));
        assert!(!f.matches(obj("y", "Pending")));
        let f = FieldSelector::parse("spec.nodeName==").unwrap();
        assert_eq!(f.requirements[0].value, "");
        let f = FieldSelector::parse(r"metadata.name=a\,b").unwrap();
        assert_eq!(f.requirements.len(), 1);
        assert_eq!(f.requirements[0].value, "a,b");
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
