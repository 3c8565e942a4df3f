//! Validation of custom resources against their version's `openAPIV3Schema`, as the
//! apiextensions apiserver does it:
//!
//! - the value keywords: `type` (and `x-kubernetes-int-or-string`), `nullable`, `enum`,
//!   `required`, `properties`/`additionalProperties`/`items`, `minimum`/`maximum` and their
//!   exclusive forms, `multipleOf`, `minLength`/`maxLength` (in characters), `pattern`,
//!   `format`, `minItems`/`maxItems`, `uniqueItems`, `minProperties`/`maxProperties`,
//!   `x-kubernetes-list-type: set|map` uniqueness, `allOf`/`anyOf`/`oneOf`/`not`;
//! - the CEL rules of `x-kubernetes-validations`: `self` is the value at the rule's node
//!   (at the root: the object with `apiVersion`, `kind`, `metadata.name` and
//!   `metadata.generateName`), `oldSelf` the value before an update (a rule using it is a
//!   transition rule and runs only when there is an old value to compare: maps by key,
//!   lists only when `x-kubernetes-list-type: map`), `message`, `messageExpression`,
//!   `reason` and `fieldPath`.
//!
//! Messages are Kubernetes' (go-openapi's wording wrapped in the field error types the
//! apiextensions apiserver maps them to), so a client comparing them sees the same text.
//! [`Validator::new`] compiles a schema's rules once per CRD version; [`check_crd_schema`]
//! is the CRD-side check that refuses rules and patterns that do not compile.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::error::FieldError;

/// One compiled `x-kubernetes-validations` entry.
struct Rule {
    source: String,
    program: cel::Program,
    transition: bool,
    message: Option<String>,
    message_expression: Option<cel::Program>,
    reason: Option<String>,
    field_path: Option<String>,
}

/// A version's schema with its CEL rules and patterns compiled, keyed by the schema node
/// (rules) and the pattern's text (patterns).
pub struct Validator {
    schema: Value,
    /// The schema without the root's `apiVersion`, `kind` and `metadata` (checked by the
    /// apiserver itself), what objects are validated against.
    body_schema: Value,
    rules: HashMap<String, Vec<Rule>>,
    patterns: HashMap<String, regex::Regex>,
}

impl Validator {
    /// Compile the rules of `schema` (rules that do not compile are skipped here: the CRD
    /// holding them was refused by [`check_crd_schema`]).
    pub fn new(schema: Value) -> Self {
        let mut rules = HashMap::new();
        walk_rules(&schema, "", &mut |node, list| {
            let compiled: Vec<Rule> = list.iter().filter_map(|r| compile_rule(r).ok()).collect();
            if !compiled.is_empty() {
                rules.insert(node.to_string(), compiled);
            }
        });
        let mut patterns = HashMap::new();
        collect_patterns(&schema, &mut patterns);
        let mut body_schema = schema.clone();
        if let Some(props) = body_schema.get_mut("properties").and_then(Value::as_object_mut) {
            props.remove("metadata");
            props.remove("apiVersion");
            props.remove("kind");
        }
        Validator { schema, body_schema, rules, patterns }
    }

    /// The schema as the CRD declares it.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Validate an object (create) or an object and the one it replaces (update).
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let strip = |o: &Value| {
            let mut body = o.clone();
            if let Some(m) = body.as_object_mut() {
                m.remove("metadata");
                m.remove("apiVersion");
                m.remove("kind");
            }
            body
        };
        let (body, old_body) = (strip(obj), old.map(strip));
        let cx = Cx { rules: &self.rules, patterns: &self.patterns };
        cx.value(&body, old_body.as_ref(), &self.body_schema, "", "", &mut errs);
        // Rules on the root see the type and the object's name.
        if let Some(rules) = self.rules.get("") {
            let root = |o: &Value| {
                let mut r = o.clone();
                let meta = o.get("metadata");
                let pick = |k: &str| meta.and_then(|m| m.get(k)).cloned();
                let mut m = serde_json::Map::new();
                for k in ["name", "generateName"] {
                    if let Some(v) = pick(k) {
                        m.insert(k.into(), v);
                    }
                }
                r["metadata"] = Value::Object(m);
                r
            };
            let (new_root, old_root) = (root(obj), old.map(root));
            if old_root.as_ref() != Some(&new_root) {
                run_rules(rules, &new_root, old_root.as_ref(), &self.schema, "", &mut errs);
            }
        }
        errs
    }
}

