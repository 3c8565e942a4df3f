//! The `paths` of a document: the operations of one resource, for Swagger 2.0 (`/openapi/v2`)
//! or OpenAPI 3 (`/openapi/v3/...`), shaped as Kubernetes publishes them. Used by the
//! generator of the built-in documents and for custom resources at run time.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{META, V2_PREFIX, V3_PREFIX};
use crate::registry::{ResourceDef, Sub};

/// Whether the operation is described for Swagger 2.0 or OpenAPI 3.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
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

/// What an operation takes as its body.
#[derive(Clone, Copy)]
enum Body<'a> {
    /// An object of this definition.
    Object(&'a str),
    /// A patch; custom resources do not take strategic merge patches.
    Patch { strategic: bool },
}

/// One operation object.
#[allow(clippy::too_many_arguments)]
fn operation(
    flavor: Flavor,
    action: &str,
    op_id: String,
    tag: &str,
    gvk: (&str, &str, &str),
    body: Option<Body<'_>>,
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
    if let Some(body) = body {
        let patch_def = format!("{META}.Patch");
        let (schema, types): (&str, Vec<&str>) = match body {
            Body::Object(def) => (def, MEDIA.to_vec()),
            Body::Patch { strategic: true } => (&patch_def, PATCH_TYPES.to_vec()),
            Body::Patch { strategic: false } => (
                &patch_def,
                PATCH_TYPES.iter().copied().filter(|t| *t != "application/strategic-merge-patch+json").collect(),
            ),
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

/// `snake_case`, `dotted.name` or `kebab-case` in CamelCase (`upper_first`) or camelCase.
pub(crate) fn camel_case(s: &str, upper_first: bool) -> String {
    let mut out = String::new();
    let mut up = upper_first;
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

fn camel(s: &str) -> String {
    camel_case(s, true)
}

/// The paths of one resource.
pub fn resource_paths(flavor: Flavor, r: &ResourceDef, def: &str, paths: &mut BTreeMap<String, Value>) {
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
    let patch = Body::Patch { strategic: r.custom.is_none() };
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
            "post": operation(flavor, "post", format!("create{scope}{gv}{kind}"), &tag, gvk, Some(Body::Object(def)), write_params(flavor, false), &[("200", def), ("201", def), ("202", def)]),
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
            "put": operation(flavor, "put", format!("replace{scope}{gv}{kind}"), &tag, gvk, Some(Body::Object(def)), write_params(flavor, false), &[("200", def), ("201", def)]),
            "patch": operation(flavor, "patch", format!("patch{scope}{gv}{kind}"), &tag, gvk, Some(patch), write_params(flavor, true), &[("200", def), ("201", def)]),
            "delete": operation(flavor, "delete", format!("delete{scope}{gv}{kind}"), &tag, gvk, Some(Body::Object(&format!("{META}.DeleteOptions"))), vec![], &[("200", &status_def), ("202", &status_def)]),
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
            Sub::EphemeralContainers => (def.to_string(), gvk, "Ephemeralcontainers"),
            Sub::Approval => (def.to_string(), gvk, "Approval"),
            Sub::Scale => ("io.k8s.api.autoscaling.v1.Scale".to_string(), ("autoscaling", "v1", "Scale"), "Scale"),
            _ => continue,
        };
        paths.insert(
            format!("{item}/{}", sub.name()),
            json!({
                "get": operation(flavor, "get", format!("read{scope}{gv}{kind}{title}"), &tag, sub_gvk, None, vec![], &[("200", &sub_def)]),
                "put": operation(flavor, "put", format!("replace{scope}{gv}{kind}{title}"), &tag, sub_gvk, Some(Body::Object(&sub_def)), write_params(flavor, false), &[("200", &sub_def), ("201", &sub_def)]),
                "patch": operation(flavor, "patch", format!("patch{scope}{gv}{kind}{title}"), &tag, sub_gvk, Some(patch), write_params(flavor, true), &[("200", &sub_def), ("201", &sub_def)]),
                "parameters": item_params.clone(),
            }),
        );
    }
}
