//! The OpenAPI documents: `/openapi/v2` (Swagger 2.0) and `/openapi/v3` with one document per
//! group/version (`/openapi/v3/api/v1`, `/openapi/v3/apis/apps/v1`).
//!
//! Schemas come from the k8s-openapi types (their `schemars` impls); on top of them we add what
//! Kubernetes' published documents carry and clients read:
//! - `x-kubernetes-group-version-kind` on every served kind (kubectl finds schemas by it);
//! - `x-kubernetes-patch-merge-key` / `x-kubernetes-patch-strategy` from the Go type tags
//!   (carried by k8s-pb, see [`crate::protobuf::descriptors`]); strategic merge patch reads them;
//! - operations per path with `x-kubernetes-action`, `x-kubernetes-group-version-kind`, and the
//!   `fieldValidation` / `fieldManager` / `dryRun` / `force` query parameters — kubectl checks
//!   for `fieldValidation` on PATCH to decide that the server validates (`--validate=strict`).
//!
//! Everything is built once, serialized once, and served from memory with an ETag.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::LazyLock;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::protobuf::descriptors::{normalized, DESCRIPTORS};
use crate::resources::{ResourceDef, Sub, RESOURCES};

const V2_PREFIX: &str = "#/definitions/";
const V3_PREFIX: &str = "#/components/schemas/";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

/// A serialized document and its entity tag.
pub struct Doc {
    pub bytes: Bytes,
    pub etag: String,
}

impl Doc {
    fn new(v: &Value) -> Doc {
        Doc::from_bytes(serde_json::to_vec(v).unwrap_or_default())
    }

    fn from_bytes(bytes: Vec<u8>) -> Doc {
        let bytes = Bytes::from(bytes);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        let mut h2 = std::collections::hash_map::DefaultHasher::new();
        (bytes.len(), &bytes[bytes.len() / 2..]).hash(&mut h2);
        Doc { bytes, etag: format!("{:016X}{:016X}", h.finish(), h2.finish()) }
    }
}

/// The built documents.
pub struct OpenApi {
    /// Definitions in Swagger 2.0 form (`$ref: #/definitions/<name>`).
    pub definitions: Map<String, Value>,
    /// group, version, kind → definition name.
    pub by_gvk: HashMap<(String, String, String), String>,
    pub v2: Doc,
    /// `/openapi/v2` as gnostic protobuf.
    pub v2_proto: Doc,
    pub v3_root: Doc,
    /// `api/v1`, `apis/apps/v1` → document.
    pub v3: HashMap<String, Doc>,
}

pub static OPENAPI: LazyLock<OpenApi> = LazyLock::new(build);

impl OpenApi {
    /// The schema of a kind (for strategic merge patch), with the definitions it refers to.
    pub fn schema_of(&self, group: &str, version: &str, kind: &str) -> Option<&Value> {
        let name = self.by_gvk.get(&(group.to_string(), version.to_string(), kind.to_string()))?;
        self.definitions.get(name)
    }
}