struct Cx<'a> {
    rules: &'a HashMap<String, Vec<Rule>>,
    patterns: &'a HashMap<String, regex::Regex>,
}

/// Compile every `pattern` of a schema once (ones that do not compile are left out: the
/// CRD holding them was refused by [`check_crd_schema`]).
fn collect_patterns(schema: &Value, out: &mut HashMap<String, regex::Regex>) {
    match schema {
        Value::Object(m) => {
            if let Some(p) = m.get("pattern").and_then(Value::as_str) {
                if let Ok(re) = regex::Regex::new(p) {
                    out.insert(p.to_string(), re);
                }
            }
            // Every nested schema (properties, items, combinators, …), skipping defaults
            // and enums that may hold a property called `pattern`.
            for (k, v) in m {
                if !matches!(k.as_str(), "default" | "enum" | "example") {
                    collect_patterns(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

fn is_true(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

fn child(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

impl Cx<'_> {
    /// Validate `v` (and its old value `old`, for transition rules) against `schema`, found
    /// at `node` (a JSON pointer into the root schema). Errors are named by `path`.
    fn value(
        &self,
        v: &Value,
        old: Option<&Value>,
        schema: &Value,
        node: &str,
        path: &str,
        errs: &mut Vec<FieldError>,
    ) {
        // Ratcheting: a value an update leaves as it was is not checked again, so objects
        // stored before a schema got stricter stay writable.
        if v.is_null() && is_true(schema, "nullable") || old == Some(v) {
            return;
        }
        if let Some(ty) = schema.get("type").and_then(Value::as_str) {
            if !type_ok(v, ty, schema) {
                let got = json_type(v);
                errs.push(FieldError {
                    reason: "FieldValueTypeInvalid",
                    field: path.to_string(),
                    message: format!(
                        "{path}: Invalid value: \"{got}\": {path} in body must be of type {ty}: \"{got}\""
                    ),
                });
                return;
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            if !allowed.contains(v) {
                let list: Vec<String> =
                    allowed.iter().map(|a| a.as_str().map(str::to_string).unwrap_or_else(|| a.to_string())).collect();
                let list: Vec<&str> = list.iter().map(String::as_str).collect();
                errs.push(FieldError::not_supported(path, v, &list));
            }
        }
        keywords(v, schema, path, self.patterns, errs);
        for (key, what) in [("allOf", 0), ("anyOf", 1), ("oneOf", 2)] {
            let Some(subs) = schema.get(key).and_then(Value::as_array) else { continue };
            let passing = subs
                .iter()
                .filter(|s| {
                    let mut e = Vec::new();
                    self.value(v, old, s, "-", path, &mut e);
                    if what == 0 {
                        errs.extend(e.iter().cloned());
                    }
                    e.is_empty()
                })
                .count();
            let name = if path.is_empty() { "." } else { path };
            if what == 1 && passing == 0 {
                errs.push(FieldError::invalid(path, v, &format!("{name} must validate at least one schema (anyOf)")));
            }
            if what == 2 && passing != 1 {
                errs.push(FieldError::invalid(
                    path,
                    v,
                    &format!("{name} must validate one and only one schema (oneOf)"),
                ));
            }
        }
        if let Some(not) = schema.get("not") {
            let mut e = Vec::new();
            self.value(v, old, not, "-", path, &mut e);
            if e.is_empty() {
                let name = if path.is_empty() { "." } else { path };
                errs.push(FieldError::invalid(path, v, &format!("{name} must not validate the schema (not)")));
            }
        }
        match v {
            Value::Object(m) => {
                for r in
                    schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
                {
                    if !m.contains_key(r) {
                        errs.push(FieldError::required(child(path, r), ""));
                    }
                }
                let props = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties").filter(|a| a.is_object());
                for (k, x) in m {
                    let old_x = old.and_then(|o| o.get(k));
                    if let Some(ps) = props.and_then(|p| p.get(k)) {
                        let n = format!("{node}/properties/{}", super::escape_token(k));
                        self.value(x, old_x, ps, &n, &child(path, k), errs);
                    } else if let Some(ap) = additional {
                        let n = format!("{node}/additionalProperties");
                        self.value(x, old_x, ap, &n, &format!("{path}[{k}]"), errs);
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = schema.get("items") {
                    let keys = list_map_keys(schema);
                    let n = format!("{node}/items");
                    for (i, x) in a.iter().enumerate() {
                        // Only map lists correlate an item with its old self.
                        let old_x = keys.as_ref().and_then(|keys| {
                            let want = key_of(x, keys);
                            old.and_then(Value::as_array)?.iter().find(|o| key_of(o, keys) == want)
                        });
                        self.value(x, old_x, items, &n, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            _ => {}
        }
        // Rules of nested nodes; the root's are run by the caller (they see metadata).
        if !node.is_empty() && node != "-" {
            if let Some(rules) = self.rules.get(node) {
                run_rules(rules, v, old, schema, path, errs);
            }
        }
    }
}

/// The keywords that constrain a value's size, range or form.
fn keywords(
    v: &Value,
    schema: &Value,
    path: &str,
    patterns: &HashMap<String, regex::Regex>,
    errs: &mut Vec<FieldError>,
) {
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let int = |k: &str| schema.get(k).and_then(Value::as_u64);
    let shown = |n: f64| if n.fract() == 0.0 && n.abs() < 1e15 { format!("{}", n as i64) } else { n.to_string() };
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(max) = num("maximum") {
                if is_true(schema, "exclusiveMaximum") && x >= max {
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be less than {}", shown(max)),
                    ));
                } else if x > max {
                    let msg = format!("{path} in body should be less than or equal to {}", shown(max));
                    errs.push(FieldError::invalid(path, v, &msg));
                }
            }
            if let Some(min) = num("minimum") {
                if is_true(schema, "exclusiveMinimum") && x <= min {
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be greater than {}", shown(min)),
                    ));
                } else if x < min {
                    let msg = format!("{path} in body should be greater than or equal to {}", shown(min));
                    errs.push(FieldError::invalid(path, v, &msg));
                }
            }
            if let Some(m) = num("multipleOf").filter(|m| *m > 0.0) {
                let q = x / m;
                if (q - q.round()).abs() > 1e-9 {
                    errs.push(FieldError::invalid(
                        path,
                        v,
                        &format!("{path} in body should be a multiple of {}", shown(m)),
                    ));
                }
            }
        }
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(max) = int("maxLength").filter(|m| chars > *m) {
                errs.push(FieldError::too_long(path, max as usize));
            }
            if let Some(min) = int("minLength").filter(|m| chars < *m) {
                errs.push(FieldError::invalid(path, v, &format!("{path} in body should be at least {min} chars long")));
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                if patterns.get(p).is_some_and(|re| !re.is_match(s)) {
                    errs.push(FieldError::invalid(path, v, &format!("{path} in body should match '{p}'")));
                }
            }
            if let Some(f) = schema.get("format").and_then(Value::as_str) {
                if !format_ok(f, s) {
                    errs.push(FieldError {
                        reason: "FieldValueTypeInvalid",
                        field: path.to_string(),
                        message: format!("{path}: Invalid value: {s:?}: {path} in body must be of type {f}: {s:?}"),
                    });
                }
            }
        }
        Value::Array(a) => {
            let n = a.len() as u64;
            if let Some(max) = int("maxItems").filter(|m| n > *m) {
                errs.push(too_many(path, n, max));
            }
            if let Some(min) = int("minItems").filter(|m| n < *m) {
                errs.push(FieldError::invalid(
                    path,
                    &json!(n),
                    &format!("{path} in body should have at least {min} items"),
                ));
            }
            if is_true(schema, "uniqueItems") && a.iter().enumerate().any(|(i, x)| a[..i].contains(x)) {
                errs.push(FieldError::invalid(path, v, &format!("{path} in body shouldn't contain duplicates")));
            }
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => {
                    for (i, x) in a.iter().enumerate().filter(|(i, x)| a[..*i].contains(x)) {
                        errs.push(FieldError::duplicate(format!("{path}[{i}]"), x));
                    }
                }
                Some("map") => {
                    let keys = list_map_keys(schema).unwrap_or_default();
                    let ks: Vec<Value> = a.iter().map(|x| key_of(x, &keys)).collect();
                    for (i, k) in ks.iter().enumerate().filter(|(i, k)| ks[..*i].contains(k)) {
                        errs.push(FieldError::duplicate(format!("{path}[{i}]"), k));
                    }
                }
                _ => {}
            }
        }
        Value::Object(m) => {
            let n = m.len() as u64;
            if let Some(max) = int("maxProperties").filter(|x| n > *x) {
                errs.push(too_many(path, n, max));
            }
            if let Some(min) = int("minProperties").filter(|x| n < *x) {
                let msg = format!("{path} in body should have at least {min} properties");
                errs.push(FieldError::invalid(path, &json!(n), &msg));
            }
        }
        _ => {}
    }
}

fn too_many(path: &str, actual: u64, max: u64) -> FieldError {
    FieldError {
        reason: "FieldValueTooMany",
        field: path.to_string(),
        message: format!("{path}: Too many: {actual}: must have at most {max} items"),
    }
}

fn list_map_keys(schema: &Value) -> Option<Vec<String>> {
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return None;
    }
    let keys = schema.get("x-kubernetes-list-map-keys").and_then(Value::as_array)?;
    Some(keys.iter().filter_map(Value::as_str).map(str::to_string).collect())
}

/// The key of a map list's item: its key fields, as an object.
fn key_of(item: &Value, keys: &[String]) -> Value {
    let m: serde_json::Map<String, Value> =
        keys.iter().map(|k| (k.clone(), item.get(k).cloned().unwrap_or(Value::Null))).collect();
    Value::Object(m)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(v: &Value, ty: &str, schema: &Value) -> bool {
    if is_true(schema, "x-kubernetes-int-or-string") {
        return v.is_string() || v.is_i64() || v.is_u64();
    }
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

/// The string formats Kubernetes checks (its list; an unknown format is not checked, as
/// upstream ignores formats it does not know).
pub fn format_ok(format: &str, s: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let uuid = |s: &str, version: Option<u8>| {
        let parts: Vec<&str> = s.split('-').collect();
        let shape = parts.len() == 5 && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(n, p)| hex(p, *n));
        shape && version.is_none_or(|v| parts[2].starts_with(char::from(b'0' + v)))
    };
    match format {
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            let max = if ip.contains(':') { 128 } else { 32 };
            ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= max)
        }),
        "mac" => {
            let sep = if s.contains('-') { '-' } else { ':' };
            let parts: Vec<&str> = s.split(sep).collect();
            matches!(parts.len(), 6 | 8 | 20) && parts.iter().all(|p| hex(p, 2))
        }
        "uuid" => uuid(s, None),
        "uuid3" => uuid(s, Some(3)),
        "uuid4" => uuid(s, Some(4)),
        "uuid5" => uuid(s, Some(5)),
        "bsonobjectid" => hex(s, 24),
        "hostname" => {
            s.len() <= 253
                && s.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        }
        "email" => s.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && !local.contains(char::is_whitespace) && format_ok("hostname", domain)
        }),
        "uri" => s.split_once(':').is_some_and(|(scheme, _)| {
            scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }),
        "date" => s.parse::<jiff::civil::Date>().is_ok() && s.len() == 10,
        "date-time" | "datetime" => s.parse::<jiff::Timestamp>().is_ok(),
        "duration" => duration_ok(s),
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }
        "hexcolor" => s.strip_prefix('#').is_some_and(|h| hex(h, 3) || hex(h, 6)),
        "rgbcolor" => s
            .strip_prefix("rgb(")
            .and_then(|r| r.strip_suffix(')'))
            .is_some_and(|r| r.split(',').count() == 3 && r.split(',').all(|c| c.trim().parse::<u8>().is_ok())),
        _ => true,
    }
}

