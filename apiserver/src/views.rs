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
    pub to_view: &'static (dyn Fn(&Value) -> Value + Send + Sync),
    /// served → stored
    pub from_view: &'static (dyn Fn(&Value) -> Result<Value, String> + Send + Sync),
    /// A field selector field of the served version as the stored field.
    pub field: &'static (dyn Fn(&str) -> String + Send + Sync),
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View({}/{} {} of {}/{})", self.group, self.version, self.kind, self.storage.0, self.storage.1)
    }
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
    to_view: &crate::eventsview::to_v1,
    from_view: &events_from_v1,
    field: &crate::eventsview::core_field,
};

pub static HPA_V1: View = View {
    group: "autoscaling",
    version: "v1",
    kind: "HorizontalPodAutoscaler",
    storage: ("autoscaling", "v2", "horizontalpodautoscalers"),
    to_view: &crate::hpaview::to_v1,
    from_view: &crate::hpaview::from_v1,
    field: &same_field,
};

/// The view a resource is served through, if it is not stored as itself: a built-in one,
/// or a custom resource version other than its CRD's storage version.
pub fn of(res: &ResourceDef) -> Option<&'static View> {
    if let Some(custom) = res.custom {
        let storage = custom.storage_version?;
        return Some(custom_version((res.group, res.version, res.kind, res.plural, storage)));
    }
    [&EVENTS_V1, &HPA_V1].into_iter().find(|v| v.group == res.group && v.version == res.version && v.kind == res.kind)
}

/// group, version, kind, plural and storage version of a custom resource version.
type CustomKey = (&'static str, &'static str, &'static str, &'static str, &'static str);

/// A CustomResourceDefinition version served beside its storage version, with Kubernetes'
/// `conversion: None`: objects are stored as the storage version and served as the version
/// asked for, only `apiVersion` changing. Made once per key and kept (leaked), as the CRD's
/// resource definitions are.
fn custom_version(key: CustomKey) -> &'static View {
    static MADE: std::sync::Mutex<Vec<(CustomKey, &'static View)>> = std::sync::Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, v)) = made.iter().find(|(k, _)| *k == key) {
        return v;
    }
    let view = make_custom_version(key);
    made.push((key, view));
    view
}

fn make_custom_version((group, version, kind, plural, storage_version): CustomKey) -> &'static View {
    let served: &'static str = Box::leak(format!("{group}/{version}").into_boxed_str());
    let stored: &'static str = Box::leak(format!("{group}/{storage_version}").into_boxed_str());
    let with_version = |obj: &Value, api_version: &'static str| {
        let mut obj = obj.clone();
        if let Some(m) = obj.as_object_mut() {
            m.insert("apiVersion".into(), Value::String(api_version.into()));
        }
        obj
    };
    Box::leak(Box::new(View {
        group,
        version,
        kind,
        storage: (group, storage_version, plural),
        to_view: Box::leak(Box::new(move |obj: &Value| with_version(obj, served))),
        from_view: Box::leak(Box::new(move |obj: &Value| Ok(with_version(obj, stored)))),
        field: &same_field,
    }))
}
