//! The `networking.istio.io` CustomResourceDefinitions pilot serves: `VirtualService`
//! (`vs`) and `DestinationRule` (`dr`), versions `v1` (stored), `v1beta1` and `v1alpha3`
//! with one schema, Istio's printer columns and a status subresource.
//!
//! The schema is structural and types every field pilot implements, so the apiserver
//! rejects a wrongly typed one (422). Objects where Istio has fields pilot does not
//! implement keep them (`x-kubernetes-preserve-unknown-fields`): a manifest written for
//! Istio is accepted, and those fields are ignored. What a schema cannot say (weights that
//! sum to 100, regexes that compile) is [`crate::validate`]'s.

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

pub const GROUP: &str = "networking.istio.io";
/// Served versions; the first is stored.
pub const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha3"];

fn string() -> Value {
    json!({"type": "string"})
}

fn integer() -> Value {
    json!({"type": "integer", "format": "int32"})
}

fn strings() -> Value {
    json!({"type": "array", "items": string()})
}

fn map_of(v: Value) -> Value {
    json!({"type": "object", "additionalProperties": v})
}

/// An object with these fields.
fn object(props: Value) -> Value {
    json!({"type": "object", "properties": props})
}

/// An object with these fields, keeping Istio's others (not implemented here).
fn open_object(props: Value) -> Value {
    json!({"type": "object", "properties": props, "x-kubernetes-preserve-unknown-fields": true})
}

fn string_match() -> Value {
    object(json!({"exact": string(), "prefix": string(), "regex": string()}))
}

fn percent() -> Value {
    object(json!({"value": {"type": "number", "format": "double"}}))
}

fn destination() -> Value {
    open_object(json!({"host": string(), "subset": string(), "port": object(json!({"number": integer()}))}))
}

fn route_destinations() -> Value {
    json!({"type": "array", "items": open_object(json!({"destination": destination(), "weight": integer()}))})
}

pub fn virtual_service_schema() -> Value {
    let http_match = open_object(json!({
        "name": string(),
        "uri": string_match(),
        "method": string_match(),
        "headers": map_of(string_match()),
        "queryParams": map_of(string_match()),
        "port": integer(),
    }));
    let http = open_object(json!({
        "name": string(),
        "match": {"type": "array", "items": http_match},
        "route": route_destinations(),
        "rewrite": open_object(json!({"uri": string()})),
        "timeout": string(),
        "retries": open_object(json!({"attempts": integer(), "perTryTimeout": string(), "retryOn": string()})),
        "fault": object(json!({
            "delay": open_object(json!({"fixedDelay": string(), "percentage": percent()})),
            "abort": open_object(json!({"httpStatus": integer(), "percentage": percent()})),
        })),
    }));
    let tcp = object(json!({
        "match": {"type": "array", "items": open_object(json!({"port": integer()}))},
        "route": route_destinations(),
    }));
    spec_schema(open_object(json!({
        "hosts": strings(),
        "gateways": strings(),
        "exportTo": strings(),
        "http": {"type": "array", "items": http},
        "tcp": {"type": "array", "items": tcp},
    })))
}

fn traffic_policy() -> Value {
    open_object(json!({
        "loadBalancer": open_object(json!({"simple": {"type": "string", "enum": crate::validate::LOAD_BALANCERS}})),
        "connectionPool": object(json!({
            "tcp": open_object(json!({"maxConnections": integer(), "connectTimeout": string()})),
            "http": open_object(json!({
                "http1MaxPendingRequests": integer(), "http2MaxRequests": integer(), "maxRetries": integer()})),
        })),
        "outlierDetection": open_object(json!({
            "consecutive5xxErrors": {"type": "integer", "format": "int64", "nullable": true},
            "interval": string(), "baseEjectionTime": string(), "maxEjectionPercent": integer()})),
    }))
}

pub fn destination_rule_schema() -> Value {
    spec_schema(open_object(json!({
        "host": string(),
        "exportTo": strings(),
        "trafficPolicy": traffic_policy(),
        "subsets": {"type": "array", "items": open_object(json!({
            "name": string(), "labels": map_of(string()), "trafficPolicy": traffic_policy()}))},
    })))
}

fn spec_schema(spec: Value) -> Value {
    json!({"openAPIV3Schema": {
        "type": "object",
        "properties": {
            "spec": spec,
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
    }})
}

fn crd(plural: &str, singular: &str, kind: &str, short: &str, schema: Value, columns: Value) -> Value {
    let versions: Vec<Value> = VERSIONS
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({"name": v, "served": true, "storage": i == 0, "schema": schema,
                   "subresources": {"status": {}}, "additionalPrinterColumns": columns})
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}"), "labels": {"app": "istio-pilot", "chart": "istio"}},
        "spec": {
            "group": GROUP,
            "names": {"plural": plural, "singular": singular, "kind": kind, "listKind": format!("{kind}List"),
                      "shortNames": [short], "categories": ["istio-io", "networking-istio-io"]},
            "scope": "Namespaced",
            "versions": versions,
        },
    })
}

