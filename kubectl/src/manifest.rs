//! Reading `-f FILE|DIR|-` (with `-R`): multi-document YAML or JSON, `kind: List` flattened,
//! each object remembering its source for kubectl's messages (`error when creating "f": …`).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{KubectlError, Result};

/// One object from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The file name as the user gave it (`STDIN` for `-`).
    pub source: String,
    pub obj: Value,
}

impl Manifest {
    pub fn api_version(&self) -> &str {
        self.obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default()
    }
    pub fn kind(&self) -> &str {
        self.obj.get("kind").and_then(Value::as_str).unwrap_or_default()
    }
    pub fn name(&self) -> &str {
        self.obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
    }
    pub fn namespace(&self) -> Option<&str> {
        self.obj.pointer("/metadata/namespace").and_then(Value::as_str).filter(|s| !s.is_empty())
    }
}

/// Read every object named by `-f` arguments; the first error fails the whole read.
pub fn read_all(files: &[String], recursive: bool) -> Result<Vec<Manifest>> {
    let (items, err) = read_stream(files, recursive);
    match err {
        Some(e) => Err(e),
        None => Ok(items),
    }
}

/// Read objects in order until the first error, like kubectl's resource builder: the objects
/// before a bad document are still returned (and acted on), then the error.
pub fn read_stream(files: &[String], recursive: bool) -> (Vec<Manifest>, Option<KubectlError>) {
    let mut out = Vec::new();
    if files.is_empty() {
        return (out, Some(KubectlError::msg("must specify one of -f and -k")));
    }
    for f in files {
        if f == "-" {
            let mut s = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut s) {
                return (out, Some(KubectlError::msg(format!("reading stdin: {e}"))));
            }
            if let Err(e) = parse_docs_into(&s, "STDIN", &mut out) {
                return (out, Some(e));
            }
            continue;
        }
        let p = Path::new(f);
        if !p.exists() {
            return (out, Some(KubectlError::msg(format!("the path \"{f}\" does not exist"))));
        }
        let paths = if p.is_dir() {
            match dir_files(p, recursive) {
                Ok(x) => x,
                Err(e) => return (out, Some(e)),
            }
        } else {
            vec![p.to_path_buf()]
        };
        for path in paths {
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => return (out, Some(KubectlError::msg(format!("error reading {}: {e}", path.display())))),
            };
            if let Err(e) = parse_docs_into(&text, &path.display().to_string(), &mut out) {
                return (out, Some(e));
            }
        }
    }
    (out, None)
}

/// The manifest files of a directory, in lexical order (subdirectories with `-R`).
fn dir_files(dir: &Path, recursive: bool) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| KubectlError::msg(format!("error reading {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for e in entries {
        if e.is_dir() {
            if recursive {
                out.extend(dir_files(&e, true)?);
            }
        } else if e.extension().and_then(|x| x.to_str()).is_some_and(|x| matches!(x, "yaml" | "yml" | "json")) {
            out.push(e);
        }
    }
    Ok(out)
}

/// Parse a multi-document YAML (or JSON) text.
#[cfg(test)]
pub fn parse_docs(text: &str, source: &str) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    parse_docs_into(text, source, &mut out)?;
    Ok(out)
}

/// Split a YAML stream at `---` lines (kubectl decodes each document on its own, so error
/// lines count from the document's start). Pure.
pub fn split_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.split_inclusive('\n') {
        let l = line.trim_end_matches(['\n', '\r']);
        if l == "---" || l.starts_with("--- ") || l.starts_with("---\t") {
            docs.push(String::new());
            continue;
        }
        if let Some(d) = docs.last_mut() {
            d.push_str(line);
        }
    }
    docs
}

fn parse_docs_into(text: &str, source: &str, out: &mut Vec<Manifest>) -> Result<()> {
    for doc in split_documents(text) {
        let v: Value = match serde_yaml::from_str(&doc) {
            Ok(v) => v,
            // A document of only comments or blanks.
            Err(_) if doc.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) => continue,
            Err(e) => return Err(yaml_error(&e, source)),
        };
        if v.is_null() {
            continue;
        }
        if !v.is_object() {
            return Err(KubectlError::msg(format!(
                "error parsing {source}: error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
                if v.is_array() { "array" } else { "string" }
            )));
        }
        flatten(v, source, out)?;
    }
    Ok(())
}

