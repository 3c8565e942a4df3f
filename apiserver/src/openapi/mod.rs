//! The OpenAPI documents: `/openapi/v2` (Swagger 2.0, as JSON and as gnostic protobuf) and
//! `/openapi/v3` with one document per group/version (`/openapi/v3/api/v1`,
//! `/openapi/v3/apis/apps/v1`).
//!
//! The built-in kinds' documents are generated from the k8s-openapi types by [`generate`] and
//! committed under `apiserver/openapi/`, as Kubernetes commits `api/openapi-spec`: a test
//! fails when they are stale, and `scripts/update-openapi` rewrites them. `build.rs` minifies
//! them, encodes the protobuf form and computes the ETags, so the apiserver serves them
//! straight from its binary — nothing is built at startup and no heap holds them.
//!
//! What the generator adds on top of the k8s-openapi schemas, because Kubernetes' published
//! documents carry it and clients read it:
//! - `x-kubernetes-group-version-kind` on every served kind (kubectl finds schemas by it);
//! - `x-kubernetes-patch-merge-key` / `x-kubernetes-patch-strategy` from the Go type tags
//!   (carried by k8s-pb, see [`crate::protobuf::descriptors`]); strategic merge patch reads them;
//! - operations per path with `x-kubernetes-action`, `x-kubernetes-group-version-kind`, and the
//!   `fieldValidation` / `fieldManager` / `dryRun` / `force` query parameters — kubectl checks
//!   for `fieldValidation` on PATCH to decide that the server validates (`--validate=strict`).
//!
//! Strategic merge patch, server-side apply and protobuf decoding read the schemas through
//! [`DEFINITIONS`], which parses one definition the first time it is needed. Custom
//! resources' documents are built from their CRDs when asked for ([`custom`]).

mod custom;
mod files;
#[cfg(test)]
mod generate;
mod paths;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::{LazyLock, OnceLock};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

pub use custom::{custom_gv_doc, v3_root};
use files::etag;
pub(crate) use paths::camel_case;

const V2_PREFIX: &str = "#/definitions/";
const V3_PREFIX: &str = "#/components/schemas/";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

/// A serialized document and its entity tag.
#[derive(Clone)]
pub struct Doc {
    pub bytes: Bytes,
    pub etag: Cow<'static, str>,
}

impl Doc {
    /// A document compiled into the binary (see `build.rs`).
    const fn embedded(bytes: &'static [u8], etag: &'static str) -> Doc {
        Doc { bytes: Bytes::from_static(bytes), etag: Cow::Borrowed(etag) }
    }

    fn new(v: &Value) -> Doc {
        let bytes = Bytes::from(serde_json::to_vec(v).unwrap_or_default());
        let etag = Cow::Owned(etag(&bytes));
        Doc { bytes, etag }
    }
}

/// The built-in documents, from `build.rs`: `V2`, `V2_PROTO`, `V3_ROOT` and `V3`
/// (`(group/version path, document)`).
mod generated {
    use super::Doc;
    include!(concat!(env!("OUT_DIR"), "/openapi_docs.rs"));
}

/// `/openapi/v2` as JSON.
pub fn v2() -> &'static Doc {
    &generated::V2
}

/// `/openapi/v2` as gnostic protobuf.
pub fn v2_proto() -> &'static Doc {
    &generated::V2_PROTO
}

/// The built-in document of a group/version (`api/v1`, `apis/apps/v1`).
pub fn v3(gv: &str) -> Option<&'static Doc> {
    generated::V3.iter().find(|(g, _)| *g == gv).map(|(_, d)| d)
}