fn age() -> Value {
    json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
           "description": "CreationTimestamp is a timestamp representing the server time when this object was created."})
}

pub fn virtual_service() -> Value {
    crd(
        "virtualservices",
        "virtualservice",
        "VirtualService",
        "vs",
        virtual_service_schema(),
        json!([
            {"name": "Gateways", "type": "string", "jsonPath": ".spec.gateways",
             "description": "The names of gateways and sidecars that should apply these routes"},
            {"name": "Hosts", "type": "string", "jsonPath": ".spec.hosts",
             "description": "The destination hosts to which traffic is being sent"},
            age(),
        ]),
    )
}

pub fn destination_rule() -> Value {
    crd(
        "destinationrules",
        "destinationrule",
        "DestinationRule",
        "dr",
        destination_rule_schema(),
        json!([
            {"name": "Host", "type": "string", "jsonPath": ".spec.host",
             "description": "The name of a service from the service registry"},
            age(),
        ]),
    )
}

/// Create the CRDs, or bring existing ones up to these definitions.
pub async fn ensure(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for def in [virtual_service(), destination_rule()] {
        let mut crd: CustomResourceDefinition = serde_json::from_value(def).context("a CRD definition")?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        match api.get_opt(&name).await.with_context(|| format!("reading CRD {name}"))? {
            Some(current) => {
                crd.metadata.resource_version = current.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &crd)
                    .await
                    .with_context(|| format!("updating CRD {name}"))?;
                tracing::info!(crd = name, "updated");
            }
            None => {
                api.create(&PostParams::default(), &crd).await.with_context(|| format!("creating CRD {name}"))?;
                tracing::info!(crd = name, "created");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_valid_crds() {
        for def in [virtual_service(), destination_rule()] {
            let crd: CustomResourceDefinition = serde_json::from_value(def).unwrap();
            assert_eq!(crd.spec.group, "networking.istio.io");
            assert_eq!(crd.spec.scope, "Namespaced");
            let names: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(names, vec!["v1", "v1beta1", "v1alpha3"]);
            assert_eq!(crd.spec.versions.iter().filter(|v| v.storage).count(), 1);
            assert!(crd.spec.versions[0].storage);
            assert!(crd.spec.versions.iter().all(|v| v.served && v.subresources.as_ref().unwrap().status.is_some()));
        }
        let vs: CustomResourceDefinition = serde_json::from_value(virtual_service()).unwrap();
        assert_eq!(vs.metadata.name.as_deref(), Some("virtualservices.networking.istio.io"));
        assert_eq!(vs.spec.names.short_names, Some(vec!["vs".to_string()]));
        let cols: Vec<String> =
            vs.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect();
        assert_eq!(cols, vec!["Gateways", "Hosts", "Age"]);
        let dr: CustomResourceDefinition = serde_json::from_value(destination_rule()).unwrap();
        assert_eq!(dr.spec.names.short_names, Some(vec!["dr".to_string()]));
        let cols: Vec<String> =
            dr.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect();
        assert_eq!(cols, vec!["Host", "Age"]);
    }

    /// A small structural check of the kind the apiserver makes: types, recursively.
    fn type_errors(v: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
        let ok = match schema.get("type").and_then(Value::as_str) {
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("integer") => v.is_i64() || v.is_u64(),
            Some("number") => v.is_number(),
            _ => true,
        };
        if !ok {
            out.push(path.to_string());
            return;
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
            if !allowed.contains(v) {
                out.push(path.to_string());
            }
        }
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if let Some(s) = schema.get("properties").and_then(|p| p.get(k)) {
                        type_errors(x, s, &format!("{path}.{k}"), out);
                    } else if let Some(s) = schema.get("additionalProperties") {
                        type_errors(x, s, &format!("{path}.{k}"), out);
                    }
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    type_errors(x, &schema["items"], &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_schema_types_the_implemented_fields() {
        let schema = &virtual_service_schema()["openAPIV3Schema"];
        let good = json!({"spec": {"hosts": ["reviews"], "http": [{"match": [{"uri": {"prefix": "/"}, "headers": {"x": {"exact": "y"}}}],
            "route": [{"destination": {"host": "reviews", "subset": "v1", "port": {"number": 9080}}, "weight": 100}],
            "timeout": "5s", "mirror": {"host": "other"}}]}});
        let mut errs = vec![];
        type_errors(&good, schema, "", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        let bad = json!({"spec": {"hosts": "reviews", "http": [{"route": [{"destination": {"host": "r"}, "weight": "fifty"}]}]}});
        let mut errs = vec![];
        type_errors(&bad, schema, "", &mut errs);
        assert_eq!(errs, vec![".spec.hosts", ".spec.http[0].route[0].weight"]);
        let schema = &destination_rule_schema()["openAPIV3Schema"];
        let bad = json!({"spec": {"host": "r", "trafficPolicy": {"loadBalancer": {"simple": "FASTEST"}}}});
        let mut errs = vec![];
        type_errors(&bad, schema, "", &mut errs);
        assert_eq!(errs, vec![".spec.trafficPolicy.loadBalancer.simple"]);
    }
}
