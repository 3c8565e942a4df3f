//! The layout rules ARCHITECTURE.md states, checked where a grep can: the apiserver's
//! generic store names no kind and its strategies never look up other resources; only the
//! kubelet's runtime.rs talks to Docker; and no crate of the workspace has an import cycle
//! between its modules (`scripts/check-cycles`).

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
#[test]
fn no_crate_has_an_import_cycle() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-cycles");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "import cycles:\n{text}{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn only_the_kubelet_s_runtime_talks_to_docker() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kubelet/src");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    for f in files.iter().filter(|f| !f.ends_with("runtime.rs")) {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let hits: Vec<&str> = text.lines().filter(|l| l.contains("bollard")).collect();
        assert!(hits.is_empty(), "{} uses the Docker client: {hits:#?}", f.display());
    }
}
