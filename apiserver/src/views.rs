//! Resources served as a converted view of another version's storage: one storage, every
//! version converted on the way in and out (Kubernetes' conversion between external
//! versions through the internal one). `server.rs`'s request path serves them (its `Codec`).

use serde_json::Value;

use crate::registry::ResourceDef;

pub struct View {
    /// The group/version/kind served.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// The stored resource: group, version, plural.
    pub storage: (&'static str, &'static str, &'static str),
    /// stored → served
    pub to_view: fn(&Value) -> Value,
    /// served → stored
    pub from_view: fn(&Value) -> Result<Value, String>,
    /// A field selector field of the served version as the stored field.
    pub field: fn(&str) -> String,
}

impl View {
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }
}

fn same_field(f: &str) -> String {
    f.to_string()
}

fn events_from_v1(v: &Value) -> Result<Value, String> {
    Ok(crate::eventsview::from_v1(v))
}

pub static EVENTS_V1: View = View {
    group: "events.k8s.io",
    version: "v1",
    kind: "Event",
    storage: ("", "v1", "events"),
    to_view: crate::eventsview::to_v1,
    from_view: events_from_v1,
    field: crate::eventsview::core_field,
};

pub static HPA_V1: View = View {
    group: "autoscaling",
    version: "v1",
    kind: "HorizontalPodAutoscaler",
    storage: ("autoscaling", "v2", "horizontalpodautoscalers"),
    to_view: crate::hpaview::to_v1,
    from_view: crate::hpaview::from_v1,
    field: same_field,
};

/// The view a resource is served through, if it is not stored as itself.
pub fn of(res: &ResourceDef) -> Option<&'static View> {
    [&EVENTS_V1, &HPA_V1].into_iter().find(|v| v.group == res.group && v.version == res.version && v.kind == res.kind)
}
