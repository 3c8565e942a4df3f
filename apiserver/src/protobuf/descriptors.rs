//! The wire layout and patch metadata of every served Kubernetes protobuf message, read from
//! `descriptors.txt` (generated from the k8s-pb crate by `tools/gen_protodesc.py`).

use std::collections::HashMap;
use std::sync::LazyLock;

/// How a field repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    Optional,
    Repeated,
    /// `map<string, T>`
    Map,
}

#[derive(Clone, Debug)]
pub struct Field {
    pub tag: u32,
    /// prost's snake_case name (without `r#`).
    pub rust_name: String,
    pub label: Label,
    /// A scalar type name (`string`, `int32`, `bytes` …) or a message name.
    pub ty: String,
    pub merge_key: Option<String>,
    pub strategy: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Message {
    pub fields: Vec<Field>,
}

/// All messages by name (`api.core.v1.PodSpec`).
pub struct Descriptors {
    pub messages: HashMap<String, Message>,
    /// Lower-cased message name → message name (prost renames `JSONSchemaProps` to `JsonSchemaProps`).
    by_lower: HashMap<String, String>,
}

pub static DESCRIPTORS: LazyLock<Descriptors> = LazyLock::new(|| Descriptors::parse(include_str!("descriptors.txt")));

pub const SCALARS: &[&str] =
    &["string", "int32", "int64", "bool", "double", "float", "bytes", "uint32", "uint64", "sint32", "sint64"];

impl Descriptors {
    pub fn parse(text: &str) -> Descriptors {
        let mut messages: HashMap<String, Message> = HashMap::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            match cols.as_slice() {
                ["M", name] => {
                    messages.entry(name.to_string()).or_default();
                    current = Some(name.to_string());
                }
                ["F", tag, name, label, ty, mk, st] => {
                    let (Some(cur), Ok(tag)) = (&current, tag.parse::<u32>()) else { continue };
                    let label = match *label {
                        "rep" => Label::Repeated,
                        "map" => Label::Map,
                        _ => Label::Optional,
                    };
                    let opt = |s: &str| if s == "-" { None } else { Some(s.to_string()) };
                    if let Some(m) = messages.get_mut(cur) {
                        m.fields.push(Field {
                            tag,
                            rust_name: name.to_string(),
                            label,
                            ty: ty.to_string(),
                            merge_key: opt(mk),
                            strategy: opt(st),
                        });
                    }
                }
                _ => {}
            }
        }
        let by_lower = messages.keys().map(|k| (k.to_ascii_lowercase(), k.clone())).collect();
        Descriptors { messages, by_lower }
    }

    /// The message for an OpenAPI definition name (`io.k8s.api.core.v1.PodSpec`).
    pub fn message_for_definition(&self, def: &str) -> Option<(&str, &Message)> {
        let rest = def.strip_prefix("io.k8s.")?;
        let rest = rest
            .replace("apiextensions-apiserver", "apiextensions_apiserver")
            .replace("kube-aggregator", "kube_aggregator");
        let name = self.by_lower.get(&rest.to_ascii_lowercase())?;
        self.messages.get(name).map(|m| (name.as_str(), m))
    }
}

/// A field name with case and underscores removed: `hostPID`, `host_pid` → `hostpid`.
pub fn normalized(name: &str) -> String {
    name.trim_start_matches("r#").chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_generated_table() {
        let d = &*DESCRIPTORS;
        let (_, spec) = d.message_for_definition("io.k8s.api.core.v1.PodSpec").unwrap();
        let containers = spec.fields.iter().find(|f| f.rust_name == "containers").unwrap();
        assert_eq!(containers.tag, 2);
        assert_eq!(containers.label, Label::Repeated);
        assert_eq!(containers.ty, "api.core.v1.Container");
        assert_eq!(containers.merge_key.as_deref(), Some("name"));
        assert_eq!(containers.strategy.as_deref(), Some("merge"));
        assert!(d
            .message_for_definition("io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps")
            .is_some());
        assert_eq!(normalized("hostPID"), normalized("host_pid"));
    }
}
