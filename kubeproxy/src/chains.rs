//! Chain names hashed the way Kubernetes' kube-proxy hashes them, so the rules look
//! familiar to anyone who has read `iptables-save` on a Kubernetes node:
//! `KUBE-SVC-` + the first 16 characters of base32(sha256(servicePortName + protocol)).

use sha2::{Digest, Sha256};

use crate::model::{Endpoint, Protocol, ServicePortName};

/// RFC 4648 base32 (standard alphabet, as Go's `base32.StdEncoding`) of `bytes`, first `n` characters.
pub fn base32_prefix(bytes: &[u8], n: usize) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(n);
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
            if out.len() == n {
                return out;
            }
        }
    }
    if bits > 0 && out.len() < n {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// Kubernetes' `portProtoHash`.
pub fn port_proto_hash(spn: &ServicePortName, protocol: Protocol) -> String {
    let digest = Sha256::digest(format!("{spn}{}", protocol.lower()).as_bytes());
    base32_prefix(&digest, 16)
}

pub fn svc_chain(spn: &ServicePortName, protocol: Protocol) -> String {
    format!("KUBE-SVC-{}", port_proto_hash(spn, protocol))
}
pub fn svl_chain(spn: &ServicePortName, protocol: Protocol) -> String {
    format!("KUBE-SVL-{}", port_proto_hash(spn, protocol))
}
pub fn ext_chain(spn: &ServicePortName, protocol: Protocol) -> String {
    format!("KUBE-EXT-{}", port_proto_hash(spn, protocol))
}

pub fn fw_chain(spn: &ServicePortName, protocol: Protocol) -> String {
    format!("KUBE-FW-{}", port_proto_hash(spn, protocol))
}

/// Kubernetes' `servicePortEndpointChainName`.
pub fn sep_chain(spn: &ServicePortName, protocol: Protocol, ep: &Endpoint) -> String {
    let digest = Sha256::digest(format!("{spn}{}{}", protocol.lower(), ep.addr()).as_bytes());
    format!("KUBE-SEP-{}", base32_prefix(&digest, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_rfc4648_vectors() {
        assert_eq!(base32_prefix(b"foobar", 16), "MZXW6YTBOI");
        assert_eq!(base32_prefix(b"fooba", 8), "MZXW6YTB");
        assert_eq!(base32_prefix(b"f", 2), "MY");
    }

    #[test]
    fn chain_names_are_stable_and_distinct() {
        let spn = ServicePortName { namespace: "default".into(), name: "web".into(), port: "http".into() };
        let a = svc_chain(&spn, Protocol::Tcp);
        assert_eq!(a, svc_chain(&spn, Protocol::Tcp));
        assert_ne!(a, svc_chain(&spn, Protocol::Udp));
        assert_eq!(a.len(), "KUBE-SVC-".len() + 16);
        assert_eq!(&a[9..], &ext_chain(&spn, Protocol::Tcp)[9..]);
    }

    #[test]
    fn kubernetes_hash_of_a_known_service() {
        // sha256("ns1/svc1:p80tcp") as kube-proxy computes it (pkg/proxy/iptables tests).
        let spn = ServicePortName { namespace: "ns1".into(), name: "svc1".into(), port: "p80".into() };
        assert_eq!(svc_chain(&spn, Protocol::Tcp), "KUBE-SVC-XPGD46QRK7WJZT7O");
    }
}
