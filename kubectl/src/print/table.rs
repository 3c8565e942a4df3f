//! kubectl's default printer over a server-side `meta.k8s.io/v1` Table: uppercase headers,
//! priority-0 columns (all columns with `-o wide`), `NAMESPACE` first with `-A`, `LABELS`
//! last with `--show-labels`, cells aligned as Go's tabwriter does (min width 6, padding 3).

use serde_json::{json, Value};

use super::labels_string;

/// How to print a table.
#[derive(Debug, Clone, Default)]
pub struct TableOpts {
    pub wide: bool,
    pub with_namespace: bool,
    pub show_labels: bool,
    pub no_headers: bool,
    /// `pod/` when several types are printed together.
    pub name_prefix: Option<String>,
}

/// The rows (header first unless `no_headers`) to print for a Table.
pub fn table_rows(table: &Value, o: &TableOpts) -> Vec<Vec<String>> {
    let cols: Vec<&Value> = table.get("columnDefinitions").and_then(Value::as_array).into_iter().flatten().collect();
    let shown: Vec<usize> = cols
        .iter()
        .enumerate()
        .filter(|(_, c)| o.wide || c.get("priority").and_then(Value::as_i64).unwrap_or(0) == 0)
        .map(|(i, _)| i)
        .collect();
    let mut out = Vec::new();
    if !o.no_headers {
        let mut h = Vec::new();
        if o.with_namespace {
            h.push("NAMESPACE".to_string());
        }
        for &i in &shown {
            h.push(cols[i].get("name").and_then(Value::as_str).unwrap_or_default().to_uppercase());
        }
        if o.show_labels {
            h.push("LABELS".into());
        }
        out.push(h);
    }
    for row in table.get("rows").and_then(Value::as_array).into_iter().flatten() {
        let cells: Vec<Value> = row.get("cells").and_then(Value::as_array).cloned().unwrap_or_default();
        let meta = row.pointer("/object/metadata");
        let mut r = Vec::new();
        if o.with_namespace {
            r.push(meta.and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or_default().to_string());
        }
        for &i in &shown {
            let mut s = cell_string(cells.get(i).unwrap_or(&Value::Null));
            if let Some(p) = &o.name_prefix {
                if cols[i].get("format").and_then(Value::as_str) == Some("name") {
                    s = format!("{p}{s}");
                }
            }
            r.push(s);
        }
        if o.show_labels {
            r.push(labels_string(meta.and_then(|m| m.get("labels"))));
        }
        out.push(r);
    }
    out
}

fn cell_string(v: &Value) -> String {
    match v {
        Value::Null => "<none>".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

/// A NAME/AGE table for servers that do not answer with a Table.
pub fn fallback_table(items: &[Value]) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            json!({
                "cells": [o.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
                          super::age(o.pointer("/metadata/creationTimestamp").and_then(Value::as_str))],
                "object": {"metadata": o.get("metadata").cloned().unwrap_or(json!({}))},
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "priority": 0},
        ],
        "rows": rows,
    })
}

/// Align rows like Go's `tabwriter.NewWriter(out, 6, 4, 3, ' ', 0)`: every column but the
/// last is padded to its widest cell plus 3 (at least 6); lines end with `\n`.
pub fn align(rows: &[Vec<String>]) -> String {
    let ncols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; ncols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i + 1 < r.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 < r.len() {
                let w = (widths[i] + 3).max(6);
                line.push_str(c);
                line.push_str(&" ".repeat(w - c.chars().count()));
            } else {
                line.push_str(c);
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods_table() -> Value {
        json!({"kind": "Table",
            "columnDefinitions": [
                {"name": "Name", "format": "name", "priority": 0},
                {"name": "Ready", "priority": 0},
                {"name": "Restarts", "priority": 0},
                {"name": "IP", "priority": 1}],
            "rows": [
                {"cells": ["shared-pod", "0/2", 0, "<none>"],
                 "object": {"metadata": {"name": "shared-pod", "namespace": "default", "labels": {"app": "x"}}}},
                {"cells": ["p", "1/1", 12, "10.0.0.1"], "object": {"metadata": {"name": "p", "namespace": "demo"}}}]})
    }

    #[test]
    fn default_columns_and_alignment() {
        let rows = table_rows(&pods_table(), &TableOpts::default());
        assert_eq!(align(&rows), "NAME         READY   RESTARTS\nshared-pod   0/2     0\np            1/1     12\n");
    }

    #[test]
    fn wide_namespace_labels_prefix() {
        let o = TableOpts {
            wide: true,
            with_namespace: true,
            show_labels: true,
            name_prefix: Some("pod/".into()),
            ..Default::default()
        };
        let rows = table_rows(&pods_table(), &o);
        assert_eq!(rows[0], vec!["NAMESPACE", "NAME", "READY", "RESTARTS", "IP", "LABELS"]);
        assert_eq!(rows[1], vec!["default", "pod/shared-pod", "0/2", "0", "<none>", "app=x"]);
        assert_eq!(rows[2][5], "<none>");
    }

    #[test]
    fn min_width_six() {
        assert_eq!(align(&[vec!["A".into(), "B".into()], vec!["x".into(), "y".into()]]), "A     B\nx     y\n");
    }

    #[test]
    fn fallback_has_name_and_age() {
        let t = fallback_table(&[json!({"metadata": {"name": "a"}})]);
        let rows = table_rows(&t, &TableOpts::default());
        assert_eq!(rows, vec![vec!["NAME".to_string(), "AGE".into()], vec!["a".into(), "<unknown>".into()]]);
    }
}
