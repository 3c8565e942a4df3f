//! `kubectl explain TYPE[.FIELD…]`: the kind's schema from the server's `/openapi/v3`
//! document of its group/version, printed in kubectl's plaintext layout (KIND / VERSION,
//! FIELD, DESCRIPTION wrapped at 76 columns and indented by 4, FIELDS with their types).

use serde_json::Value;

use crate::client::Ctx;
use crate::error::{KubectlError, Result};

/// Get the documentation of a resource and its fields.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE or TYPE.FIELD.PATH
    pub path: String,
    /// Use the given api-version (group/version) of the resource.
    #[arg(long)]
    pub api_version: Option<String>,
    /// Print the fields of fields (without descriptions).
    #[arg(long)]
    pub recursive: bool,
    /// Output format: only `plaintext`.
    #[arg(long, default_value = "plaintext")]
    pub output: String,
}

/// The schema a `$ref` points at.
fn deref<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
    let target = s
        .get("$ref")
        .or_else(|| s.get("allOf").and_then(Value::as_array).filter(|a| a.len() == 1).and_then(|a| a[0].get("$ref")));
    match target.and_then(Value::as_str).and_then(|r| r.rsplit('/').next()) {
        Some(name) => {
            doc.pointer(&format!("/components/schemas/{}", name.replace('~', "~0").replace('/', "~1"))).unwrap_or(s)
        }
        None => s,
    }
}

fn ref_name(s: &Value) -> Option<&str> {
    let r = s
        .get("$ref")
        .or_else(|| s.get("allOf").and_then(Value::as_array).filter(|a| a.len() == 1).and_then(|a| a[0].get("$ref")))?;
    r.as_str()?.rsplit('/').next()?.rsplit('.').next()
}

/// kubectl's type guess: `[]Container`, `map[string]string`, `ObjectMeta`, `integer`,
/// `Object`; a reference to a primitive (IntOrString, Quantity) is that primitive's type.
pub fn type_of(doc: &Value, s: &Value) -> String {
    if let Some(items) = s.get("items") {
        return format!("[]{}", type_of(doc, items));
    }
    if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
        return format!("map[string]{}", type_of(doc, ap));
    }
    if let Some(n) = ref_name(s) {
        let target = deref(doc, s);
        match target.get("type").and_then(Value::as_str) {
            Some(t) if t != "object" && target.get("properties").is_none() => return t.to_string(),
            _ => return n.to_string(),
        }
    }
    if s.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "IntOrString".into();
    }
    match s.get("type").and_then(Value::as_str) {
        Some("object") | None => "Object".into(),
        Some(t) => t.into(),
    }
}

/// Word wrap at `width` columns as go-wordwrap does (kubectl's `wrap`): the text's own
/// line breaks and runs of spaces are kept; a line breaks before a word that would pass the
/// width; a word longer than the width stands on its own line.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for para in text.split('\n') {
        let mut line = String::new();
        let mut len = 0;
        let mut rest = para;
        while !rest.is_empty() {
            let spaces = rest.len() - rest.trim_start_matches(' ').len();
            let after = &rest[spaces..];
            let word_end = after.find(' ').unwrap_or(after.len());
            let word = &after[..word_end];
            rest = &after[word_end..];
            if word.is_empty() {
                // trailing spaces
                line.push_str(&" ".repeat(spaces));
                len += spaces;
                continue;
            }
            let wl = word.chars().count();
            if len > 0 && len + spaces + wl > width {
                out.push(std::mem::take(&mut line));
                len = 0;
            } else {
                line.push_str(&" ".repeat(spaces));
                len += spaces;
            }
            line.push_str(word);
            len += wl;
        }
        out.push(line);
    }
    out
}

fn indented(text: &str) -> String {
    wrap(text, 76).iter().map(|l| format!("    {l}\n")).collect()
}

/// The element schema a field path continues through (array items, map values).
fn element<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
    let s = deref(doc, s);
    if let Some(items) = s.get("items") {
        return element(doc, items);
    }
    if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
        return element(doc, ap);
    }
    s
}