/// A Go duration (`1h30m`, `250ms`, `-1.5s`) or a number of seconds.
fn duration_ok(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    if s == "0" || s.parse::<f64>().is_ok() {
        return true;
    }
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ns", "us", "µs", "ms", "s", "m", "h"].iter().find(|u| rest.starts_with(**u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

// ------------------------------------------------------------------ CEL rules

fn compile_rule(r: &Value) -> Result<Rule, (String, String)> {
    let source = r.get("rule").and_then(Value::as_str).unwrap_or_default().to_string();
    let program =
        cel::Program::compile(&source).map_err(|e| ("rule".to_string(), format!("compilation failed: {e}")))?;
    let transition = program.references().has_variable("oldSelf");
    let message_expression = match r.get("messageExpression").and_then(Value::as_str) {
        Some(m) if !m.trim().is_empty() => Some(
            cel::Program::compile(m)
                .map_err(|e| ("messageExpression".to_string(), format!("messageExpression compilation failed: {e}")))?,
        ),
        _ => None,
    };
    let s = |k: &str| r.get(k).and_then(Value::as_str).filter(|m| !m.trim().is_empty()).map(str::to_string);
    Ok(Rule {
        source,
        program,
        transition,
        message: s("message"),
        message_expression,
        reason: s("reason"),
        field_path: s("fieldPath"),
    })
}

/// Visit every schema node with rules: `f(pointer, rules)`.
fn walk_rules(schema: &Value, node: &str, f: &mut impl FnMut(&str, &[Value])) {
    if let Some(list) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        f(node, list);
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, ps) in props {
            walk_rules(ps, &format!("{node}/properties/{}", super::escape_token(k)), f);
        }
    }
    if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        walk_rules(ap, &format!("{node}/additionalProperties"), f);
    }
    if let Some(items) = schema.get("items").filter(|a| a.is_object()) {
        walk_rules(items, &format!("{node}/items"), f);
    }
}