fn flatten(v: Value, source: &str, out: &mut Vec<Manifest>) -> Result<()> {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind.ends_with("List") && v.get("items").is_some_and(Value::is_array) {
        for item in v.get("items").and_then(Value::as_array).cloned().unwrap_or_default() {
            flatten(item, source, out)?;
        }
        return Ok(());
    }
    if kind.is_empty() || v.get("apiVersion").and_then(Value::as_str).unwrap_or_default().is_empty() {
        let what = if kind.is_empty() { "Kind" } else { "apiVersion" };
        return Err(KubectlError::msg(format!(
            "unable to decode \"{source}\": Object '{what}' is missing in '{}'",
            serde_json::to_string(&v).unwrap_or_default()
        )));
    }
    out.push(Manifest { source: source.to_string(), obj: v });
    Ok(())
}

/// `error parsing f.yaml: error converting YAML to JSON: yaml: line 5: …` as kubectl says it.
fn yaml_error(e: &serde_yaml::Error, source: &str) -> KubectlError {
    let full = e.to_string();
    // serde_yaml appends " at line L column C"; kubectl names the line first.
    let msg = match full.find(" at line ") {
        Some(i) => full[..i].to_string(),
        None => full.clone(),
    };
    match e.location() {
        Some(loc) => {
            // libyaml (Go) reports parser errors at the line before the one serde_yaml names.
            let line =
                if msg.starts_with("did not find expected") { loc.line().saturating_sub(1).max(1) } else { loc.line() };
            KubectlError::msg(format!(
                "error parsing {source}: error converting YAML to JSON: yaml: line {line}: {msg}"
            ))
        }
        None => KubectlError::msg(format!("error parsing {source}: error converting YAML to JSON: yaml: {msg}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_doc_and_lists() {
        let t = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: b\n";
        let ms = parse_docs(t, "f.yaml").unwrap();
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[0].name(), "a");
        assert_eq!(ms[1].kind(), "ConfigMap");
        assert_eq!(ms[1].source, "f.yaml");
    }

    #[test]
    fn syntax_error_names_file_and_line() {
        let t = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  bad: [\n";
        let e = parse_docs(t, "bad.yaml").unwrap_err().to_string();
        assert_eq!(e, "error: error parsing bad.yaml: error converting YAML to JSON: yaml: line 5: did not find expected node content");
        let t = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n\tdata: 1\n";
        let e = parse_docs(t, "f.yaml").unwrap_err().to_string();
        assert_eq!(e, "error: error parsing f.yaml: error converting YAML to JSON: yaml: line 5: found a tab character that violates indentation");
    }

    #[test]
    fn missing_kind() {
        let e = parse_docs("apiVersion: v1\nmetadata: {name: a}\n", "f.yaml").unwrap_err().to_string();
        assert!(e.contains("Object 'Kind' is missing"), "{e}");
    }

    #[test]
    fn missing_path() {
        let e = read_all(&["/nonexistent/x.yaml".into()], false).unwrap_err();
        assert_eq!(e.to_string(), "error: the path \"/nonexistent/x.yaml\" does not exist");
    }

    #[test]
    fn directory_in_order() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("b.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n").unwrap();
        std::fs::write(d.path().join("a.yml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n").unwrap();
        std::fs::write(d.path().join("notes.txt"), "hello").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(
            d.path().join("sub/c.json"),
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}"#,
        )
        .unwrap();
        let p = d.path().display().to_string();
        let names: Vec<String> = read_all(&[p.clone()], false).unwrap().iter().map(|m| m.name().to_string()).collect();
        assert_eq!(names, vec!["a", "b"]);
        assert_eq!(read_all(&[p], true).unwrap().len(), 3);
    }
}