/// The schemas of every served kind and of the meta types, with the Kubernetes extensions.
fn definitions() -> (Map<String, Value>, HashMap<(String, String, String), String>) {
    // Swagger 2.0 form, as Kubernetes publishes it: `$ref` with a sibling `description`
    // (kubectl's v2 models do not follow `allOf`). The v3 documents use `allOf: [{$ref}]`.
    let mut gen = schemars::generate::SchemaSettings::draft07()
        .with(|s| s.transforms.retain(|t| !t.is::<schemars::transform::RemoveRefSiblings>()))
        .into_generator();
    let mut roots: Vec<(&ResourceDef, String)> = Vec::new();
    for r in RESOURCES {
        let s = (r.schema)(&mut gen);
        if let Some(name) = s.get("$ref").and_then(Value::as_str).and_then(|s| s.rsplit('/').next()) {
            roots.push((r, name.to_string()));
        }
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
    gen.subschema_for::<meta::DeleteOptions>();
    gen.subschema_for::<meta::Status>();
    gen.subschema_for::<meta::WatchEvent<k8s_openapi::apimachinery::pkg::runtime::RawExtension>>();
    gen.subschema_for::<meta::APIResourceList>();
    gen.subschema_for::<k8s_openapi::api::autoscaling::v1::Scale>();
    gen.subschema_for::<k8s_openapi::api::policy::v1::Eviction>();
    gen.subschema_for::<k8s_openapi::api::core::v1::Binding>();
    let mut defs: Map<String, Value> = gen.take_definitions(true).into_iter().collect();
    for (_, v) in defs.iter_mut() {
        rewrite_refs(v, "#/definitions/", V2_PREFIX);
    }
    defs.insert(
        format!("{META}.Patch"),
        json!({"description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.", "type": "object"}),
    );
    // Kinds are found by their group/version/kind.
    let mut by_gvk = HashMap::new();
    let mut add_gvk = |defs: &mut Map<String, Value>, name: &str, g: &str, v: &str, k: &str| {
        if let Some(Value::Object(d)) = defs.get_mut(name) {
            let list = d.entry("x-kubernetes-group-version-kind").or_insert_with(|| json!([]));
            if let Some(a) = list.as_array_mut() {
                let gvk = json!({"group": g, "kind": k, "version": v});
                if !a.contains(&gvk) {
                    a.push(gvk);
                }
            }
            // metadata is optional on the wire (k8s-openapi marks it required for Rust's sake).
            if let Some(req) = d.get_mut("required").and_then(Value::as_array_mut) {
                req.retain(|x| x != "metadata");
            }
            if d.get("required").and_then(Value::as_array).is_some_and(|a| a.is_empty()) {
                d.remove("required");
            }
            by_gvk.insert((g.to_string(), v.to_string(), k.to_string()), name.to_string());
        }
    };
    for (r, name) in &roots {
        add_gvk(&mut defs, name, r.group, r.version, r.kind);
    }
    add_gvk(&mut defs, "io.k8s.api.autoscaling.v1.Scale", "autoscaling", "v1", "Scale");
    add_gvk(&mut defs, "io.k8s.api.policy.v1.Eviction", "policy", "v1", "Eviction");
    add_gvk(&mut defs, "io.k8s.api.core.v1.Binding", "", "v1", "Binding");
    add_gvk(&mut defs, &format!("{META}.Status"), "", "v1", "Status");
    let mut groups: BTreeSet<(&str, &str)> = RESOURCES.iter().map(|r| (r.group, r.version)).collect();
    groups.insert(("meta.k8s.io", "v1"));
    for (g, v) in &groups {
        add_gvk(&mut defs, &format!("{META}.DeleteOptions"), g, v, "DeleteOptions");
        add_gvk(&mut defs, &format!("{META}.WatchEvent"), g, v, "WatchEvent");
    }
    // Patch metadata from the Go type tags.
    for (name, def) in defs.iter_mut() {
        let Some((_, msg)) = DESCRIPTORS.message_for_definition(name) else { continue };
        let Some(props) = def.get_mut("properties").and_then(Value::as_object_mut) else { continue };
        for (prop, schema) in props.iter_mut() {
            let n = normalized(prop);
            let Some(f) = msg.fields.iter().find(|f| normalized(&f.rust_name) == n) else { continue };
            let Some(obj) = schema.as_object_mut() else { continue };
            if let Some(k) = &f.merge_key {
                obj.insert("x-kubernetes-patch-merge-key".into(), json!(k));
            }
            if let Some(s) = &f.strategy {
                obj.insert("x-kubernetes-patch-strategy".into(), json!(s));
            }
        }
    }
    // Kubernetes' documents describe IntOrString and Quantity as strings with a format.
    for (name, format) in [
        ("io.k8s.apimachinery.pkg.util.intstr.IntOrString", "int-or-string"),
        ("io.k8s.apimachinery.pkg.api.resource.Quantity", ""),
    ] {
        if let Some(Value::Object(d)) = defs.get_mut(name) {
            d.insert("type".into(), json!("string"));
            if !format.is_empty() {
                d.insert("format".into(), json!(format));
            }
        }
    }
    (defs, by_gvk)
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

/// The names of the definitions `roots` refer to, transitively.
fn reachable(defs: &Map<String, Value>, roots: impl IntoIterator<Item = String>) -> BTreeSet<String> {
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
        if let Some(d) = defs.get(&n) {
            refs(d, &mut todo);
        }
    }
    seen
}

/// Whether the operation is described for Swagger 2.0 or OpenAPI 3.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    V2,
    V3,
}

