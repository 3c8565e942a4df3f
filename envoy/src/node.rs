//! Who this sidecar is: the xDS `Node` (Istio's node id and metadata) and the peer metadata
//! it exchanges with other sidecars in HTTP headers.

use std::collections::BTreeMap;

use base64::Engine;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use prost::Message;

/// Request header carrying the sending sidecar's node id.
pub const PEER_ID_HEADER: &str = "x-envoy-peer-metadata-id";
/// Request/response header carrying the sender's metadata (base64 of a protobuf `Struct`).
pub const PEER_METADATA_HEADER: &str = "x-envoy-peer-metadata";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub pod_name: String,
    pub namespace: String,
    pub ip: String,
    pub workload: String,
    pub labels: BTreeMap<String, String>,
    pub cluster_domain: String,
}

impl Identity {
    /// `sidecar~<pod IP>~<pod name>.<namespace>~<namespace>.svc.<cluster domain>`.
    pub fn node_id(&self) -> String {
        format!(
            "sidecar~{}~{}.{}~{}.svc.{}",
            self.ip, self.pod_name, self.namespace, self.namespace, self.cluster_domain
        )
    }

    pub fn node(&self) -> Node {
        let mut fields = std::collections::HashMap::new();
        fields.insert("NAMESPACE".to_string(), string(&self.namespace));
        fields.insert("POD_NAME".to_string(), string(&self.pod_name));
        fields.insert("INSTANCE_IPS".to_string(), string(&self.ip));
        fields.insert("WORKLOAD_NAME".to_string(), string(&self.workload));
        let labels = self.labels.iter().map(|(k, v)| (k.clone(), string(v))).collect();
        fields.insert("LABELS".to_string(), Value { kind: Some(Kind::StructValue(Struct { fields: labels })) });
        Node {
            id: self.node_id(),
            cluster: self.workload.clone(),
            metadata: Some(Struct { fields }),
            user_agent_name: "minik8s-envoy".into(),
            ..Default::default()
        }
    }

    /// The value of [`PEER_METADATA_HEADER`] this sidecar sends.
    pub fn peer_metadata(&self) -> String {
        let mut fields = std::collections::HashMap::new();
        fields.insert("NAMESPACE".to_string(), string(&self.namespace));
        fields.insert("WORKLOAD_NAME".to_string(), string(&self.workload));
        fields.insert("NAME".to_string(), string(&self.pod_name));
        base64::engine::general_purpose::STANDARD.encode(Struct { fields }.encode_to_vec())
    }
}

fn string(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_string())) }
}

/// A peer's workload and namespace, as its metadata header or node id tells them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub workload: String,
    pub namespace: String,
}

/// Decode a peer's [`PEER_METADATA_HEADER`].
pub fn decode_peer_metadata(value: &str) -> Option<Peer> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(value).ok()?;
    let s = Struct::decode(bytes.as_slice()).ok()?;
    let get = |k: &str| match s.fields.get(k).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(v)) => Some(v.clone()),
        _ => None,
    };
    Some(Peer { workload: get("WORKLOAD_NAME")?, namespace: get("NAMESPACE")? })
}

/// A peer from its node id alone: the pod name stands in for the workload.
pub fn peer_from_node_id(id: &str) -> Option<Peer> {
    let mut parts = id.split('~');
    let (_, _, pod_ns, _) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let (pod, ns) = pod_ns.split_once('.')?;
    Some(Peer { workload: pod.to_string(), namespace: ns.to_string() })
}

/// Parse a downward-API labels file (`key="value"` per line).
pub fn parse_labels(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let v = v.trim();
            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
            Some((k.trim().to_string(), v.replace("\\\"", "\"")))
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            pod_name: "web-1".into(),
            namespace: "shop".into(),
            ip: "10.1.0.5".into(),
            workload: "web".into(),
            labels: parse_labels("app=\"web\"\nversion=\"v1\"\n"),
            cluster_domain: "cluster.local".into(),
        }
    }

    #[test]
    fn node_id_and_metadata() {
        let n = id().node();
        assert_eq!(n.id, "sidecar~10.1.0.5~web-1.shop~shop.svc.cluster.local");
        assert_eq!(n.cluster, "web");
        let md = n.metadata.unwrap();
        assert!(matches!(&md.fields["NAMESPACE"].kind, Some(Kind::StringValue(s)) if s == "shop"));
        let Some(Kind::StructValue(labels)) = &md.fields["LABELS"].kind else { panic!() };
        assert!(matches!(&labels.fields["version"].kind, Some(Kind::StringValue(s)) if s == "v1"));
    }

    #[test]
    fn peer_metadata_round_trip() {
        let p = decode_peer_metadata(&id().peer_metadata()).unwrap();
        assert_eq!(p, Peer { workload: "web".into(), namespace: "shop".into() });
        assert_eq!(decode_peer_metadata("!!"), None);
        assert_eq!(
            peer_from_node_id(&id().node_id()),
            Some(Peer { workload: "web-1".into(), namespace: "shop".into() })
        );
    }
}