/// The built-in definitions (Swagger 2.0 form: `$ref: #/definitions/<name>`), parsed one at a
/// time on first use and kept.
pub struct Definitions {
    defs: HashMap<&'static str, Lazy>,
    /// group, version, kind → definition name.
    by_gvk: HashMap<(&'static str, &'static str, &'static str), &'static str>,
}

struct Lazy {
    raw: &'static RawValue,
    parsed: OnceLock<Value>,
}

pub static DEFINITIONS: LazyLock<Definitions> = LazyLock::new(|| Definitions::index(&generated::V2.bytes));

impl Definitions {
    /// Index the `definitions` of a Swagger document without parsing them.
    fn index(doc: &'static [u8]) -> Definitions {
        #[derive(Deserialize)]
        struct Swagger<'a> {
            #[serde(borrow)]
            definitions: HashMap<&'a str, &'a RawValue>,
        }
        #[derive(Deserialize)]
        struct Kinds<'a> {
            #[serde(borrow, default, rename = "x-kubernetes-group-version-kind")]
            gvks: Vec<Gvk<'a>>,
        }
        #[derive(Deserialize)]
        struct Gvk<'a> {
            group: &'a str,
            version: &'a str,
            kind: &'a str,
        }
        let swagger: Swagger<'static> = match serde_json::from_slice(doc) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "the embedded OpenAPI document does not parse; schemas are unavailable");
                Swagger { definitions: HashMap::new() }
            }
        };
        let mut by_gvk = HashMap::new();
        for (name, raw) in &swagger.definitions {
            if let Ok(k) = serde_json::from_str::<Kinds<'static>>(raw.get()) {
                for g in k.gvks {
                    by_gvk.insert((g.group, g.version, g.kind), *name);
                }
            }
        }
        let defs = swagger.definitions.into_iter().map(|(n, raw)| (n, Lazy { raw, parsed: OnceLock::new() })).collect();
        Definitions { defs, by_gvk }
    }

    /// A definition by name (`io.k8s.api.core.v1.PodSpec`).
    pub fn get(&self, name: &str) -> Option<&Value> {
        let d = self.defs.get(name)?;
        Some(d.parsed.get_or_init(|| serde_json::from_str(d.raw.get()).unwrap_or(Value::Null)))
    }

    /// A definition's unparsed JSON.
    pub fn raw(&self, name: &str) -> Option<&'static str> {
        self.defs.get(name).map(|d| d.raw.get())
    }

    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.defs.keys().copied()
    }

    /// The definition name of a kind.
    pub fn name_of(&self, group: &str, version: &str, kind: &str) -> Option<&'static str> {
        self.by_gvk.get(&(group, version, kind)).copied()
    }

    /// The schema of a kind (for strategic merge patch and server-side apply).
    pub fn schema_of(&self, group: &str, version: &str, kind: &str) -> Option<&Value> {
        self.get(self.name_of(group, version, kind)?)
    }
}

