//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386), and strategic merge
//! patch. Pure functions.
//!
//! Strategic merge patch is `apimachinery::strategicpatch`, driven by the kind's OpenAPI
//! schema (the `x-kubernetes-patch-merge-key` / `-strategy` of each field, see [`crate::openapi`]).

use apimachinery::strategicpatch::{strategic_merge_patch, Schema};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match base.as_str() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// The body is not a patch of this type (400).
    Decode(String),
    /// The patch does not apply to the object (422).
    Apply(String),
}

impl From<PatchError> for crate::error::ApiError {
    fn from(e: PatchError) -> Self {
        match e {
            PatchError::Decode(m) => crate::error::ApiError::bad_request(m),
            PatchError::Apply(m) => crate::error::ApiError::new(422, "Invalid", m),
        }
    }
}

/// The group, version and kind of the patched object (its schema drives strategic merge patch).
pub type Gvk<'a> = (&'a str, &'a str, &'a str);

pub fn apply(kind: PatchType, doc: &Value, body: &[u8], gvk: Gvk<'_>) -> Result<Value, PatchError> {
    match kind {
        PatchType::Json => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(format!("error decoding patch: {e}")))?;
            let mut out = doc.clone();
            json_patch::patch(&mut out, &patch).map_err(|e| PatchError::Apply(e.to_string()))?;
            Ok(out)
        }
        PatchType::Merge => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(PatchError::Decode("error decoding patch: merge patch must be a JSON object".into()));
            }
            let mut out = doc.clone();
            json_patch::merge(&mut out, &patch);
            Ok(out)
        }
        PatchType::Strategic => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(PatchError::Decode(
                    "error decoding patch: strategic merge patch must be a JSON object".into(),
                ));
            }
            let defs = &*crate::openapi::DEFINITIONS;
            let schema = match defs.schema_of(gvk.0, gvk.1, gvk.2) {
                Some(root) => Schema::new(defs, root),
                None => Schema::none(),
            };
            strategic_merge_patch(doc, &patch, schema).map_err(|e| PatchError::Apply(e.0))
        }
        PatchType::Apply => Err(PatchError::Decode("server-side apply is not supported yet".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const POD: Gvk<'static> = ("", "v1", "Pod");

    #[test]
    fn content_types() {
        assert_eq!(PatchType::from_content_type("application/merge-patch+json; charset=utf-8"), Some(PatchType::Merge));
        assert_eq!(PatchType::from_content_type("application/json-patch+json"), Some(PatchType::Json));
        assert_eq!(PatchType::from_content_type("text/plain"), None);
    }

    #[test]
    fn merge_and_json_patch() {
        let doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        let out = apply(PatchType::Merge, &doc, br#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#, POD).unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
        let out = apply(PatchType::Json, &doc, br#"[{"op":"replace","path":"/metadata/labels/a","value":"9"}]"#, POD)
            .unwrap();
        assert_eq!(out["metadata"]["labels"]["a"], "9");
        assert!(matches!(apply(PatchType::Json, &doc, b"{", POD), Err(PatchError::Decode(_))));
        assert!(matches!(
            apply(PatchType::Json, &doc, br#"[{"op":"test","path":"/metadata/labels/a","value":"x"}]"#, POD),
            Err(PatchError::Apply(_))
        ));
        assert!(matches!(apply(PatchType::Merge, &doc, b"[1]", POD), Err(PatchError::Decode(_))));
    }

    #[test]
    fn strategic_containers_by_name() {
        let doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let patch = br#"{"spec":{"$setElementOrder/containers":[{"name":"b"},{"name":"a"}],"containers":[{"name":"a","image":"z"}]}}"#;
        let out = apply(PatchType::Strategic, &doc, patch, POD).unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "image": "y"}, {"name": "a", "image": "z"}]));
        let del = br#"{"spec":{"containers":[{"name":"a","$patch":"delete"}]}}"#;
        let out = apply(PatchType::Strategic, &doc, del, POD).unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "image": "y"}]));
    }

    #[test]
    fn strategic_other_lists_replace() {
        let doc = json!({"spec": {"args": ["a", "b"]}, "metadata": {"finalizers": ["x"]}});
        let out = apply(PatchType::Strategic, &doc, br#"{"spec":{"args":["c"]},"metadata":{"finalizers":["y"]}}"#, POD)
            .unwrap();
        assert_eq!(out["spec"]["args"], json!(["c"]));
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        let out =
            apply(PatchType::Strategic, &doc, br#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["x"]}}"#, POD)
                .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!([]));
    }
}
