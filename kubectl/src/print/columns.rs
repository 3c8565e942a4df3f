//! `-o custom-columns=HEADER:.path,…`: one column per spec, values from a relaxed JSONPath,
//! several values joined with `,`, a missing value printed as `<none>`. Pure.

use serde_json::Value;

use super::jsonpath;

/// Parse `NAME:.metadata.name,NS:.metadata.namespace` into (header, path) pairs.
pub fn parse_spec(spec: &str) -> Result<Vec<(String, String)>, String> {
    spec.split(',')
        .map(|c| match c.split_once(':') {
            Some((h, p)) if !h.is_empty() && !p.is_empty() => Ok((h.to_string(), p.to_string())),
            _ => Err(format!(
                "custom-columns format specified but no custom columns given\n  invalid custom-columns specification: {c:?}; expected <header>:<json-path-expr>"
            )),
        })
        .collect()
}

/// Header row plus one row per object.
pub fn rows(cols: &[(String, String)], objects: &[Value], no_headers: bool) -> Result<Vec<Vec<String>>, String> {
    let mut out = Vec::new();
    if !no_headers {
        out.push(cols.iter().map(|(h, _)| h.clone()).collect());
    }
    for o in objects {
        let mut r = Vec::new();
        for (_, p) in cols {
            let vals = jsonpath::select(p, o)?;
            let vals: Vec<String> = vals.iter().filter(|v| !v.is_null()).map(jsonpath::value_string).collect();
            r.push(if vals.is_empty() { "<none>".to_string() } else { vals.join(",") });
        }
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns() {
        let cols = parse_spec("N:.metadata.name,C:.spec.containers[*].name,X:.nope").unwrap();
        let o = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let r = rows(&cols, &[o], false).unwrap();
        assert_eq!(r, vec![vec!["N", "C", "X"], vec!["p", "a,b", "<none>"]]);
        assert!(parse_spec("bad").is_err());
    }
}
