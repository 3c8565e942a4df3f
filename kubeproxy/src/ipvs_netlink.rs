//! The IPVS operations of [`crate::ipvs`] encoded as generic netlink messages of the
//! kernel's `IPVS` family (`include/uapi/linux/ip_vs.h`), as pure functions: what a
//! netlink socket would send. The family id is resolved at run time (`CTRL_CMD_GETFAMILY`)
//! and passed in. Address binding on `kube-ipvs0` is rtnetlink's business, not this family's.

use crate::ipvs::{Op, RealServer, VirtualServer, VsKey};
use crate::model::Protocol;

pub const IPVS_GENL_NAME: &str = "IPVS";
pub const IPVS_GENL_VERSION: u8 = 1;

pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub const IPVS_CMD_SET_SERVICE: u8 = 2;
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
pub const IPVS_CMD_NEW_DEST: u8 = 5;
pub const IPVS_CMD_DEL_DEST: u8 = 7;

pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub const IPVS_CMD_ATTR_DEST: u16 = 2;

pub const IPVS_SVC_ATTR_AF: u16 = 1;
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;

pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// Masquerading (NAT) forwarding: `IP_VS_CONN_F_MASQ`.
pub const IP_VS_CONN_F_MASQ: u32 = 0;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
const AF_INET: u16 = 2;

fn ipproto(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// A netlink attribute list being built.
#[derive(Default)]
struct Attrs(Vec<u8>);

impl Attrs {
    fn put(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
        self
    }
    fn u16(&mut self, kind: u16, v: u16) -> &mut Self {
        self.put(kind, &v.to_ne_bytes())
    }
    fn u32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.put(kind, &v.to_ne_bytes())
    }
    /// A 16-byte `nf_inet_addr` holding an IPv4 address.
    fn addr(&mut self, kind: u16, ip: std::net::Ipv4Addr) -> &mut Self {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&ip.octets());
        self.put(kind, &a)
    }
    fn port(&mut self, kind: u16, port: u16) -> &mut Self {
        self.put(kind, &port.to_be_bytes())
    }
}

fn service_attrs(key: &VsKey, vs: Option<&VirtualServer>) -> Vec<u8> {
    let mut a = Attrs::default();
    a.u16(IPVS_SVC_ATTR_AF, AF_INET)
        .u16(IPVS_SVC_ATTR_PROTOCOL, ipproto(key.protocol))
        .addr(IPVS_SVC_ATTR_ADDR, key.addr)
        .port(IPVS_SVC_ATTR_PORT, key.port);
    if let Some(vs) = vs {
        let mut name = vs.scheduler.as_bytes().to_vec();
        name.push(0);
        a.put(IPVS_SVC_ATTR_SCHED_NAME, &name);
        let flags = if vs.persistence_timeout.is_some() { IP_VS_SVC_F_PERSISTENT } else { 0 };
        let mut f = Vec::new();
        f.extend_from_slice(&flags.to_ne_bytes());
        f.extend_from_slice(&u32::MAX.to_ne_bytes());
        a.put(IPVS_SVC_ATTR_FLAGS, &f);
        a.u32(IPVS_SVC_ATTR_TIMEOUT, vs.persistence_timeout.unwrap_or(0));
        a.u32(IPVS_SVC_ATTR_NETMASK, u32::MAX);
    }
    a.0
}

fn dest_attrs(rs: &RealServer, full: bool) -> Vec<u8> {
    let mut a = Attrs::default();
    a.addr(IPVS_DEST_ATTR_ADDR, rs.addr).port(IPVS_DEST_ATTR_PORT, rs.port).u16(IPVS_DEST_ATTR_ADDR_FAMILY, AF_INET);
    if full {
        a.u32(IPVS_DEST_ATTR_FWD_METHOD, IP_VS_CONN_F_MASQ)
            .u32(IPVS_DEST_ATTR_WEIGHT, rs.weight)
            .u32(IPVS_DEST_ATTR_U_THRESH, 0)
            .u32(IPVS_DEST_ATTR_L_THRESH, 0);
    }
    a.0
}