/// A CEL value as a message (`messageExpression` must give a non-empty one-line string).
fn message_of(rule: &Rule, ctx: &cel::Context) -> String {
    let from_expression = rule.message_expression.as_ref().and_then(|p| match p.execute(ctx) {
        Ok(cel::Value::String(s)) => {
            let s = s.trim().to_string();
            (!s.is_empty() && !s.contains('\n')).then_some(s)
        }
        _ => None,
    });
    from_expression.unwrap_or_else(|| match &rule.message {
        Some(m) => m.trim().to_string(),
        None => format!("failed rule: {}", rule.source.trim()),
    })
}

/// The text of an evaluation error, in CEL-go's words where they differ.
fn eval_error(e: &cel::ExecutionError) -> String {
    match e {
        cel::ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        cel::ExecutionError::DivisionByZero(_) => "division by zero".into(),
        cel::ExecutionError::NoSuchOverload(_) | cel::ExecutionError::UnsupportedBinaryOperator(..) => {
            "no such overload".into()
        }
        other => other.to_string(),
    }
}

/// `fieldPath` (`.spec.x`, `.a['b.c']`, `.list[0]`) appended to a field path.
fn with_field_path(path: &str, rel: &str) -> String {
    let mut out = path.to_string();
    let mut rest = rel;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            out = child(&out, &r[..end]);
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").unwrap_or(r.len());
            out = format!("{out}[{}]", &r[..end]);
            rest = r.get(end + 2..).unwrap_or("");
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').unwrap_or(r.len());
            out = format!("{out}[{}]", &r[..end]);
            rest = r.get(end + 1..).unwrap_or("");
        } else {
            break;
        }
    }
    out
}

