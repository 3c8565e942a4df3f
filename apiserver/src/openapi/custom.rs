//! The documents of custom resources, built from their CRDs' schemas when asked for:
//! `/openapi/v3/apis/<group>/<version>`, and the `/openapi/v3` index listing them beside the
//! built-in group/versions.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::paths::{resource_paths, Flavor};
use super::{meta_roots, v3_schemas, Doc, DEFINITIONS, META, V3_PREFIX};
use crate::registry::{ResourceDef, Sub};

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

/// `/openapi/v3`: the built-in group/versions, and the custom resources' ones.
pub fn v3_root() -> Doc {
    let custom = custom_gvs();
    if custom.is_empty() {
        return super::generated::V3_ROOT.clone();
    }
    let mut root: Value =
        serde_json::from_slice(&super::generated::V3_ROOT.bytes).unwrap_or_else(|_| json!({"paths": {}}));
    for (gv, rs) in &custom {
        let doc = gv_doc(rs);
        root["paths"][gv] = json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", doc.etag)});
    }
    Doc::new(&root)
}

/// The OpenAPI v3 document of a custom resource group/version, from the CRDs' schemas.
pub fn custom_gv_doc(gv: &str) -> Option<Doc> {
    custom_gvs().get(gv).map(|rs| gv_doc(rs))
}

/// The document of one group/version's custom resources.
fn gv_doc(rs: &[&'static ResourceDef]) -> Doc {
    let mut paths = BTreeMap::new();
    let mut custom_schemas = Vec::new();
    let mut roots = meta_roots(&["ObjectMeta", "ListMeta"]);
    for r in rs {
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
        custom_schemas.push((name.clone(), schema));
        custom_schemas.push((
            format!("{name}List"),
            json!({"type": "object", "required": ["items"], "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": format!("{V3_PREFIX}{name}")}},
                "metadata": {"allOf": [{"$ref": format!("{V3_PREFIX}{META}.ListMeta")}]}},
                "x-kubernetes-group-version-kind": [{"group": r.group, "kind": format!("{}List", r.kind), "version": r.version}]}),
        ));
        resource_paths(Flavor::V3, r, &name, &mut paths);
        if r.subresources.contains(&Sub::Scale) {
            roots.push("io.k8s.api.autoscaling.v1.Scale".into());
        }
    }
    let mut schemas = v3_schemas(&*DEFINITIONS, roots);
    schemas.extend(custom_schemas);
    Doc::new(&json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