/// The message for `op` (`None` for address binding, which is not an IPVS command).
pub fn encode(op: &Op, family: u16, seq: u32) -> Option<Vec<u8>> {
    let (cmd, attrs) = match op {
        Op::BindAddress(_) | Op::UnbindAddress(_) => return None,
        Op::AddVirtualServer(vs) => (
            IPVS_CMD_NEW_SERVICE,
            Attrs::default().put(IPVS_CMD_ATTR_SERVICE, &service_attrs(&vs.key, Some(vs))).0.clone(),
        ),
        Op::UpdateVirtualServer(vs) => (
            IPVS_CMD_SET_SERVICE,
            Attrs::default().put(IPVS_CMD_ATTR_SERVICE, &service_attrs(&vs.key, Some(vs))).0.clone(),
        ),
        Op::DeleteVirtualServer(key) => {
            (IPVS_CMD_DEL_SERVICE, Attrs::default().put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None)).0.clone())
        }
        Op::AddRealServer(key, rs) => (
            IPVS_CMD_NEW_DEST,
            Attrs::default()
                .put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None))
                .put(IPVS_CMD_ATTR_DEST, &dest_attrs(rs, true))
                .0
                .clone(),
        ),
        Op::DeleteRealServer(key, rs) => (
            IPVS_CMD_DEL_DEST,
            Attrs::default()
                .put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None))
                .put(IPVS_CMD_ATTR_DEST, &dest_attrs(rs, false))
                .0
                .clone(),
        ),
    };
    let len = 16 + 4 + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, IPVS_GENL_VERSION, 0, 0]);
    m.extend_from_slice(&attrs);
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walk an attribute list into (type, payload) pairs.
    fn attrs(mut b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let kind = u16::from_ne_bytes([b[2], b[3]]);
            out.push((kind, b[4..len].to_vec()));
            let padded = (len + 3) & !3;
            b = &b[padded.min(b.len())..];
        }
        out
    }
    fn key() -> VsKey {
        VsKey { addr: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp }
    }

    #[test]
    fn new_service_message_layout() {
        let vs = VirtualServer { key: key(), scheduler: "rr".into(), persistence_timeout: Some(10800) };
        let m = encode(&Op::AddVirtualServer(vs), 0x1d, 7).unwrap();
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 0x1d);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(m[16], IPVS_CMD_NEW_SERVICE);
        assert_eq!(m[17], IPVS_GENL_VERSION);
        let top = attrs(&m[20..]);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].0, IPVS_CMD_ATTR_SERVICE);
        let svc = attrs(&top[0].1);
        let get = |k: u16| svc.iter().find(|(t, _)| *t == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(get(IPVS_SVC_ATTR_AF), 2u16.to_ne_bytes());
        assert_eq!(get(IPVS_SVC_ATTR_PROTOCOL), 6u16.to_ne_bytes());
        assert_eq!(&get(IPVS_SVC_ATTR_ADDR)[..4], &[10, 96, 0, 10]);
        assert_eq!(get(IPVS_SVC_ATTR_PORT), [0, 80], "port in network byte order");
        assert_eq!(get(IPVS_SVC_ATTR_SCHED_NAME), b"rr\0");
        assert_eq!(&get(IPVS_SVC_ATTR_FLAGS)[..4], &IP_VS_SVC_F_PERSISTENT.to_ne_bytes());
        assert_eq!(get(IPVS_SVC_ATTR_TIMEOUT), 10800u32.to_ne_bytes());
    }

    #[test]
    fn dest_messages_carry_service_identity_and_dest() {
        let rs = RealServer { addr: "10.244.1.2".parse().unwrap(), port: 8080, weight: 1 };
        let m = encode(&Op::AddRealServer(key(), rs.clone()), 30, 1).unwrap();
        assert_eq!(m[16], IPVS_CMD_NEW_DEST);
        let top = attrs(&m[20..]);
        assert_eq!(top.iter().map(|(t, _)| *t).collect::<Vec<_>>(), [IPVS_CMD_ATTR_SERVICE, IPVS_CMD_ATTR_DEST]);
        let svc = attrs(&top[0].1);
        assert_eq!(svc.len(), 4, "identity only: af, protocol, addr, port");
        let dest = attrs(&top[1].1);
        assert!(dest.contains(&(IPVS_DEST_ATTR_PORT, vec![0x1f, 0x90])));
        assert!(dest.contains(&(IPVS_DEST_ATTR_WEIGHT, 1u32.to_ne_bytes().to_vec())));
        let del = encode(&Op::DeleteRealServer(key(), rs), 30, 2).unwrap();
        assert_eq!(del[16], IPVS_CMD_DEL_DEST);
        assert_eq!(attrs(&attrs(&del[20..])[1].1).len(), 3, "addr, port, family");
        assert!(encode(&Op::BindAddress("10.96.0.10".parse().unwrap()), 30, 3).is_none());
        let d = encode(&Op::DeleteVirtualServer(key()), 30, 4).unwrap();
        assert_eq!(d[16], IPVS_CMD_DEL_SERVICE);
    }
}