fn run_rules(rules: &[Rule], v: &Value, old: Option<&Value>, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        return;
    }
    let ty = json!(schema.get("type").and_then(Value::as_str).unwrap_or(""));
    let mut ctx = cel::Context::default();
    if ctx.add_variable("self", v).is_err() {
        return;
    }
    if let Some(o) = old {
        let _ = ctx.add_variable("oldSelf", o);
    }
    let shown = |p: &str| if p.is_empty() { "<nil>".to_string() } else { p.to_string() };
    for rule in rules {
        if rule.transition && old.is_none() {
            continue;
        }
        let at = shown(path);
        match rule.program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => {
                let at = match &rule.field_path {
                    Some(fp) => with_field_path(path, fp),
                    None => at,
                };
                let msg = message_of(rule, &ctx);
                errs.push(match rule.reason.as_deref() {
                    Some("FieldValueForbidden") => FieldError::forbidden(at, &msg),
                    Some("FieldValueRequired") => FieldError::required(at, &msg),
                    Some("FieldValueDuplicate") => FieldError::duplicate(at, &ty),
                    _ => FieldError::invalid(at, &ty, &msg),
                });
            }
            Ok(other) => {
                let msg = format!("rule did not evaluate to a bool ({other:?}): {}", rule.source.trim());
                errs.push(FieldError::invalid(at, &ty, &msg));
            }
            Err(e) => {
                let what = rule.message.clone().unwrap_or_else(|| rule.source.trim().to_string());
                errs.push(FieldError::invalid(at, &ty, &format!("{} evaluating rule: {what}", eval_error(&e))));
            }
        }
    }
}

