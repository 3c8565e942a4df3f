//! Compiles the committed OpenAPI documents (`openapi/`, written by `scripts/update-openapi`)
//! into the apiserver: each minified with its ETag, `/openapi/v2` also as gnostic protobuf,
//! and the `/openapi/v3` index. `src/openapi/mod.rs` includes the generated table.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

#[allow(dead_code)]
#[path = "../apimachinery/src/openapiproto.rs"]
mod openapi_proto;

#[path = "src/openapi/files.rs"]
mod files;

use files::{etag, json_files};

fn main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=openapi");
    println!("cargo:rerun-if-changed=../apimachinery/src/openapiproto.rs");

    // One embedded document: its file in OUT_DIR and the Rust expression building it.
    let mut n = 0;
    let mut embed = |bytes: &[u8]| -> (String, String) {
        n += 1;
        let path = out.join(format!("openapi-{n}"));
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tag = etag(bytes);
        (format!("Doc::embedded(include_bytes!({:?}), {tag:?})", path.display().to_string()), tag)
    };
    let read = |path: &Path| -> Value {
        let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };

    let v2 = read(&src.join("v2.json"));
    let (v2_doc, _) = embed(&serde_json::to_vec(&v2).expect("serialize"));
    let (v2_proto, _) = embed(&openapi_proto::encode(&v2));

    let v3_dir = src.join("v3");
    let files = json_files(&v3_dir).unwrap_or_else(|e| panic!("{}: {e}", v3_dir.display()));
    let count = files.len();
    let mut v3 = String::new();
    let mut index = serde_json::Map::new();
    for f in files {
        let gv = f.strip_prefix(&v3_dir).expect("under v3").with_extension("");
        let gv = gv.to_string_lossy().replace('\\', "/");
        let (doc, tag) = embed(&serde_json::to_vec(&read(&f)).expect("serialize"));
        index.insert(gv.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={tag}")}));
        v3.push_str(&format!("    ({gv:?}, {doc}),\n"));
    }
    let (root, _) = embed(&serde_json::to_vec(&json!({"paths": index})).expect("serialize"));

    let table = format!(
        "pub static V2: Doc = {v2_doc};\npub static V2_PROTO: Doc = {v2_proto};\npub static V3_ROOT: Doc = {root};\n\
         pub static V3: [(&str, Doc); {count}] = [\n{v3}];\n"
    );
    std::fs::write(out.join("openapi_docs.rs"), table).expect("write openapi_docs.rs");
}