/// A field's `enum` values as kubectl shows them (`""` for the empty string).
fn enum_of(s: &Value) -> Option<Vec<String>> {
    let values = s.get("enum").and_then(Value::as_array).filter(|a| !a.is_empty())?;
    Some(
        values
            .iter()
            .map(|v| match v {
                Value::String(s) if s.is_empty() => "\"\"".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
    )
}

/// The `enum: a, b, c, d, ....` line under a field of a list (at most four values), after a
/// newline and `indent` spaces; empty without an enum.
fn enum_line(s: &Value, indent: usize) -> String {
    let Some(values) = enum_of(s) else { return String::new() };
    let mut line =
        format!("\n{}enum: {}", " ".repeat(indent), values.iter().take(4).cloned().collect::<Vec<_>>().join(", "));
    if values.len() > 4 {
        line.push_str(", ....");
    }
    line
}

fn required_of(schema: &Value) -> Vec<&str> {
    schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect()
}

/// `--recursive`: every field below `schema`, two more spaces per level, without
/// descriptions; a type already on the path is not entered again.
fn field_tree<'a>(doc: &'a Value, schema: &'a Value, depth: usize, path: &mut Vec<&'a str>, out: &mut String) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else { return };
    let required = required_of(schema);
    let mut names: Vec<&String> = props.keys().collect();
    names.sort();
    for n in names {
        let s = &props[n];
        let req = if required.contains(&n.as_str()) { " -required-" } else { "" };
        out.push_str(&format!("{}{n}\t<{}>{req}{}\n", "  ".repeat(depth), type_of(doc, s), enum_line(s, 2 * depth)));
        let inner = element(doc, s);
        let name = element_ref(s).unwrap_or_default();
        if inner.get("properties").is_some() && !path.contains(&name) {
            path.push(name);
            field_tree(doc, inner, depth + 1, path, out);
            path.pop();
        }
    }
}

/// The referenced type of a field, through arrays and maps.
fn element_ref(s: &Value) -> Option<&str> {
    if let Some(items) = s.get("items") {
        return element_ref(items);
    }
    if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
        return element_ref(ap);
    }
    let r = s
        .get("$ref")
        .or_else(|| s.get("allOf").and_then(Value::as_array).filter(|a| a.len() == 1).and_then(|a| a[0].get("$ref")))?;
    r.as_str()
}