impl apimachinery::strategicpatch::Definitions for Definitions {
    fn definition(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

fn rewrite_refs(v: &mut Value, from: &str, to: &str) {
    match v {
        Value::Object(m) => {
            // OpenAPI 3 (as Kubernetes publishes it): a `$ref` with siblings becomes `allOf: [{$ref}]`.
            if to == V3_PREFIX && m.len() > 1 {
                if let Some(r) = m.remove("$ref") {
                    m.insert("allOf".into(), json!([{"$ref": r}]));
                }
            }
            for (k, x) in m.iter_mut() {
                if k == "$ref" {
                    if let Value::String(s) = x {
                        if let Some(rest) = s.strip_prefix(from) {
                            *s = format!("{to}{rest}");
                        }
                    }
                } else {
                    rewrite_refs(x, from, to);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, from, to)),
        _ => {}
    }
}

/// The meta definitions every group/version document carries, and `extra` ones of meta/v1.
fn meta_roots(extra: &[&str]) -> Vec<String> {
    ["Status", "DeleteOptions", "Patch"].iter().chain(extra).map(|n| format!("{META}.{n}")).collect()
}

/// The definitions `roots` refer to, transitively, in OpenAPI 3 form (references into
/// `#/components/schemas/`), as a document's `components.schemas`.
fn v3_schemas(defs: &dyn apimachinery::strategicpatch::Definitions, roots: Vec<String>) -> Map<String, Value> {
    let mut schemas = Map::new();
    for n in reachable(defs, roots) {
        if let Some(d) = defs.definition(&n) {
            let mut d = d.clone();
            rewrite_refs(&mut d, V2_PREFIX, V3_PREFIX);
            schemas.insert(n, d);
        }
    }
    schemas
}

/// The names of the definitions `roots` refer to, transitively.
fn reachable(
    defs: &dyn apimachinery::strategicpatch::Definitions,
    roots: impl IntoIterator<Item = String>,
) -> BTreeSet<String> {
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("$ref", Value::String(s)) => out.push(s.rsplit('/').next().unwrap_or_default().to_string()),
                        _ => refs(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }
    let mut seen = BTreeSet::new();
    let mut todo: Vec<String> = roots.into_iter().collect();
    while let Some(n) = todo.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        if let Some(d) = defs.definition(&n) {
            refs(d, &mut todo);
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_gvk_and_patch_metadata() {
        let d = &*DEFINITIONS;
        let pod = d.schema_of("", "v1", "Pod").unwrap();
        assert_eq!(pod["x-kubernetes-group-version-kind"], json!([{"group": "", "kind": "Pod", "version": "v1"}]));
        assert!(pod.get("required").is_none());
        let spec = &d.get("io.k8s.api.core.v1.PodSpec").unwrap()["properties"];
        assert_eq!(spec["containers"]["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(spec["volumes"]["x-kubernetes-patch-strategy"], "merge,retainKeys");
        let c = &d.get("io.k8s.api.core.v1.Container").unwrap()["properties"];
        assert_eq!(c["ports"]["x-kubernetes-patch-merge-key"], "containerPort");
        assert_eq!(d.name_of("apps", "v1", "Deployment"), Some("io.k8s.api.apps.v1.Deployment"));
        assert_eq!(d.name_of("apps", "v1", "Nope"), None);
    }

    #[test]
    fn enum_typed_fields_carry_their_values() {
        let core: Value = serde_json::from_slice(&v3("api/v1").unwrap().bytes).unwrap();
        let spec = &core["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"];
        assert_eq!(spec["restartPolicy"]["enum"], json!(["Always", "Never", "OnFailure"]));
        assert!(spec["restartPolicy"]["description"]
            .as_str()
            .unwrap()
            .ends_with("\n\nPossible enum values:\n - `\"Always\"`\n - `\"Never\"`\n - `\"OnFailure\"`"));
        assert_eq!(spec["dnsPolicy"]["enum"], json!(["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"]));
        let service = &core["components"]["schemas"]["io.k8s.api.core.v1.ServiceSpec"]["properties"];
        assert_eq!(service["type"]["enum"], json!(["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]));
        let v2: Value = serde_json::from_slice(&v2().bytes).unwrap();
        let container = &v2["definitions"]["io.k8s.api.core.v1.Container"]["properties"];
        assert_eq!(container["imagePullPolicy"]["enum"], json!(["Always", "IfNotPresent", "Never"]));
    }

    #[test]
    fn v3_documents_advertise_field_validation_on_patch() {
        let root: Value = serde_json::from_slice(&generated::V3_ROOT.bytes).unwrap();
        let apps = v3("apis/apps/v1").unwrap();
        assert_eq!(
            root["paths"]["apis/apps/v1"]["serverRelativeURL"],
            format!("/openapi/v3/apis/apps/v1?hash={}", apps.etag)
        );
        let apps: Value = serde_json::from_slice(&apps.bytes).unwrap();
        let patch = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Deployment");
        assert!(patch["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation"));
        assert!(patch["requestBody"]["content"]["application/strategic-merge-patch+json"].is_object());
        let schemas = apps["components"]["schemas"].as_object().unwrap();
        assert!(schemas.contains_key("io.k8s.api.core.v1.PodSpec"));
        assert!(!schemas.contains_key("io.k8s.api.core.v1.Node"));
        let text = String::from_utf8_lossy(&v3("apis/apps/v1").unwrap().bytes);
        assert!(!text.contains("#/definitions/"));
    }

    #[test]
    fn embedded_documents_are_minified_with_their_etags() {
        for doc in [v2(), v2_proto(), v3("api/v1").unwrap(), &generated::V3_ROOT] {
            assert_eq!(doc.etag, etag(&doc.bytes));
        }
        assert!(!v2().bytes.contains(&b'\n'));
        let v2: Value = serde_json::from_slice(&v2().bytes).unwrap();
        assert_eq!(v2["swagger"], "2.0");
        assert_eq!(&v2_proto().bytes[..], &apimachinery::openapiproto::encode(&v2)[..]);
    }
}
