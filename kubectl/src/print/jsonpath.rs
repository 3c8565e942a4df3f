//! kubectl's JSONPath templates (`-o jsonpath='{.items[*].metadata.name}'`): text with
//! `{…}` actions — field paths (`.a.b`, `['a.b']`, `[0]`, `[-1]`, `[*]`, `[1:3]`, `..name`),
//! filters (`[?(@.type=="Ready")]`), `{range …}…{end}`, and quoted literals (`{"\n"}`).
//! Pure.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Expr(Vec<Step>),
    Range(Vec<Step>, Vec<Node>),
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Root,
    Field(String),
    Recursive(String),
    Wildcard,
    Index(i64),
    Slice(Option<i64>, Option<i64>),
    Filter(Vec<Step>, String, Option<Value>),
}

/// Render `template` against `data`.
pub fn render(template: &str, data: &Value) -> Result<String, String> {
    let nodes = parse(template)?;
    let mut out = String::new();
    exec(&nodes, data, data, &mut out)?;
    Ok(out)
}

/// The values a single path expression (`.metadata.name` or `{.metadata.name}`) selects.
pub fn select(expr: &str, data: &Value) -> Result<Vec<Value>, String> {
    let inner = expr.trim();
    let inner = inner.strip_prefix('{').and_then(|s| s.strip_suffix('}')).unwrap_or(inner);
    let steps = parse_path(inner)?;
    Ok(eval(&steps, data, data))
}

fn parse(t: &str) -> Result<Vec<Node>, String> {
    let mut stack: Vec<(Vec<Step>, Vec<Node>)> = Vec::new();
    let mut cur: Vec<Node> = Vec::new();
    let mut rest = t;
    while !rest.is_empty() {
        match rest.find('{') {
            None => {
                cur.push(Node::Text(rest.to_string()));
                break;
            }
            Some(i) => {
                if i > 0 {
                    cur.push(Node::Text(rest[..i].to_string()));
                }
                let after = &rest[i + 1..];
                let end = find_close(after).ok_or_else(|| format!("unclosed action in {t:?}"))?;
                let action = after[..end].trim();
                rest = &after[end + 1..];
                if let Some(p) = action.strip_prefix("range") {
                    stack.push((parse_path(p.trim())?, std::mem::take(&mut cur)));
                } else if action == "end" {
                    let (path, parent) = stack.pop().ok_or("not in range, nothing to end")?;
                    let body = std::mem::replace(&mut cur, parent);
                    cur.push(Node::Range(path, body));
                } else if let Some(lit) = quoted(action) {
                    cur.push(Node::Text(lit));
                } else {
                    cur.push(Node::Expr(parse_path(action)?));
                }
            }
        }
    }
    if !stack.is_empty() {
        return Err("unclosed range".into());
    }
    Ok(cur)
}

/// The end of an action, skipping quoted strings.
fn find_close(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"') | (None, '\'') => quote = Some(c),
            (None, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

fn quoted(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"').and_then(|x| x.strip_suffix('"'))?;
    Some(inner.replace("\\n", "\n").replace("\\t", "\t").replace("\\\"", "\""))
}

fn parse_path(p: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let chars: Vec<char> = p.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '$' => {
                steps.push(Step::Root);
                i += 1;
            }
            '@' => i += 1,
            '.' => {
                let recursive = chars.get(i + 1) == Some(&'.');
                i += if recursive { 2 } else { 1 };
                let start = i;
                while i < chars.len() && !matches!(chars[i], '.' | '[') {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                if recursive {
                    steps.push(Step::Recursive(name));
                } else if name == "*" {
                    steps.push(Step::Wildcard);
                } else if !name.is_empty() {
                    steps.push(Step::Field(name));
                }
            }
            '[' => {
                let mut depth = 0;
                let mut j = i;
                let mut quote: Option<char> = None;
                while j < chars.len() {
                    let c = chars[j];
                    match quote {
                        Some(q) if c == q => quote = None,
                        Some(_) => {}
                        None if c == '\'' || c == '"' => quote = Some(c),
                        None if c == '[' => depth += 1,
                        None if c == ']' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        None => {}
                    }
                    j += 1;
                }
                if j >= chars.len() {
                    return Err(format!("unterminated array in {p:?}"));
                }
                let inner: String = chars[i + 1..j].iter().collect();
                steps.push(bracket(inner.trim())?);
                i = j + 1;
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                // A bare field name (`metadata.name` without the leading dot).
                let start = i;
                while i < chars.len() && !matches!(chars[i], '.' | '[') {
                    i += 1;
                }
                steps.push(Step::Field(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(steps)
}

fn bracket(inner: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::Wildcard);
    }
    if let Some(f) = inner.strip_prefix("?(").and_then(|s| s.strip_suffix(')')) {
        for op in ["==", "!=", "<=", ">=", "<", ">"] {
            if let Some((l, r)) = f.split_once(op) {
                let lit = r.trim();
                let v = if let Some(s) = lit.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
                    Value::String(s.to_string())
                } else if let Some(s) = lit.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                    Value::String(s.to_string())
                } else {
                    serde_json::from_str(lit).map_err(|_| format!("bad literal {lit:?} in filter"))?
                };
                return Ok(Step::Filter(parse_path(l.trim())?, op.to_string(), Some(v)));
            }
        }
        return Ok(Step::Filter(parse_path(f.trim())?, "exists".into(), None));
    }
    if let Some(s) = inner.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        return Ok(Step::Field(s.to_string()));
    }
    if let Some(s) = inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        return Ok(Step::Field(s.to_string()));
    }
    if let Some((a, b)) = inner.split_once(':') {
        let n = |s: &str| -> Result<Option<i64>, std::num::ParseIntError> {
            if s.trim().is_empty() {
                Ok(None)
            } else {
                s.trim().parse().map(Some)
            }
        };
        return Ok(Step::Slice(
            n(a).map_err(|e| e.to_string())?,
            n(b.split(':').next().unwrap_or("")).map_err(|e| e.to_string())?,
        ));
    }
    inner.parse().map(Step::Index).map_err(|_| format!("invalid array index {inner:?}"))
}

