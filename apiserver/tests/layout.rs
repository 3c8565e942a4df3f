//! The layout rules ARCHITECTURE.md states for the apiserver, checked where a grep can:
//! the generic store names no kind, and strategies never look up other resources.

use std::path::{Path, PathBuf};

fn src(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    // Unit tests may use anything: only the code above them counts.
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_generic_store_names_no_kind() {
    let generic = src("registry/generic.rs");
    for needle in [
        "pod::",
        "service::",
        "kinds::",
        "allocate",
        "\"pods\"",
        "\"services\"",
        "\"namespaces\"",
        "\"nodes\"",
        "Pod",
        "Service",
        "Namespace\"",
    ] {
        let hits: Vec<&str> = generic.lines().filter(|l| l.contains(needle)).collect();
        assert!(hits.is_empty(), "registry/generic.rs names a kind ({needle:?}): {hits:#?}");
    }
}

#[test]
fn strategies_never_look_up_other_resources() {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/registry"), &mut files);
    assert!(files.len() > 5, "{files:?}");
    for f in files {
        let rel = f.strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).unwrap().display().to_string();
        let code = src(&rel);
        let hits: Vec<&str> = code.lines().filter(|l| l.contains("resources::find")).collect();
        assert!(hits.is_empty(), "{rel} looks up a resource itself (the request path hands it over): {hits:#?}");
    }
}