fn reference(flavor: Flavor, name: &str) -> Value {
    let prefix = if flavor == Flavor::V2 { V2_PREFIX } else { V3_PREFIX };
    json!({"$ref": format!("{prefix}{name}")})
}

fn query_param(flavor: Flavor, name: &str, description: &str, ty: &str) -> Value {
    match flavor {
        Flavor::V2 => json!({"name": name, "in": "query", "description": description, "type": ty, "uniqueItems": true}),
        Flavor::V3 => {
            json!({"name": name, "in": "query", "description": description, "schema": {"type": ty, "uniqueItems": true}})
        }
    }
}

fn write_params(flavor: Flavor, patch: bool) -> Vec<Value> {
    let mut p = vec![
        query_param(flavor, "dryRun", "When present, indicates that modifications should not be persisted. Valid values are: - All: all dry run stages will be processed", "string"),
        query_param(flavor, "fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes.", "string"),
        query_param(flavor, "fieldValidation", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict", "string"),
    ];
    if patch {
        p.push(query_param(flavor, "force", "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people.", "boolean"));
    }
    p
}

const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];
const MEDIA: &[&str] = &["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"];

/// Custom resources do not take strategic merge patches; their operations are tagged while
/// the paths are built.
fn custom_patch(op: &Value) -> bool {
    CUSTOM_PATHS.with(|c| c.get()) && op.get("x-kubernetes-action").is_some()
}

