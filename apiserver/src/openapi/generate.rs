//! Generates the built-in OpenAPI documents from the k8s-openapi types (their `schemars`
//! impls) and checks them against the ones committed under `apiserver/openapi/`, which the
//! apiserver serves (see the module above). `scripts/update-openapi` rewrites them.
//!
//! A test, not part of the apiserver binary: the schema generation code is never linked
//! into it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::paths::{resource_paths, Flavor};
use super::{meta_roots, rewrite_refs, v3_schemas, META, V2_PREFIX};
use crate::protobuf::descriptors::{normalized, DESCRIPTORS};
use crate::resources::{ResourceDef, Sub, RESOURCES};

/// The Kubernetes version the documents describe.
const INFO: &str = "v1.37.0";

/// group, version, kind → definition name.
type ByGvk = HashMap<(String, String, String), String>;

/// The schemas of every served kind and of the meta types, with the Kubernetes extensions.
fn definitions() -> (Map<String, Value>, ByGvk) {
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
    // serviceaccounts/token's body (crate::serviceaccount).
    gen.subschema_for::<k8s_openapi::api::authentication::v1::TokenRequest>();
    // The reviews (crate::reviews): not stored, so not in RESOURCES, but decoded by name.
    {
        use k8s_openapi::api::{authentication::v1 as authn, authorization::v1 as authz};
        gen.subschema_for::<authz::SelfSubjectAccessReview>();
        gen.subschema_for::<authz::SubjectAccessReview>();
        gen.subschema_for::<authz::LocalSubjectAccessReview>();
        gen.subschema_for::<authz::SelfSubjectRulesReview>();
        gen.subschema_for::<authn::SelfSubjectReview>();
        gen.subschema_for::<authn::TokenReview>();
    }
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
    add_gvk(&mut defs, "io.k8s.api.authentication.v1.TokenRequest", "authentication.k8s.io", "v1", "TokenRequest");
    for kind in crate::reviews::KINDS {
        let (g, k) = (kind.group(), kind.name());
        let package = g.trim_end_matches(".k8s.io");
        add_gvk(&mut defs, &format!("io.k8s.api.{package}.v1.{k}"), g, crate::reviews::VERSION, k);
    }
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
    apply_enums(&mut defs, ENUMS).unwrap_or_else(|stale| panic!("enums.tsv names what the schemas lack: {stale:?}"));
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

/// The enum values of the built-in kinds' enum-typed string fields (see the file's header).
const ENUMS: &str = include_str!("enums.tsv");

/// (definition, property) of the enum table.
type Field<'a> = (&'a str, &'a str);

/// Give each field of the table its `enum` and, as kube-apiserver's documents have it, the
/// "Possible enum values:" paragraph at the end of its description (kube-openapi's enum.go).
/// Err: the rows naming a definition or property the schemas lack (the table is stale).
fn apply_enums(defs: &mut Map<String, Value>, table: &str) -> Result<(), Vec<String>> {
    let mut fields: Vec<(Field, Vec<(&str, &str)>)> = Vec::new();
    for line in table.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let mut cols = line.splitn(4, '\t');
        let (Some(def), Some(prop), Some(value)) = (cols.next(), cols.next(), cols.next()) else {
            return Err(vec![line.to_string()]);
        };
        let desc = cols.next().unwrap_or_default();
        match fields.last_mut() {
            Some((key, values)) if *key == (def, prop) => values.push((value, desc)),
            _ => fields.push(((def, prop), vec![(value, desc)])),
        }
    }
    let mut stale = Vec::new();
    for ((def, prop), values) in fields {
        let Some(Value::Object(schema)) = defs.get_mut(def).and_then(|d| d.pointer_mut(&format!("/properties/{prop}")))
        else {
            stale.push(format!("{def}.{prop}"));
            continue;
        };
        schema.insert("enum".into(), json!(values.iter().map(|(v, _)| v).collect::<Vec<_>>()));
        let lines: Vec<String> = values
            .iter()
            .map(|(v, d)| format!(" - `{}` {d}", serde_json::to_string(v).unwrap_or_default()).trim_end().to_string())
            .collect();
        let paragraph = format!("Possible enum values:\n{}", lines.join("\n"));
        let description = match schema.get("description").and_then(Value::as_str) {
            Some(d) if !d.is_empty() => format!("{d}\n\n{paragraph}"),
            _ => paragraph,
        };
        schema.insert("description".into(), json!(description));
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(stale)
    }
}

/// Every built-in document by its path under `apiserver/openapi/`: `v2.json` and
/// `v3/<group/version>.json` (`v3/api/v1.json`, `v3/apis/apps/v1.json`).
fn documents() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
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
    for (gv, rs) in gvs {
        let mut paths = BTreeMap::new();
        let mut roots = meta_roots(&["WatchEvent"]);
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
        let schemas = v3_schemas(&definitions, roots);
        let doc = json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": INFO},
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}},
            },
        });
        out.insert(format!("v3/{gv}.json"), doc);
    }
    out.insert("v2.json".into(), v2);
    out
}

fn committed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi")
}

/// The committed documents are what the types generate; with `UPDATE_OPENAPI=1`
/// (`scripts/update-openapi`) they are rewritten instead.
#[test]
fn committed_documents_are_current() {
    let dir = committed_dir();
    let update = std::env::var_os("UPDATE_OPENAPI").is_some();
    let docs = documents();
    let mut stale = Vec::new();
    for (rel, doc) in &docs {
        let text = serde_json::to_string_pretty(doc).unwrap() + "\n";
        let path = dir.join(rel);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        } else {
            stale.push(rel.clone());
        }
    }
    for f in super::files::json_files(&dir).unwrap() {
        let rel = f.strip_prefix(&dir).unwrap().to_string_lossy().into_owned();
        if !docs.contains_key(&rel) {
            if update {
                std::fs::remove_file(&f).unwrap();
            } else {
                stale.push(format!("{rel} (no longer generated)"));
            }
        }
    }
    assert!(stale.is_empty(), "apiserver/openapi/ is stale: {stale:?}; run scripts/update-openapi");
}

#[test]
fn enum_table_applies_as_kubernetes_documents_have_it() {
    let mut defs = Map::new();
    defs.insert(
        "X".into(),
        json!({"properties": {"policy": {"type": "string", "description": "How."}, "b": {"type": "string"}}}),
    );
    let table = "# comment\nX\tpolicy\tAlways\t\nX\tpolicy\tNever\tnever restarts.\nX\tb\tB\t\n";
    apply_enums(&mut defs, table).unwrap();
    assert_eq!(defs["X"]["properties"]["policy"]["enum"], json!(["Always", "Never"]));
    assert_eq!(
        defs["X"]["properties"]["policy"]["description"],
        "How.\n\nPossible enum values:\n - `\"Always\"`\n - `\"Never\"` never restarts."
    );
    assert_eq!(defs["X"]["properties"]["b"]["description"], "Possible enum values:\n - `\"B\"`");
    assert_eq!(apply_enums(&mut defs, "Y\tp\tv\t\n"), Err(vec!["Y.p".to_string()]));
}