/// The CRD-side check of a version's schema: every rule and message expression compiles,
/// every reason is one Kubernetes knows, every pattern is a regular expression. `at` is the
/// schema's field path (`spec.versions[0].schema.openAPIV3Schema`).
pub fn check_crd_schema(schema: &Value, at: &str, errs: &mut Vec<FieldError>) {
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        if let Err(e) = regex::Regex::new(p) {
            let msg = format!("must be a valid regular expression, but isn't: {e}");
            errs.push(FieldError::invalid(format!("{at}.pattern"), &json!(p), &msg));
        }
    }
    if let Some(list) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        for (i, r) in list.iter().enumerate() {
            let here = format!("{at}.x-kubernetes-validations[{i}]");
            if r.get("rule").and_then(Value::as_str).is_none_or(|s| s.trim().is_empty()) {
                errs.push(FieldError::required(format!("{here}.rule"), ""));
                continue;
            }
            if let Err((field, msg)) = compile_rule(r) {
                errs.push(FieldError::invalid(format!("{here}.{field}"), &r[field.as_str()], &msg));
            }
            if let Some(reason) = r.get("reason").and_then(Value::as_str) {
                const REASONS: [&str; 4] =
                    ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];
                if !REASONS.contains(&reason) {
                    errs.push(FieldError::not_supported(format!("{here}.reason"), &json!(reason), &REASONS));
                }
            }
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, ps) in props {
            check_crd_schema(ps, &format!("{at}.properties[{k}]"), errs);
        }
    }
    for k in ["additionalProperties", "items", "not"] {
        if let Some(s) = schema.get(k).filter(|s| s.is_object()) {
            check_crd_schema(s, &format!("{at}.{k}"), errs);
        }
    }
    for k in ["allOf", "anyOf", "oneOf"] {
        for (i, s) in schema.get(k).and_then(Value::as_array).into_iter().flatten().enumerate() {
            check_crd_schema(s, &format!("{at}.{k}[{i}]"), errs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(schema: Value, obj: Value) -> Vec<String> {
        Validator::new(schema).validate(&obj, None).into_iter().map(|e| e.message).collect()
    }

    fn spec(props: Value) -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": props}}})
    }

    #[test]
    fn ranges_lengths_patterns_and_counts_use_kubernetes_words() {
        let s = spec(json!({
            "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
            "ratio": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "multipleOf": 0.5},
            "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
            "tags": {"type": "array", "maxItems": 2, "uniqueItems": true, "items": {"type": "string"}},
            "few": {"type": "array", "minItems": 2, "items": {"type": "string"}},
            "labels": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string"}},
        }));
        let got = messages(
            s.clone(),
            json!({"spec": {"replicas": 20, "ratio": 0, "name": "ABCDEFG", "tags": ["a", "a", "b"], "few": ["x"],
                            "labels": {"a": "1", "b": "2"}}}),
        );
        let want = [
            "spec.few: Invalid value: 1: spec.few in body should have at least 2 items",
            "spec.labels: Too many: 2: must have at most 1 items",
            "spec.name: Too long: may not be more than 5 bytes",
            "spec.name: Invalid value: \"ABCDEFG\": spec.name in body should match '^[a-z]+$'",
            "spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0",
            "spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10",
            "spec.tags: Too many: 3: must have at most 2 items",
            "spec.tags: Invalid value: [\"a\",\"a\",\"b\"]: spec.tags in body shouldn't contain duplicates",
        ];
        assert_eq!(got, want);
        let ok = json!({"spec": {"replicas": 10, "ratio": 1.5, "name": "ab", "tags": ["a"], "few": ["x", "y"]}});
        assert_eq!(messages(s.clone(), ok), Vec::<String>::new());
        let got = messages(s, json!({"spec": {"replicas": 0, "ratio": 0.7, "name": "é"}}));
        assert!(
            got.contains(&"spec.name: Invalid value: \"é\": spec.name in body should be at least 2 chars long".into())
        );
        assert!(got.contains(&"spec.ratio: Invalid value: 0.7: spec.ratio in body should be a multiple of 0.5".into()));
        assert!(got.contains(
            &"spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1".into()
        ));
    }

    #[test]
    fn formats() {
        for (f, good, bad) in [
            ("email", "a@example.com", "x"),
            ("ipv4", "10.0.0.1", "10.0.0.256"),
            ("ipv6", "fd00::1", "fd00:::1"),
            ("cidr", "10.0.0.0/8", "10.0.0.0/33"),
            ("mac", "02:42:ac:11:00:02", "02:42:ac"),
            ("uuid", "6ecb478b-aad1-4e7b-b98a-09a5a0bfd0d2", "6ecb478b"),
            ("uuid4", "6ecb478b-aad1-4e7b-b98a-09a5a0bfd0d2", "6ecb478b-aad1-3e7b-b98a-09a5a0bfd0d2"),
            ("hostname", "a.example.com", "-a.example.com"),
            ("date", "2026-11-27", "2026-13-01"),
            ("date-time", "2026-11-27T12:00:00Z", "yesterday"),
            ("duration", "1h30m", "ten minutes"),
            ("byte", "aGVsbG8=", "not base64!"),
            ("uri", "https://example.com/x", "example"),
            ("hexcolor", "#ff0000", "red"),
        ] {
            assert!(format_ok(f, good), "{f} {good}");
            assert!(!format_ok(f, bad), "{f} {bad}");
        }
        assert!(format_ok("no-such-format", "anything"));
        let got =
            messages(spec(json!({"email": {"type": "string", "format": "email"}})), json!({"spec": {"email": "x"}}));
        assert_eq!(got, ["spec.email: Invalid value: \"x\": spec.email in body must be of type email: \"x\""]);
    }

    #[test]
    fn list_types_and_combinators() {
        let s = spec(json!({
            "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}},
            "one": {"type": "integer", "anyOf": [{"minimum": 10}, {"maximum": 0}]},
            "not": {"type": "string", "not": {"enum": ["forbidden"]}},
        }));
        let got = messages(
            s,
            json!({"spec": {"set": ["a", "b", "a"], "ports": [{"name": "h", "port": 1}, {"name": "h", "port": 2}],
                            "one": 5, "not": "forbidden"}}),
        );
        assert_eq!(
            got,
            [
                "spec.not: Invalid value: \"forbidden\": spec.not must not validate the schema (not)",
                "spec.one: Invalid value: 5: spec.one must validate at least one schema (anyOf)",
                "spec.ports[1]: Duplicate value: {\"name\":\"h\"}",
                "spec.set[2]: Duplicate value: \"a\"",
            ]
        );
    }

    fn widget() -> Value {
        json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('w')", "message": "name must start with w"}],
            "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.replicas <= self.max", "messageExpression": "'replicas ' + string(self.replicas) + ' above max'"},
                {"rule": "!has(self.owner) || self.owner != ''", "reason": "FieldValueForbidden", "fieldPath": ".owner"},
                {"rule": "self.max >= oldSelf.max", "message": "max may not shrink"},
                {"rule": "self.missing > 0"},
            ],
            "properties": {"replicas": {"type": "integer"}, "max": {"type": "integer"}, "owner": {"type": "string"},
                "missing": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self.size() < 4"}]}}}}}})
    }

    #[test]
    fn cel_rules_with_messages_reasons_paths_and_transitions() {
        let v = Validator::new(widget());
        let obj = json!({"metadata": {"name": "x"}, "spec": {"replicas": 5, "max": 3, "owner": "", "items": ["ok", "toolong"]}});
        let got: Vec<(String, &str)> = v.validate(&obj, None).into_iter().map(|e| (e.message, e.reason)).collect();
        let want = [
            ("spec.items[1]: Invalid value: \"string\": failed rule: self.size() < 4".to_string(), "FieldValueInvalid"),
            ("spec: Invalid value: \"object\": replicas 5 above max".into(), "FieldValueInvalid"),
            ("spec.owner: Forbidden: failed rule: !has(self.owner) || self.owner != ''".into(), "FieldValueForbidden"),
            (
                "spec: Invalid value: \"object\": no such key: missing evaluating rule: self.missing > 0".into(),
                "FieldValueInvalid",
            ),
            ("<nil>: Invalid value: \"object\": name must start with w".into(), "FieldValueInvalid"),
        ];
        assert_eq!(got, want, "the transition rule is skipped on create");
        let old = json!({"metadata": {"name": "w"}, "spec": {"replicas": 1, "max": 9, "missing": 1}});
        let new = json!({"metadata": {"name": "w"}, "spec": {"replicas": 1, "max": 2, "missing": 1}});
        let got: Vec<String> = v.validate(&new, Some(&old)).into_iter().map(|e| e.message).collect();
        assert_eq!(got, ["spec: Invalid value: \"object\": max may not shrink"]);
        assert!(v.validate(&old, Some(&new)).is_empty());
    }

    #[test]
    fn a_crd_with_a_bad_rule_or_pattern_is_refused() {
        let mut errs = Vec::new();
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.a <="}, {"rule": "true", "reason": "Nope"}],
            "properties": {"a": {"type": "string", "pattern": "["}}}}});
        check_crd_schema(&schema, "spec.versions[0].schema.openAPIV3Schema", &mut errs);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule",
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[1].reason",
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[a].pattern",
            ]
        );
        assert!(errs[0].message.contains("compilation failed: "), "{}", errs[0].message);
        check_crd_schema(&widget(), "s", &mut errs);
        assert_eq!(errs.len(), 3, "the widget's rules compile");
    }

    #[test]
    fn an_update_does_not_recheck_what_it_leaves_unchanged() {
        let v = Validator::new(spec(
            json!({"name": {"type": "string", "maxLength": 3}, "n": {"type": "integer", "maximum": 5}}),
        ));
        let old = json!({"spec": {"name": "too long already", "n": 1}});
        assert!(v.validate(&json!({"spec": {"name": "too long already", "n": 2}}), Some(&old)).is_empty());
        let got = v.validate(&json!({"spec": {"name": "too long already", "n": 6}}), Some(&old));
        assert_eq!(got.iter().map(|e| e.field.as_str()).collect::<Vec<_>>(), ["spec.n"]);
        assert_eq!(v.validate(&old, None).len(), 1, "a create checks everything");
    }

    #[test]
    fn field_paths() {
        assert_eq!(with_field_path("spec", ".owner"), "spec.owner");
        assert_eq!(with_field_path("", ".a['b.c'][0]"), "a[b.c][0]");
    }
}