thread_local! {
    static CUSTOM_PATHS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One operation object.
#[allow(clippy::too_many_arguments)]
fn operation(
    flavor: Flavor,
    action: &str,
    op_id: String,
    tag: &str,
    gvk: (&str, &str, &str),
    body: Option<(&str, bool)>,
    params: Vec<Value>,
    responses: &[(&str, &str)],
) -> Value {
    let mut op = json!({
        "description": format!("{action} {}", gvk.2),
        "operationId": op_id,
        "tags": [tag],
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": gvk.0, "kind": gvk.2, "version": gvk.1},
    });
    let mut params = params;
    let resp = |schema: &str| -> Value {
        match flavor {
            Flavor::V2 => json!({"description": "OK", "schema": reference(flavor, schema)}),
            Flavor::V3 => {
                let content: Map<String, Value> =
                    MEDIA.iter().map(|m| (m.to_string(), json!({"schema": reference(flavor, schema)}))).collect();
                json!({"description": "OK", "content": content})
            }
        }
    };
    let mut rs = Map::new();
    for (code, schema) in responses {
        rs.insert(code.to_string(), resp(schema));
    }
    rs.insert("401".into(), json!({"description": "Unauthorized"}));
    op["responses"] = Value::Object(rs);
    if let Some((schema, is_patch)) = body {
        let types: Vec<&str> = if is_patch && custom_patch(&op) {
            PATCH_TYPES.iter().copied().filter(|t| *t != "application/strategic-merge-patch+json").collect()
        } else if is_patch {
            PATCH_TYPES.to_vec()
        } else {
            MEDIA.to_vec()
        };
        match flavor {
            Flavor::V2 => {
                params.insert(
                    0,
                    json!({"name": "body", "in": "body", "required": true, "schema": reference(flavor, schema)}),
                );
                op["consumes"] = json!(types);
            }
            Flavor::V3 => {
                let content: Map<String, Value> =
                    types.iter().map(|m| (m.to_string(), json!({"schema": reference(flavor, schema)}))).collect();
                op["requestBody"] = json!({"content": content, "required": true});
            }
        }
    }
    if flavor == Flavor::V2 {
        op["produces"] = json!(MEDIA);
        op["schemes"] = json!(["https"]);
    }
    op["parameters"] = Value::Array(params);
    op
}

fn path_param(flavor: Flavor, name: &str, description: &str) -> Value {
    match flavor {
        Flavor::V2 => {
            json!({"name": name, "in": "path", "required": true, "description": description, "type": "string", "uniqueItems": true})
        }
        Flavor::V3 => {
            json!({"name": name, "in": "path", "required": true, "description": description, "schema": {"type": "string", "uniqueItems": true}})
        }
    }
}

fn camel(s: &str) -> String {
    let mut out = String::new();
    let mut up = true;
    for c in s.chars() {
        if c == '.' || c == '-' || c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The paths of one resource.
fn resource_paths(flavor: Flavor, r: &ResourceDef, def: &str, paths: &mut BTreeMap<String, Value>) {
    let root =
        if r.group.is_empty() { format!("/api/{}", r.version) } else { format!("/apis/{}/{}", r.group, r.version) };
    let tag = if r.group.is_empty() {
        format!("core_{}", r.version)
    } else {
        format!("{}_{}", r.group.split('.').next().unwrap_or(r.group), r.version)
    };
    let gv = format!(
        "{}{}",
        camel(if r.group.is_empty() { "core" } else { r.group.split('.').next().unwrap_or(r.group) }),
        camel(r.version)
    );
    let kind = r.kind;
    let gvk = (r.group, r.version, kind);
    let (coll, item, scope) = if r.namespaced {
        (
            format!("{root}/namespaces/{{namespace}}/{}", r.plural),
            format!("{root}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
            "Namespaced",
        )
    } else {
        (format!("{root}/{}", r.plural), format!("{root}/{}/{{name}}", r.plural), "")
    };
    let list_def = format!("{def}List");
    let status_def = format!("{META}.Status");
    let mut common = vec![];
    if r.namespaced {
        common.push(path_param(flavor, "namespace", "object name and auth scope, such as for teams and projects"));
    }
    let list_params = || {
        ["labelSelector", "fieldSelector", "continue", "resourceVersion", "resourceVersionMatch"]
            .iter()
            .map(|p| query_param(flavor, p, p, "string"))
            .chain(["limit", "timeoutSeconds"].iter().map(|p| query_param(flavor, p, p, "integer")))
            .chain(
                ["watch", "allowWatchBookmarks", "sendInitialEvents"]
                    .iter()
                    .map(|p| query_param(flavor, p, p, "boolean")),
            )
            .collect::<Vec<_>>()
    };
    paths.insert(
        coll.clone(),
        json!({
            "get": operation(flavor, "list", format!("list{scope}{gv}{kind}"), &tag, gvk, None, list_params(), &[("200", &list_def)]),
            "post": operation(flavor, "post", format!("create{scope}{gv}{kind}"), &tag, gvk, Some((def, false)), write_params(flavor, false), &[("200", def), ("201", def), ("202", def)]),
            "delete": operation(flavor, "deletecollection", format!("deleteCollection{scope}{gv}{kind}"), &tag, gvk, None, list_params(), &[("200", &status_def)]),
            "parameters": common.clone(),
        }),
    );
    let mut item_params = vec![path_param(flavor, "name", &format!("name of the {kind}"))];
    item_params.extend(common.clone());
    paths.insert(
        item.clone(),
        json!({
            "get": operation(flavor, "get", format!("read{scope}{gv}{kind}"), &tag, gvk, None, vec![], &[("200", def)]),
            "put": operation(flavor, "put", format!("replace{scope}{gv}{kind}"), &tag, gvk, Some((def, false)), write_params(flavor, false), &[("200", def), ("201", def)]),
            "patch": operation(flavor, "patch", format!("patch{scope}{gv}{kind}"), &tag, gvk, Some((&format!("{META}.Patch"), true)), write_params(flavor, true), &[("200", def), ("201", def)]),
            "delete": operation(flavor, "delete", format!("delete{scope}{gv}{kind}"), &tag, gvk, Some((&format!("{META}.DeleteOptions"), false)), vec![], &[("200", &status_def), ("202", &status_def)]),
            "parameters": item_params.clone(),
        }),
    );
    if r.namespaced {
        paths.insert(
            format!("{root}/{}", r.plural),
            json!({
                "get": operation(flavor, "list", format!("list{gv}{kind}ForAllNamespaces"), &tag, gvk, None, list_params(), &[("200", &list_def)]),
            }),
        );
    }
    for sub in r.subresources {
        let (sub_def, sub_gvk, title) = match sub {
            Sub::Status => (def.to_string(), gvk, "Status"),
            Sub::Scale => ("io.k8s.api.autoscaling.v1.Scale".to_string(), ("autoscaling", "v1", "Scale"), "Scale"),
            _ => continue,
        };
        paths.insert(
            format!("{item}/{}", sub.name()),
            json!({
                "get": operation(flavor, "get", format!("read{scope}{gv}{kind}{title}"), &tag, sub_gvk, None, vec![], &[("200", &sub_def)]),
                "put": operation(flavor, "put", format!("replace{scope}{gv}{kind}{title}"), &tag, sub_gvk, Some((&sub_def, false)), write_params(flavor, false), &[("200", &sub_def), ("201", &sub_def)]),
                "patch": operation(flavor, "patch", format!("patch{scope}{gv}{kind}{title}"), &tag, sub_gvk, Some((&format!("{META}.Patch"), true)), write_params(flavor, true), &[("200", &sub_def), ("201", &sub_def)]),
                "parameters": item_params.clone(),
            }),
        );
    }
}

const INFO: &str = "v1.37.0";

/// The definition name of a custom kind, as Kubernetes names it: reversed group, version, kind
/// (`com.example.stable.v1.CronTab`).
fn custom_definition_name(r: &ResourceDef) -> String {
    let group: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), r.version, r.kind)
}

/// The served custom resources' group/versions (`apis/<group>/<version>`).
fn custom_gvs() -> BTreeMap<String, Vec<&'static ResourceDef>> {
    let mut gvs: BTreeMap<String, Vec<&'static ResourceDef>> = BTreeMap::new();
    for r in crate::resources::all().into_iter().filter(|r| r.custom.is_some()) {
        gvs.entry(format!("apis/{}/{}", r.group, r.version)).or_default().push(r);
    }
    gvs
}

/// `/openapi/v3` with the custom resources' group/versions added.
pub fn v3_root() -> Doc {
    let mut root: Value = serde_json::from_slice(&OPENAPI.v3_root.bytes).unwrap_or_else(|_| json!({"paths": {}}));
    for gv in custom_gvs().keys() {
        if let Some(doc) = custom_gv_doc(gv) {
            root["paths"][gv] = json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", doc.etag)});
        }
    }
    Doc::new(&root)
}

/// The OpenAPI v3 document of a custom resource group/version, from the CRDs' schemas.
pub fn custom_gv_doc(gv: &str) -> Option<Doc> {
    let rs = custom_gvs().remove(gv)?;
    let mut schemas = Map::new();
    let mut paths = BTreeMap::new();
    let mut roots = vec![
        format!("{META}.Status"),
        format!("{META}.DeleteOptions"),
        format!("{META}.Patch"),
        format!("{META}.ObjectMeta"),
        format!("{META}.ListMeta"),
    ];
    CUSTOM_PATHS.with(|c| c.set(true));
    for r in &rs {
        let Some(info) = r.custom else { continue };
        let name = custom_definition_name(r);
        let mut schema = info.schema.clone();
        if !schema.is_object() {
            schema = json!({"type": "object"});
        }
        schema["properties"]["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
        schema["properties"]["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
        schema["properties"]["metadata"] = json!({"allOf": [{"$ref": format!("{V3_PREFIX}{META}.ObjectMeta")}], "description": "Standard object's metadata."});
        schema["x-kubernetes-group-version-kind"] = json!([{"group": r.group, "kind": r.kind, "version": r.version}]);
        schemas.insert(name.clone(), schema);
        schemas.insert(
            format!("{name}List"),
            json!({"type": "object", "required": ["items"], "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": format!("{V3_PREFIX}{name}")}},
                "metadata": {"allOf": [{"$ref": format!("{V3_PREFIX}{META}.ListMeta")}]}},
                "x-kubernetes-group-version-kind": [{"group": r.group, "kind": format!("{}List", r.kind), "version": r.version}]}),
        );
        resource_paths(Flavor::V3, r, &name, &mut paths);
        if r.subresources.contains(&Sub::Scale) {
            roots.push("io.k8s.api.autoscaling.v1.Scale".into());
        }
    }
    CUSTOM_PATHS.with(|c| c.set(false));
    for n in reachable(&OPENAPI.definitions, roots) {
        if let Some(d) = OPENAPI.definitions.get(&n) {
            let mut d = d.clone();
            rewrite_refs(&mut d, V2_PREFIX, V3_PREFIX);
            schemas.insert(n, d);
        }
    }
    Some(Doc::new(&json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    })))
}

