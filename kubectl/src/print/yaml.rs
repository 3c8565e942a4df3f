//! YAML the way kubectl writes it (sigs.k8s.io/yaml over go-yaml v2): block style, sequences
//! at their key's indentation, strings that would read as another type double-quoted, strings
//! that cannot be plain single-quoted, multi-line strings as literal blocks, and long plain
//! strings folded past column 80. Pure.

use serde_json::Value;

const BEST_WIDTH: usize = 80;

/// Render a JSON value as a YAML document.
pub fn to_yaml(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => write_map(&mut out, v, 0),
        Value::Array(a) if !a.is_empty() => write_seq(&mut out, v, 0),
        other => {
            out.push_str(&scalar(other, 0, 0));
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, v: &Value, indent: usize) {
    let Some(m) = v.as_object() else { return };
    for (i, (k, val)) in m.iter().enumerate() {
        // The first key of a sequence item follows its "- " directly.
        if !(i == 0 && out.ends_with("- ")) {
            out.push_str(&" ".repeat(indent));
        }
        let key = scalar(&Value::String(k.clone()), indent, indent);
        out.push_str(&key);
        out.push(':');
        write_value(out, val, indent, indent + key.chars().count() + 2);
    }
}

/// After `key:` — a nested block on the next lines, or ` scalar`.
fn write_value(out: &mut String, val: &Value, indent: usize, column: usize) {
    match val {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            write_map(out, val, indent + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            write_seq(out, val, indent);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other, indent + 2, column));
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, v: &Value, indent: usize) {
    let Some(a) = v.as_array() else { return };
    for item in a {
        if !out.ends_with("- ") {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str("- ");
        match item {
            Value::Object(m) if !m.is_empty() => write_map(out, item, indent + 2),
            Value::Array(x) if !x.is_empty() => write_seq(out, item, indent + 2),
            other => {
                out.push_str(&scalar(other, indent + 2, indent + 2));
                out.push('\n');
            }
        }
    }
}

fn scalar(v: &Value, indent: usize, column: usize) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        Value::String(s) => string(s, indent, column),
    }
}

/// Whether a plain scalar would be read back as something other than this string.
fn resolves_to_other(s: &str) -> bool {
    let l = s.to_ascii_lowercase();
    if matches!(
        l.as_str(),
        "~" | "null" | "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | ".inf" | "-.inf" | "+.inf" | ".nan"
    ) {
        return true;
    }
    let t = s.strip_prefix(['-', '+']).unwrap_or(s);
    if !t.is_empty() && t.replace('_', "").chars().all(|c| c.is_ascii_digit()) {
        return true;
    }
    if t.starts_with("0x") || t.starts_with("0o") || t.starts_with("0b") {
        return t.len() > 2 && t[2..].chars().all(|c| c.is_ascii_hexdigit() || c == '_');
    }
    if t.parse::<f64>().is_ok() && t.chars().any(|c| c.is_ascii_digit()) && !t.contains(char::is_whitespace) {
        return true;
    }
    // Timestamps: YYYY-M-D…
    let b = s.as_bytes();
    if b.len() >= 8 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' {
        let rest = &s[5..];
        let mut parts = rest.splitn(2, '-');
        let m = parts.next().unwrap_or("");
        let d: String = parts.next().unwrap_or("").chars().take_while(|c| c.is_ascii_digit()).collect();
        if !m.is_empty() && m.len() <= 2 && m.chars().all(|c| c.is_ascii_digit()) && !d.is_empty() && d.len() <= 2 {
            return true;
        }
    }
    false
}

fn plain_allowed(s: &str) -> bool {
    if s.is_empty()
        || s.starts_with([' ', '\t'])
        || s.ends_with([' ', '\t'])
        || s.starts_with("---")
        || s.starts_with("...")
    {
        return false;
    }
    let first = s.chars().next().unwrap_or(' ');
    let second = s.chars().nth(1);
    if "#,[]{}&*!|>'\"%@`".contains(first) {
        return false;
    }
    if "-?:".contains(first) && second.is_none_or(|c| c == ' ') {
        return false;
    }
    if s.contains(": ") || s.contains(" #") || s.ends_with(':') {
        return false;
    }
    s.chars().all(|c| !c.is_control() && c != '\u{feff}')
}

fn string(s: &str, indent: usize, column: usize) -> String {
    if s.contains('\n') && s.chars().all(|c| c == '\n' || !c.is_control() || c == '\t') && !s.starts_with(' ') {
        let chomp = if s.ends_with("\n\n") {
            "+"
        } else if s.ends_with('\n') {
            ""
        } else {
            "-"
        };
        let mut out = format!("|{chomp}");
        let body = s.strip_suffix('\n').unwrap_or(s);
        for line in body.split('\n') {
            out.push('\n');
            if !line.is_empty() {
                out.push_str(&" ".repeat(indent));
                out.push_str(line);
            }
        }
        return out;
    }
    if s.is_empty() || resolves_to_other(s) {
        return double_quoted(s);
    }
    if !plain_allowed(s) {
        if s.chars().any(|c| c.is_control()) {
            return double_quoted(s);
        }
        return format!("'{}'", s.replace('\'', "''"));
    }
    fold(s, indent, column)
}

/// Break a plain scalar at single spaces once past column 80, as go-yaml does.
fn fold(s: &str, indent: usize, start_column: usize) -> String {
    let mut out = String::new();
    let mut col = start_column;
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let prev_space = i > 0 && chars[i - 1] == ' ';
            let next_space = chars.get(i + 1) == Some(&' ');
            if !prev_space && !next_space && col > BEST_WIDTH {
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                col = indent;
                continue;
            }
        }
        out.push(c);
        col += 1;
    }
    out
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn like_go_yaml() {
        let v = json!({
            "apiVersion": "v1",
            "metadata": {"creationTimestamp": "2026-11-21T05:52:04Z", "resourceVersion": "8", "annotations": {"a": "{\"x\":1}\n"}, "labels": {}},
            "spec": {"containers": [{"name": "web", "args": ["8080", "-f", "a: b", "yes", ""], "ports": [{"containerPort": 80}]}], "n": null, "t": true}
        });
        let want = "apiVersion: v1\nmetadata:\n  annotations:\n    a: |\n      {\"x\":1}\n  creationTimestamp: \"2026-11-21T05:52:04Z\"\n  labels: {}\n  resourceVersion: \"8\"\nspec:\n  containers:\n  - args:\n    - \"8080\"\n    - -f\n    - 'a: b'\n    - \"yes\"\n    - \"\"\n    name: web\n    ports:\n    - containerPort: 80\n  \"n\": null\n  t: true\n";
        assert_eq!(to_yaml(&crate::print::sorted(&v)), want);
    }

    #[test]
    fn folds_long_plain_strings() {
        let v = json!({"c": [["mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]]});
        let y = to_yaml(&v);
        assert_eq!(y, "c:\n- - mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www\n");
        let v = json!({"a": {"b": {"c": {"d": {"e": ["mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]}}}}});
        let y = to_yaml(&v);
        assert!(
            y.ends_with("- mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h\n          /www\n"),
            "{y}"
        );
    }
}