/// The explanation of `fields` (a path below the kind) in `doc`, whose kind schema is `root`.
pub fn render(
    doc: &Value,
    root: &Value,
    group: &str,
    kind: &str,
    version: &str,
    fields: &[&str],
    recursive: bool,
) -> Result<String> {
    let mut out = String::new();
    if !group.is_empty() {
        out.push_str(&format!("GROUP:      {group}\n"));
    }
    out.push_str(&format!("KIND:       {kind}\nVERSION:    {version}\n\n"));
    let mut current = root;
    let mut field: Option<(&str, &Value)> = None;
    let mut path = String::new();
    for f in fields {
        let parent = element(doc, current);
        let next = parent
            .get("properties")
            .and_then(|p| p.get(*f))
            .ok_or_else(|| KubectlError::msg(format!("field \"{f}\" does not exist")))?;
        path.push('.');
        path.push_str(f);
        field = Some((f, next));
        current = next;
    }
    let mut description = String::new();
    if let Some((name, schema)) = field {
        let values: String = enum_of(schema)
            .map(|v| format!("ENUM:{}", v.iter().map(|v| format!("\n    {v}")).collect::<String>()))
            .unwrap_or_default();
        out.push_str(&format!("FIELD: {name} <{}>\n{values}\n\n", type_of(doc, schema)));
        description = schema.get("description").and_then(Value::as_str).unwrap_or_default().to_string();
    }
    let target = element(doc, current);
    let type_desc = target.get("description").and_then(Value::as_str).unwrap_or_default();
    if field.is_none() {
        description = type_desc.to_string();
    } else if !std::ptr::eq(target, current) && !type_desc.is_empty() {
        description =
            if description.is_empty() { type_desc.to_string() } else { format!("{description}\n{type_desc}") };
    }
    out.push_str("DESCRIPTION:\n");
    out.push_str(&indented(&description));
    out.push_str("    \n");
    if let Some(props) = target.get("properties").and_then(Value::as_object).filter(|p| !p.is_empty()) {
        out.push_str("FIELDS:\n");
        if recursive {
            let mut path = Vec::new();
            field_tree(doc, target, 1, &mut path, &mut out);
        } else {
            let required = required_of(target);
            let mut names: Vec<&String> = props.keys().collect();
            names.sort();
            for n in names {
                let s = &props[n];
                let req = if required.contains(&n.as_str()) { " -required-" } else { "" };
                out.push_str(&format!("  {n}\t<{}>{req}{}\n", type_of(doc, s), enum_line(s, 2)));
                if let Some(d) = s.get("description").and_then(Value::as_str).filter(|d| !d.is_empty()) {
                    out.push_str(&indented(d));
                }
                out.push('\n');
            }
        }
    }
    out.push('\n');
    Ok(out)
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    if a.output != "plaintext" {
        return Err(KubectlError::msg(format!("unsupported output format {:?}: only plaintext", a.output)));
    }
    let mut parts = a.path.split('.');
    let type_arg = parts.next().unwrap_or_default();
    let fields: Vec<&str> = parts.filter(|p| !p.is_empty()).collect();
    let res = ctx.resolve(type_arg).await?;
    let (group, version) = match a.api_version.as_deref() {
        Some(gv) => match gv.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), gv.to_string()),
        },
        None => (res.group.clone(), res.version.clone()),
    };
    let key = if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") };
    let index = ctx.get("/openapi/v3").await?;
    let url = index
        .pointer(&format!("/paths/{}/serverRelativeURL", key.replace('~', "~0").replace('/', "~1")))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            KubectlError::msg(format!("couldn't find resource for \"{group}/{version}, Kind={}\"", res.kind))
        })?
        .to_string();
    let doc = ctx.get(&url).await?;
    let root = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(_, s)| s)
        .find(|s| {
            s.get("x-kubernetes-group-version-kind").and_then(Value::as_array).into_iter().flatten().any(|g| {
                g["group"].as_str().unwrap_or_default() == group
                    && g["version"] == version.as_str()
                    && g["kind"] == res.kind.as_str()
            })
        })
        .ok_or_else(|| {
            KubectlError::msg(format!("couldn't find resource for \"{group}/{version}, Kind={}\"", res.kind))
        })?;
    print!("{}", render(&doc, root, &group, &res.kind, &version, &fields, a.recursive)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({"components": {"schemas": {
            "io.k8s.api.core.v1.Pod": {"description": "Pod is a pod.", "properties": {
                "spec": {"allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}], "description": "Spec of the pod."},
                "kind": {"type": "string", "description": "Kind."}}},
            "io.k8s.api.core.v1.PodSpec": {"description": "PodSpec.", "properties": {
                "containers": {"type": "array", "description": "List of containers.", "items": {"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}}}},
            "io.k8s.api.core.v1.Container": {"description": "A container.", "required": ["name"], "properties": {
                "name": {"type": "string", "description": "Name of the container."},
                "env": {"type": "array", "items": {"$ref": "#/components/schemas/io.k8s.api.core.v1.EnvVar"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "io.k8s.api.core.v1.EnvVar": {"properties": {}}
        }}})
    }

    #[test]
    fn field_layout() {
        let d = doc();
        let root = &d["components"]["schemas"]["io.k8s.api.core.v1.Pod"];
        let out = render(&d, root, "", "Pod", "v1", &["spec", "containers"], false).unwrap();
        assert_eq!(
            out,
            "KIND:       Pod\nVERSION:    v1\n\nFIELD: containers <[]Container>\n\n\nDESCRIPTION:\n    List of containers.\n    A container.\n    \nFIELDS:\n  env\t<[]EnvVar>\n\n  labels\t<map[string]string>\n\n  name\t<string> -required-\n    Name of the container.\n\n\n"
        );
        let top = render(&d, root, "", "Pod", "v1", &[], false).unwrap();
        assert!(
            top.starts_with(
                "KIND:       Pod\nVERSION:    v1\n\nDESCRIPTION:\n    Pod is a pod.\n    \nFIELDS:\n  kind\t<string>\n"
            ),
            "{top}"
        );
        let prim = render(&d, root, "", "Pod", "v1", &["kind"], false).unwrap();
        assert_eq!(
            prim,
            "KIND:       Pod\nVERSION:    v1\n\nFIELD: kind <string>\n\n\nDESCRIPTION:\n    Kind.\n    \n\n"
        );
        assert!(render(&d, root, "", "Pod", "v1", &["nope"], false).is_err());
        let rec = render(&d, root, "", "Pod", "v1", &["spec"], true).unwrap();
        assert!(
            rec.ends_with("FIELDS:\n  containers\t<[]Container>\n    env\t<[]EnvVar>\n    labels\t<map[string]string>\n    name\t<string> -required-\n\n"),
            "{rec}"
        );
    }

    #[test]
    fn enums_show_as_kubectl_shows_them() {
        let d = json!({"components": {"schemas": {"io.k8s.api.core.v1.Pod": {"properties": {
            "policy": {"type": "string", "description": "How.", "enum": ["", "Always", "Never"]},
            "many": {"type": "string", "enum": ["a", "b", "c", "d", "e"]}}}}}});
        let root = &d["components"]["schemas"]["io.k8s.api.core.v1.Pod"];
        let field = render(&d, root, "", "Pod", "v1", &["policy"], false).unwrap();
        assert_eq!(
            field,
            "KIND:       Pod\nVERSION:    v1\n\nFIELD: policy <string>\nENUM:\n    \"\"\n    Always\n    Never\n\nDESCRIPTION:\n    How.\n    \n\n"
        );
        let list = render(&d, root, "", "Pod", "v1", &[], false).unwrap();
        assert!(list.contains("  many\t<string>\n  enum: a, b, c, d, ....\n"), "{list}");
        let rec = render(&d, root, "", "Pod", "v1", &[], true).unwrap();
        assert!(rec.contains("  policy\t<string>\n  enum: \"\", Always, Never\n"), "{rec}");
    }

    #[test]
    fn wraps_like_kubectl() {
        let w = wrap("aaaa bbbb cccc\ndd https://example.com/a/very/long/url", 10);
        assert_eq!(w, ["aaaa bbbb", "cccc", "dd", "https://example.com/a/very/long/url"]);
        // Two spaces after a full stop stay, and count.
        assert_eq!(wrap("aa.  bb cc", 7), ["aa.  bb", "cc"]);
        assert_eq!(wrap("aa.  bb cc", 6), ["aa.", "bb cc"]);
    }
}