fn build() -> OpenApi {
    let (definitions, by_gvk) = definitions();
    let def_of =
        |r: &ResourceDef| by_gvk.get(&(r.group.to_string(), r.version.to_string(), r.kind.to_string())).cloned();
    // v2: everything in one document.
    let mut paths = BTreeMap::new();
    for r in RESOURCES {
        if let Some(def) = def_of(r) {
            resource_paths(Flavor::V2, r, &def, &mut paths);
        }
    }
    let v2 = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": INFO},
        "paths": paths,
        "definitions": definitions,
        "security": [{"BearerToken": []}],
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "in": "header", "name": "authorization", "type": "apiKey"}},
    });
    // v3: one document per group/version.
    let mut gvs: BTreeMap<String, Vec<&ResourceDef>> = BTreeMap::new();
    for r in RESOURCES {
        let key =
            if r.group.is_empty() { format!("api/{}", r.version) } else { format!("apis/{}/{}", r.group, r.version) };
        gvs.entry(key).or_default().push(r);
    }
    let mut v3 = HashMap::new();
    let mut root_paths = Map::new();
    for (gv, rs) in gvs {
        let mut paths = BTreeMap::new();
        let mut roots = vec![
            format!("{META}.Status"),
            format!("{META}.DeleteOptions"),
            format!("{META}.Patch"),
            format!("{META}.WatchEvent"),
        ];
        for r in &rs {
            if let Some(def) = def_of(r) {
                resource_paths(Flavor::V3, r, &def, &mut paths);
                roots.push(def.clone());
                roots.push(format!("{def}List"));
                if r.subresources.contains(&Sub::Scale) {
                    roots.push("io.k8s.api.autoscaling.v1.Scale".into());
                }
            }
        }
        let names = reachable(&definitions, roots);
        let mut schemas = Map::new();
        for n in names {
            if let Some(d) = definitions.get(&n) {
                let mut d = d.clone();
                rewrite_refs(&mut d, V2_PREFIX, V3_PREFIX);
                schemas.insert(n, d);
            }
        }
        let doc = Doc::new(&json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": INFO},
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}},
            },
        }));
        root_paths.insert(gv.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", doc.etag)}));
        v3.insert(gv, doc);
    }
    OpenApi {
        v2_proto: Doc::from_bytes(crate::openapi_proto::encode(&v2)),
        v2: Doc::new(&v2),
        v3_root: Doc::new(&json!({"paths": root_paths})),
        v3,
        definitions,
        by_gvk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_gvk_and_patch_metadata() {
        let o = &*OPENAPI;
        let pod = o.schema_of("", "v1", "Pod").unwrap();
        assert_eq!(pod["x-kubernetes-group-version-kind"], json!([{"group": "", "kind": "Pod", "version": "v1"}]));
        assert!(pod.get("required").is_none());
        let spec = &o.definitions["io.k8s.api.core.v1.PodSpec"]["properties"];
        assert_eq!(spec["containers"]["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(spec["volumes"]["x-kubernetes-patch-strategy"], "merge,retainKeys");
        let c = &o.definitions["io.k8s.api.core.v1.Container"]["properties"];
        assert_eq!(c["ports"]["x-kubernetes-patch-merge-key"], "containerPort");
        assert!(o.schema_of("apps", "v1", "Deployment").is_some());
    }

    #[test]
    fn v3_documents_advertise_field_validation_on_patch() {
        let o = &*OPENAPI;
        let root: Value = serde_json::from_slice(&o.v3_root.bytes).unwrap();
        assert!(root["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .starts_with("/openapi/v3/apis/apps/v1?hash="));
        let apps: Value = serde_json::from_slice(&o.v3["apis/apps/v1"].bytes).unwrap();
        let patch = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Deployment");
        assert!(patch["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation"));
        assert!(patch["requestBody"]["content"]["application/strategic-merge-patch+json"].is_object());
        let schemas = apps["components"]["schemas"].as_object().unwrap();
        assert!(schemas.contains_key("io.k8s.api.core.v1.PodSpec"));
        assert!(!schemas.contains_key("io.k8s.api.core.v1.Node"));
        let text = String::from_utf8_lossy(&o.v3["apis/apps/v1"].bytes);
        assert!(!text.contains("#/definitions/"));
    }
}