fn eval(steps: &[Step], root: &Value, cur: &Value) -> Vec<Value> {
    let mut vals = vec![cur.clone()];
    for s in steps {
        let mut next = Vec::new();
        for v in &vals {
            match s {
                Step::Root => next.push(root.clone()),
                Step::Field(f) => {
                    if let Some(x) = v.get(f) {
                        next.push(x.clone())
                    }
                }
                Step::Recursive(f) => collect_recursive(v, f, &mut next),
                Step::Wildcard => match v {
                    Value::Array(a) => next.extend(a.iter().cloned()),
                    Value::Object(m) => next.extend(m.values().cloned()),
                    _ => {}
                },
                Step::Index(i) => {
                    if let Some(a) = v.as_array() {
                        let idx = if *i < 0 { a.len() as i64 + i } else { *i };
                        if idx >= 0 {
                            if let Some(x) = a.get(idx as usize) {
                                next.push(x.clone())
                            }
                        }
                    }
                }
                Step::Slice(a, b) => {
                    if let Some(arr) = v.as_array() {
                        let len = arr.len() as i64;
                        let fix = |x: i64| if x < 0 { (len + x).max(0) } else { x.min(len) };
                        let start = fix(a.unwrap_or(0));
                        let end = fix(b.unwrap_or(len));
                        if start < end {
                            next.extend(arr[start as usize..end as usize].iter().cloned());
                        }
                    }
                }
                Step::Filter(path, op, lit) => {
                    let items: Vec<Value> = match v {
                        Value::Array(a) => a.clone(),
                        other => vec![other.clone()],
                    };
                    for it in items {
                        let got = eval(path, root, &it);
                        let keep = match (op.as_str(), lit) {
                            ("exists", _) => !got.is_empty(),
                            (op, Some(l)) => got.iter().any(|g| compare(g, op, l)),
                            _ => false,
                        };
                        if keep {
                            next.push(it);
                        }
                    }
                }
            }
        }
        vals = next;
    }
    vals
}

fn compare(a: &Value, op: &str, b: &Value) -> bool {
    match op {
        "==" => a == b,
        "!=" => a != b,
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => match op {
                "<" => x < y,
                ">" => x > y,
                "<=" => x <= y,
                ">=" => x >= y,
                _ => false,
            },
            _ => false,
        },
    }
}

fn collect_recursive(v: &Value, f: &str, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            if let Some(x) = m.get(f) {
                out.push(x.clone());
            }
            for c in m.values() {
                collect_recursive(c, f, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|c| collect_recursive(c, f, out)),
        _ => {}
    }
}

/// How kubectl prints one selected value.
pub fn value_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn exec(nodes: &[Node], root: &Value, cur: &Value, out: &mut String) -> Result<(), String> {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Expr(steps) => {
                let vals = eval(steps, root, cur);
                let strs: Vec<String> = vals.iter().map(value_string).collect();
                out.push_str(&strs.join(" "));
            }
            Node::Range(steps, body) => {
                for v in eval(steps, root, cur) {
                    exec(body, root, &v, out)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn data() -> Value {
        json!({"kind": "List", "items": [
            {"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "x"}}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}, "spec": {"replicas": 2}},
            {"metadata": {"name": "b"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}, "spec": {"replicas": 1}}]})
    }

    #[test]
    fn fields_and_wildcards() {
        assert_eq!(render("{.items[*].metadata.name}", &data()).unwrap(), "a b");
        assert_eq!(render("{.items[0].spec.replicas}", &data()).unwrap(), "2");
        assert_eq!(render("{.items[-1].metadata.name}", &data()).unwrap(), "b");
        assert_eq!(render("name={.items[1:].metadata.name}", &data()).unwrap(), "name=b");
        assert_eq!(render("{.items[0].metadata.labels['app.kubernetes.io/name']}", &data()).unwrap(), "x");
        assert_eq!(render("{..name}", &data()).unwrap(), "a b");
        assert_eq!(render("{$.kind}", &data()).unwrap(), "List");
    }

    #[test]
    fn range_literals_filters() {
        let t = r#"{range .items[*]}{.metadata.name}{"\t"}{.spec.replicas}{"\n"}{end}"#;
        assert_eq!(render(t, &data()).unwrap(), "a\t2\nb\t1\n");
        let f = r#"{.items[?(@.status.conditions[0].status=="True")].metadata.name}"#;
        assert_eq!(render(f, &data()).unwrap(), "a");
        let g = "{.items[?(@.spec.replicas>1)].metadata.name}";
        assert_eq!(render(g, &data()).unwrap(), "a");
        assert!(render("{.items", &data()).is_err());
        assert!(render("{end}", &data()).is_err());
    }

    #[test]
    fn select_relaxed() {
        assert_eq!(select(".metadata.name", &data()["items"][0]).unwrap(), vec![json!("a")]);
        assert_eq!(select("{.spec}", &data()["items"][1]).unwrap(), vec![json!({"replicas": 1})]);
    }
}
