//! IPVS over generic netlink: the operations of [`crate::ipvs`] encoded as messages of the
//! kernel's `IPVS` family, the controller request that finds that family's id, and the dump
//! requests that read the virtual and real servers back — all pure functions over bytes —
//! plus [`Connection`], the thin shell that sends them and waits for the kernel's answers.
//!
//! Where the numbers come from: the kernel's IPVS user API header (`linux/ip_vs.h`) numbers
//! its commands and attributes as C enums that start at an unused 0 (`…_UNSPEC`), so each
//! value below is its position in that enum; the generic netlink controller's numbers come
//! from `linux/genetlink.h`, the netlink header flags and message types from
//! `linux/netlink.h`. ipvsadm's libipvs and the Go `ipvs` package that kube-proxy uses build
//! the same messages: a `genlmsghdr` (command, version 1), then one nested
//! `IPVS_CMD_ATTR_SERVICE` (and, for real servers, one nested `IPVS_CMD_ATTR_DEST`) holding
//! the attributes; addresses as a 16-byte `nf_inet_addr` (libipvs sends the whole union; an
//! IPv4 address fills its first 4 bytes), ports in network byte order, every other number in
//! host order. Address binding on `kube-ipvs0` is not this family's business (see
//! [`crate::ipvs_dummy`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use anyhow::{bail, Context};

use crate::ipvs::{Op, RealServer, VirtualServer, VsKey};
use crate::model::Protocol;

pub const IPVS_GENL_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION` in the uapi header.
pub const IPVS_GENL_VERSION: u8 = 1;

// enum IPVS_CMD_*: UNSPEC 0, NEW_SERVICE 1, SET_SERVICE 2, DEL_SERVICE 3, GET_SERVICE 4,
// NEW_DEST 5, SET_DEST 6, DEL_DEST 7, GET_DEST 8, …, FLUSH 17 (after NEW/DEL/GET_DAEMON 9–11,
// SET/GET_CONFIG 12–13, SET/GET_INFO 14–15, ZERO 16).
pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub const IPVS_CMD_SET_SERVICE: u8 = 2;
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
pub const IPVS_CMD_GET_SERVICE: u8 = 4;
pub const IPVS_CMD_NEW_DEST: u8 = 5;
pub const IPVS_CMD_DEL_DEST: u8 = 7;
pub const IPVS_CMD_GET_DEST: u8 = 8;
pub const IPVS_CMD_FLUSH: u8 = 17;

// enum IPVS_CMD_ATTR_*: UNSPEC 0, SERVICE 1, DEST 2 (then DAEMON, the timeouts).
pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub const IPVS_CMD_ATTR_DEST: u16 = 2;

// enum IPVS_SVC_ATTR_*: UNSPEC 0, AF 1, PROTOCOL 2, ADDR 3, PORT 4, FWMARK 5, SCHED_NAME 6,
// FLAGS 7, TIMEOUT 8, NETMASK 9 (then STATS, PE_NAME, STATS64).
pub const IPVS_SVC_ATTR_AF: u16 = 1;
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
pub const IPVS_SVC_ATTR_FWMARK: u16 = 5;
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;

// enum IPVS_DEST_ATTR_*: UNSPEC 0, ADDR 1, PORT 2, FWD_METHOD 3, WEIGHT 4, U_THRESH 5,
// L_THRESH 6, ACTIVECONNS 7, INACTCONNS 8, PERSISTCONNS 9, STATS 10, ADDR_FAMILY 11.
pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`, the first service flag bit.
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// Masquerading (NAT) forwarding: `IP_VS_CONN_F_MASQ` is 0 in the forwarding-method field.
pub const IP_VS_CONN_F_MASQ: u32 = 0;
/// The forwarding-method bits of a real server's connection flags (`IP_VS_CONN_F_FWD_MASK`).
pub const IP_VS_CONN_F_FWD_MASK: u32 = 0x7;

// linux/netlink.h
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_ROOT | NLM_F_MATCH`.
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
/// The type bits of an attribute header (without the nested / byte-order flags).
const NLA_TYPE_MASK: u16 = 0x3fff;
const AF_INET: u16 = 2;
/// `NETLINK_GENERIC`, the socket protocol of generic netlink.
pub const NETLINK_GENERIC: isize = 16;

// linux/genetlink.h: the controller is the fixed family 0x10 (the first id after the
// netlink control messages); its commands are UNSPEC 0, NEWFAMILY 1, DELFAMILY 2,
// GETFAMILY 3, and its attributes UNSPEC 0, FAMILY_ID 1, FAMILY_NAME 2, VERSION 3, …
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_NEWFAMILY: u8 = 1;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// The controller's version as libnl and the kernel's own tools send it.
const CTRL_VERSION: u8 = 1;

fn ipproto(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_of(n: u16) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
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
    fn addr(&mut self, kind: u16, ip: Ipv4Addr) -> &mut Self {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&ip.octets());
        self.put(kind, &a)
    }
    fn port(&mut self, kind: u16, port: u16) -> &mut Self {
        self.put(kind, &port.to_be_bytes())
    }
    fn string(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.put(kind, &v)
    }
}

/// One generic netlink message: `nlmsghdr`, `genlmsghdr`, the attributes.
fn genl_message(family: u16, flags: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let len = 16 + 4 + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, version, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

fn service_attrs(key: &VsKey, vs: Option<&VirtualServer>) -> Vec<u8> {
    let mut a = Attrs::default();
    a.u16(IPVS_SVC_ATTR_AF, AF_INET)
        .u16(IPVS_SVC_ATTR_PROTOCOL, ipproto(key.protocol))
        .addr(IPVS_SVC_ATTR_ADDR, key.addr)
        .port(IPVS_SVC_ATTR_PORT, key.port);
    if let Some(vs) = vs {
        a.string(IPVS_SVC_ATTR_SCHED_NAME, &vs.scheduler);
        // struct ip_vs_flags { flags, mask }: every bit given, so a change clears persistence too.
        let flags = if vs.persistence_timeout.is_some() { IP_VS_SVC_F_PERSISTENT } else { 0 };
        let mut f = Vec::new();
        f.extend_from_slice(&flags.to_ne_bytes());
        f.extend_from_slice(&u32::MAX.to_ne_bytes());
        a.put(IPVS_SVC_ATTR_FLAGS, &f);
        a.u32(IPVS_SVC_ATTR_TIMEOUT, vs.persistence_timeout.unwrap_or(0));
        // The persistence netmask: one client address per entry (a /32).
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
    let mut a = Attrs::default();
    let cmd = match op {
        Op::BindAddress(_) | Op::UnbindAddress(_) => return None,
        Op::AddVirtualServer(vs) => {
            a.put(IPVS_CMD_ATTR_SERVICE, &service_attrs(&vs.key, Some(vs)));
            IPVS_CMD_NEW_SERVICE
        }
        Op::UpdateVirtualServer(vs) => {
            a.put(IPVS_CMD_ATTR_SERVICE, &service_attrs(&vs.key, Some(vs)));
            IPVS_CMD_SET_SERVICE
        }
        Op::DeleteVirtualServer(key) => {
            a.put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None));
            IPVS_CMD_DEL_SERVICE
        }
        Op::AddRealServer(key, rs) => {
            a.put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None)).put(IPVS_CMD_ATTR_DEST, &dest_attrs(rs, true));
            IPVS_CMD_NEW_DEST
        }
        Op::DeleteRealServer(key, rs) => {
            a.put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None)).put(IPVS_CMD_ATTR_DEST, &dest_attrs(rs, false));
            IPVS_CMD_DEL_DEST
        }
    };
    Some(genl_message(family, NLM_F_REQUEST | NLM_F_ACK, seq, cmd, IPVS_GENL_VERSION, &a.0))
}

/// The controller request for a family's id by name (`CTRL_CMD_GETFAMILY`).
pub fn family_request(name: &str, seq: u32) -> Vec<u8> {
    let mut a = Attrs::default();
    a.string(CTRL_ATTR_FAMILY_NAME, name);
    genl_message(GENL_ID_CTRL, NLM_F_REQUEST, seq, CTRL_CMD_GETFAMILY, CTRL_VERSION, &a.0)
}

/// What the controller answered to [`family_request`] `seq`: the family's id, or the
/// error the kernel returned (a positive errno: `ENOENT` when no such family is registered
/// and no module provides it). None when `reply` holds no answer to that request.
pub fn decode_family(reply: &[u8], seq: u32) -> Option<Result<u16, i32>> {
    for m in messages(reply) {
        if m.seq != seq {
            continue;
        }
        if m.kind == NLMSG_ERROR {
            return Some(Err(error_code(m.payload).unwrap_or(libc::EPROTO)));
        }
        if m.kind == GENL_ID_CTRL && m.payload.len() >= 4 && m.payload[0] == CTRL_CMD_NEWFAMILY {
            let id = attrs(&m.payload[4..])
                .into_iter()
                .find(|(k, v)| *k == CTRL_ATTR_FAMILY_ID && v.len() >= 2)
                .map(|(_, v)| u16::from_ne_bytes([v[0], v[1]]));
            return Some(id.ok_or(libc::EPROTO));
        }
    }
    None
}

/// The request for every virtual server (`IPVS_CMD_GET_SERVICE`, a dump).
pub fn dump_services_request(family: u16, seq: u32) -> Vec<u8> {
    genl_message(family, NLM_F_REQUEST | NLM_F_DUMP, seq, IPVS_CMD_GET_SERVICE, IPVS_GENL_VERSION, &[])
}

/// The request for the real servers of one virtual server (`IPVS_CMD_GET_DEST`, a dump).
pub fn dump_dests_request(family: u16, seq: u32, key: &VsKey) -> Vec<u8> {
    let mut a = Attrs::default();
    a.put(IPVS_CMD_ATTR_SERVICE, &service_attrs(key, None));
    genl_message(family, NLM_F_REQUEST | NLM_F_DUMP, seq, IPVS_CMD_GET_DEST, IPVS_GENL_VERSION, &a.0)
}

/// The IPv4 virtual servers in the messages of a service dump (the kernel answers with
/// `IPVS_CMD_NEW_SERVICE` messages); firewall-mark and IPv6 ones are left out.
pub fn decode_services(reply: &[u8], family: u16) -> Vec<VirtualServer> {
    let mut out = Vec::new();
    for m in messages(reply) {
        if m.kind != family || m.payload.len() < 4 || m.payload[0] != IPVS_CMD_NEW_SERVICE {
            continue;
        }
        let Some((_, svc)) = attrs(&m.payload[4..]).into_iter().find(|(k, _)| *k == IPVS_CMD_ATTR_SERVICE) else {
            continue;
        };
        let a: BTreeMap<u16, &[u8]> = attrs(svc).into_iter().collect();
        let u16_of = |k| a.get(&k).filter(|v| v.len() >= 2).map(|v| u16::from_ne_bytes([v[0], v[1]]));
        let u32_of = |k| a.get(&k).filter(|v| v.len() >= 4).map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
        if u16_of(IPVS_SVC_ATTR_AF) != Some(AF_INET) || u32_of(IPVS_SVC_ATTR_FWMARK).is_some_and(|f| f != 0) {
            continue;
        }
        let (Some(protocol), Some(addr), Some(port)) = (
            u16_of(IPVS_SVC_ATTR_PROTOCOL).and_then(protocol_of),
            a.get(&IPVS_SVC_ATTR_ADDR).filter(|v| v.len() >= 4).map(|v| Ipv4Addr::new(v[0], v[1], v[2], v[3])),
            a.get(&IPVS_SVC_ATTR_PORT).filter(|v| v.len() >= 2).map(|v| u16::from_be_bytes([v[0], v[1]])),
        ) else {
            continue;
        };
        let scheduler = a
            .get(&IPVS_SVC_ATTR_SCHED_NAME)
            .map(|v| String::from_utf8_lossy(v.split(|b| *b == 0).next().unwrap_or_default()).into_owned())
            .unwrap_or_default();
        let persistent = u32_of(IPVS_SVC_ATTR_FLAGS).is_some_and(|f| f & IP_VS_SVC_F_PERSISTENT != 0);
        out.push(VirtualServer {
            key: VsKey { addr, port, protocol },
            scheduler,
            persistence_timeout: if persistent { u32_of(IPVS_SVC_ATTR_TIMEOUT) } else { None },
        });
    }
    out
}

/// The real servers in the messages of a destination dump (`IPVS_CMD_NEW_DEST` messages).
pub fn decode_dests(reply: &[u8], family: u16) -> Vec<RealServer> {
    let mut out = Vec::new();
    for m in messages(reply) {
        if m.kind != family || m.payload.len() < 4 || m.payload[0] != IPVS_CMD_NEW_DEST {
            continue;
        }
        let Some((_, dest)) = attrs(&m.payload[4..]).into_iter().find(|(k, _)| *k == IPVS_CMD_ATTR_DEST) else {
            continue;
        };
        let a: BTreeMap<u16, &[u8]> = attrs(dest).into_iter().collect();
        if a.get(&IPVS_DEST_ATTR_ADDR_FAMILY)
            .is_some_and(|v| v.len() >= 2 && u16::from_ne_bytes([v[0], v[1]]) != AF_INET)
        {
            continue;
        }
        let addr = a.get(&IPVS_DEST_ATTR_ADDR).filter(|v| v.len() >= 4).map(|v| Ipv4Addr::new(v[0], v[1], v[2], v[3]));
        let port = a.get(&IPVS_DEST_ATTR_PORT).filter(|v| v.len() >= 2).map(|v| u16::from_be_bytes([v[0], v[1]]));
        let weight = a
            .get(&IPVS_DEST_ATTR_WEIGHT)
            .filter(|v| v.len() >= 4)
            .map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
        if let (Some(addr), Some(port)) = (addr, port) {
            out.push(RealServer { addr, port, weight: weight.unwrap_or(0) });
        }
    }
    out
}

/// One netlink message of a buffer the kernel sent.
#[derive(Debug)]
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    /// Everything after the 16-byte `nlmsghdr`.
    pub payload: &'a [u8],
}

/// The messages of a buffer (a truncated last one is left out).
pub fn messages(buf: &[u8]) -> Vec<Message<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= buf.len() {
        let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
        if len < 16 || at + len > buf.len() {
            break;
        }
        out.push(Message {
            kind: u16::from_ne_bytes([buf[at + 4], buf[at + 5]]),
            flags: u16::from_ne_bytes([buf[at + 6], buf[at + 7]]),
            seq: u32::from_ne_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]),
            payload: &buf[at + 16..at + len],
        });
        at += (len + 3) & !3;
    }
    out
}

/// The error code of an `NLMSG_ERROR` payload as a positive errno (0 for an acknowledgement).
fn error_code(payload: &[u8]) -> Option<i32> {
    (payload.len() >= 4).then(|| -i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]))
}

/// The sequence number of the request an `NLMSG_ERROR` payload answers (its copied header).
fn error_seq(payload: &[u8]) -> Option<u32> {
    (payload.len() >= 20).then(|| u32::from_ne_bytes([payload[12], payload[13], payload[14], payload[15]]))
}

/// An attribute list as (type, payload) pairs.
pub fn attrs(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        if len < 4 || len > b.len() {
            break;
        }
        out.push((u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK, &b[4..len]));
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    out
}

/// A generic netlink socket with the `IPVS` family's id resolved: sends operations and
/// waits for each one's acknowledgement, reads the virtual servers back.
pub struct Connection {
    socket: netlink_sys::Socket,
    family: u16,
    seq: u32,
}

/// How many operations go out in one `sendmsg` before their acknowledgements are read
/// (their acknowledgements must fit in the receive buffer).
const CHUNK: usize = 512;

fn open_socket() -> anyhow::Result<netlink_sys::Socket> {
    let mut socket = netlink_sys::Socket::new(NETLINK_GENERIC).context("netlink socket (NETLINK_GENERIC)")?;
    socket.bind_auto().context("binding the generic netlink socket")?;
    let _ = socket.set_cap_ack(true);
    let _ = socket.set_rx_buf_sz(4 << 20);
    crate::nft_netlink::set_receive_timeout(&socket, std::time::Duration::from_secs(5))?;
    Ok(socket)
}

fn recv(socket: &netlink_sys::Socket) -> anyhow::Result<Vec<u8>> {
    let (reply, _) = socket.recv_from_full().context("waiting for the kernel's answer")?;
    Ok(reply)
}

/// Ask the generic netlink controller for family `name`'s id on `socket`: None when the
/// kernel knows no such family (ENOENT).
fn resolve_on(socket: &netlink_sys::Socket, name: &str, seq: u32) -> anyhow::Result<Option<u16>> {
    let req = family_request(name, seq);
    socket.send_to(&req, &netlink_sys::SocketAddr::new(0, 0), 0).context("sending CTRL_CMD_GETFAMILY")?;
    loop {
        let reply = recv(socket)?;
        match decode_family(&reply, seq) {
            None => continue,
            Some(Ok(id)) => return Ok(Some(id)),
            Some(Err(libc::ENOENT)) => return Ok(None),
            Some(Err(e)) => {
                bail!("the generic netlink controller refused {name}: {}", std::io::Error::from_raw_os_error(e))
            }
        }
    }
}

/// Family `name`'s id from the running kernel, on a socket of its own (None: ENOENT).
pub fn resolve_family(name: &str) -> anyhow::Result<Option<u16>> {
    resolve_on(&open_socket()?, name, 1)
}

impl Connection {
    /// A socket with the `IPVS` family resolved; fails when the kernel has no IPVS.
    pub fn open() -> anyhow::Result<Connection> {
        let socket = open_socket()?;
        let Some(family) = resolve_on(&socket, IPVS_GENL_NAME, 1)? else {
            bail!("the kernel has no {IPVS_GENL_NAME} generic netlink family (is the ip_vs module loaded?)");
        };
        Ok(Connection { socket, family, seq: 2 })
    }

    /// A socket that sends to a family id already known, without resolving `IPVS` (the
    /// integration test drives the send and acknowledgement path against the controller
    /// family on kernels without IPVS).
    pub fn with_family(family: u16) -> anyhow::Result<Connection> {
        Ok(Connection { socket: open_socket()?, family, seq: 1 })
    }

    pub fn family(&self) -> u16 {
        self.family
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// Send `ops` (address ops are skipped) and wait for every acknowledgement. The kernel
    /// applies each message on its own, so after a refusal the ones before it stay done;
    /// the error names the first refused operation and its errno, and how many more failed.
    pub fn apply(&mut self, ops: &[Op]) -> anyhow::Result<usize> {
        let ops: Vec<&Op> = ops.iter().filter(|o| !matches!(o, Op::BindAddress(_) | Op::UnbindAddress(_))).collect();
        let mut failures: Vec<(usize, i32)> = Vec::new();
        for (c, chunk) in ops.chunks(CHUNK).enumerate() {
            let base = self.seq.wrapping_add(1);
            let mut batch = Vec::new();
            for op in chunk {
                let seq = self.next_seq();
                let message = encode(op, self.family, seq)
                    .ok_or_else(|| anyhow::anyhow!("no IPVS message for {}", crate::ipvs::describe(op)))?;
                batch.extend(message);
            }
            let sent = self
                .socket
                .send_to(&batch, &netlink_sys::SocketAddr::new(0, 0), 0)
                .context("sending IPVS operations")?;
            anyhow::ensure!(sent == batch.len(), "sent {sent} of {} bytes of IPVS operations", batch.len());
            let mut acked = 0;
            while acked < chunk.len() {
                for m in messages(&recv(&self.socket)?) {
                    let (Some(code), Some(seq)) = (error_code(m.payload), error_seq(m.payload)) else { continue };
                    if m.kind != NLMSG_ERROR || seq.wrapping_sub(base) as usize >= chunk.len() {
                        continue;
                    }
                    acked += 1;
                    if code != 0 {
                        failures.push((c * CHUNK + seq.wrapping_sub(base) as usize, code));
                    }
                }
            }
        }
        if let Some((i, code)) = failures.first() {
            let more = match failures.len() - 1 {
                0 => String::new(),
                n => format!(" ({n} more refused)"),
            };
            bail!(
                "the kernel refused IPVS operation {} of {} ({}): {}{more}",
                i + 1,
                ops.len(),
                crate::ipvs::describe(ops[*i]),
                std::io::Error::from_raw_os_error(*code)
            );
        }
        Ok(ops.len())
    }

    /// Send one dump request and collect its answer up to `NLMSG_DONE`.
    fn dump(&mut self, request: Vec<u8>, seq: u32) -> anyhow::Result<Vec<u8>> {
        self.socket
            .send_to(&request, &netlink_sys::SocketAddr::new(0, 0), 0)
            .context("sending an IPVS dump request")?;
        let mut all = Vec::new();
        loop {
            let reply = recv(&self.socket)?;
            let mut done = false;
            for m in messages(&reply) {
                if m.seq != seq {
                    continue;
                }
                if m.kind == NLMSG_ERROR {
                    let code = error_code(m.payload).unwrap_or(libc::EPROTO);
                    if code != 0 {
                        bail!("IPVS dump refused: {}", std::io::Error::from_raw_os_error(code));
                    }
                    done = true;
                }
                done |= m.kind == NLMSG_DONE;
            }
            all.extend_from_slice(&reply);
            if done {
                return Ok(all);
            }
        }
    }

    /// The kernel's IPv4 virtual servers with their real servers, those `keep` accepts.
    pub fn read(
        &mut self,
        keep: impl Fn(&VsKey) -> bool,
    ) -> anyhow::Result<BTreeMap<VsKey, (VirtualServer, BTreeSet<RealServer>)>> {
        let seq = self.next_seq();
        let reply = self.dump(dump_services_request(self.family, seq), seq)?;
        let mut out = BTreeMap::new();
        for vs in decode_services(&reply, self.family) {
            if !keep(&vs.key) {
                continue;
            }
            let seq = self.next_seq();
            let reply = self.dump(dump_dests_request(self.family, seq, &vs.key), seq)?;
            let reals = decode_dests(&reply, self.family).into_iter().collect();
            out.insert(vs.key.clone(), (vs, reals));
        }
        Ok(out)
    }

    /// Remove every virtual server (`IPVS_CMD_FLUSH`, as `ipvsadm -C`).
    pub fn flush(&mut self) -> anyhow::Result<()> {
        let seq = self.next_seq();
        let m = genl_message(self.family, NLM_F_REQUEST | NLM_F_ACK, seq, IPVS_CMD_FLUSH, IPVS_GENL_VERSION, &[]);
        self.socket.send_to(&m, &netlink_sys::SocketAddr::new(0, 0), 0).context("sending IPVS_CMD_FLUSH")?;
        loop {
            for m in messages(&recv(&self.socket)?) {
                if m.kind == NLMSG_ERROR && error_seq(m.payload) == Some(seq) {
                    return match error_code(m.payload) {
                        Some(0) => Ok(()),
                        code => bail!(
                            "IPVS flush refused: {}",
                            std::io::Error::from_raw_os_error(code.unwrap_or(libc::EPROTO))
                        ),
                    };
                }
            }
        }
    }
}

/// Whether the kernel has IPVS: its generic netlink family `IPVS` resolves (the kernel loads
/// `ip_vs` on that request where the module exists; `modprobe ip_vs` is tried as well).
/// Returns the family id; where the family is missing, fails with a message naming the
/// module and the other proxy modes.
pub fn check_kernel() -> anyhow::Result<u16> {
    if let Some(id) = resolve_family(IPVS_GENL_NAME)? {
        return Ok(id);
    }
    let modprobe = std::process::Command::new("modprobe").arg("ip_vs").output();
    if let Some(id) = resolve_family(IPVS_GENL_NAME)? {
        return Ok(id);
    }
    let detail = match modprobe {
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => format!("could not run modprobe: {e}"),
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    anyhow::bail!(
        "can't use the IPVS proxier (virtual servers on {}): the kernel module ip_vs is not available on kernel {}: the generic netlink family {IPVS_GENL_NAME} does not exist ({}) (modprobe ip_vs: {}); use --proxy-mode=nftables or --proxy-mode=iptables",
        crate::ipvs::DUMMY_DEVICE,
        release.trim(),
        std::io::Error::from_raw_os_error(libc::ENOENT),
        if detail.is_empty() { "no output" } else { &detail }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_check_reports_clearly() {
        // The real probe: any user may ask the generic netlink controller.
        match check_kernel() {
            Ok(id) => assert!(id >= 0x10, "a generic netlink family id: {id}"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("ip_vs") && e.contains("--proxy-mode=nftables") && e.contains("iptables"), "{e}");
            }
        }
    }

    fn key() -> VsKey {
        VsKey { addr: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp }
    }
    fn owned(b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        attrs(b).into_iter().map(|(k, v)| (k, v.to_vec())).collect()
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
        let top = owned(&m[20..]);
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].0, IPVS_CMD_ATTR_SERVICE);
        let svc = owned(&top[0].1);
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
        let top = owned(&m[20..]);
        assert_eq!(top.iter().map(|(t, _)| *t).collect::<Vec<_>>(), [IPVS_CMD_ATTR_SERVICE, IPVS_CMD_ATTR_DEST]);
        let svc = owned(&top[0].1);
        assert_eq!(svc.len(), 4, "identity only: af, protocol, addr, port");
        let dest = owned(&top[1].1);
        assert!(dest.contains(&(IPVS_DEST_ATTR_PORT, vec![0x1f, 0x90])));
        assert!(dest.contains(&(IPVS_DEST_ATTR_WEIGHT, 1u32.to_ne_bytes().to_vec())));
        let del = encode(&Op::DeleteRealServer(key(), rs), 30, 2).unwrap();
        assert_eq!(del[16], IPVS_CMD_DEL_DEST);
        assert_eq!(owned(&owned(&del[20..])[1].1).len(), 3, "addr, port, family");
        assert!(encode(&Op::BindAddress("10.96.0.10".parse().unwrap()), 30, 3).is_none());
        let d = encode(&Op::DeleteVirtualServer(key()), 30, 4).unwrap();
        assert_eq!(d[16], IPVS_CMD_DEL_SERVICE);
    }

    // The byte-exact tests below spell every number out as the uapi header and the netlink
    // wire format define it, on a little-endian machine (x86-64, arm64): an attribute is
    // `u16 length (header included), u16 type`, then its payload padded to 4 bytes.

    /// The identity of TCP 10.96.0.10:80 inside IPVS_CMD_ATTR_SERVICE, as libipvs and the Go
    /// package put it: AF_INET, IPPROTO_TCP, the 16-byte address, the port big-endian.
    #[cfg(target_endian = "little")]
    const SERVICE_IDENTITY: [u8; 44] = [
        6, 0, 1, 0, 2, 0, 0, 0, // IPVS_SVC_ATTR_AF (1) = AF_INET (2), padded
        6, 0, 2, 0, 6, 0, 0, 0, // IPVS_SVC_ATTR_PROTOCOL (2) = IPPROTO_TCP (6)
        20, 0, 3, 0, 10, 96, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // IPVS_SVC_ATTR_ADDR (3)
        6, 0, 4, 0, 0, 80, 0, 0, // IPVS_SVC_ATTR_PORT (4) = htons(80)
    ];

    #[cfg(target_endian = "little")]
    fn header(len: u16, family: u16, flags: u16, seq: u8, cmd: u8) -> Vec<u8> {
        let mut h =
            vec![len as u8, (len >> 8) as u8, 0, 0, family as u8, (family >> 8) as u8, flags as u8, (flags >> 8) as u8];
        h.extend([seq, 0, 0, 0, 0, 0, 0, 0]); // seq, port id 0 (the kernel)
        h.extend([cmd, 1, 0, 0]); // genlmsghdr: command, version 1, reserved
        h
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn new_service_bytes_as_the_uapi_defines_them() {
        let vs = VirtualServer { key: key(), scheduler: "rr".into(), persistence_timeout: Some(10800) };
        let mut want = header(104, 0x1d, 0x0005, 7, 1); // NLM_F_REQUEST|NLM_F_ACK, IPVS_CMD_NEW_SERVICE = 1
        want.extend([84, 0, 1, 0]); // IPVS_CMD_ATTR_SERVICE (1), nested
        want.extend(SERVICE_IDENTITY);
        want.extend([7, 0, 6, 0, b'r', b'r', 0, 0]); // IPVS_SVC_ATTR_SCHED_NAME (6) = "rr\0"
        want.extend([12, 0, 7, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]); // FLAGS (7): PERSISTENT, mask all
        want.extend([8, 0, 8, 0, 0x30, 0x2a, 0, 0]); // TIMEOUT (8) = 10800 s
        want.extend([8, 0, 9, 0, 0xff, 0xff, 0xff, 0xff]); // NETMASK (9) = /32
        assert_eq!(encode(&Op::AddVirtualServer(vs), 0x1d, 7).unwrap(), want);

        let mut del = header(68, 0x1d, 0x0005, 8, 3); // IPVS_CMD_DEL_SERVICE = 3
        del.extend([48, 0, 1, 0]);
        del.extend(SERVICE_IDENTITY);
        assert_eq!(encode(&Op::DeleteVirtualServer(key()), 0x1d, 8).unwrap(), del);
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn new_and_del_dest_bytes_as_the_uapi_defines_them() {
        let rs = RealServer { addr: "10.244.1.2".parse().unwrap(), port: 8080, weight: 1 };
        let dest_identity = [
            20, 0, 1, 0, 10, 244, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // IPVS_DEST_ATTR_ADDR (1)
            6, 0, 2, 0, 0x1f, 0x90, 0, 0, // IPVS_DEST_ATTR_PORT (2) = htons(8080)
            6, 0, 11, 0, 2, 0, 0, 0, // IPVS_DEST_ATTR_ADDR_FAMILY (11) = AF_INET
        ];
        let mut want = header(140, 30, 0x0005, 1, 5); // IPVS_CMD_NEW_DEST = 5
        want.extend([48, 0, 1, 0]);
        want.extend(SERVICE_IDENTITY);
        want.extend([72, 0, 2, 0]); // IPVS_CMD_ATTR_DEST (2), nested
        want.extend(dest_identity);
        want.extend([8, 0, 3, 0, 0, 0, 0, 0]); // FWD_METHOD (3) = IP_VS_CONN_F_MASQ (0)
        want.extend([8, 0, 4, 0, 1, 0, 0, 0]); // WEIGHT (4) = 1
        want.extend([8, 0, 5, 0, 0, 0, 0, 0]); // U_THRESH (5) = 0: no limit
        want.extend([8, 0, 6, 0, 0, 0, 0, 0]); // L_THRESH (6) = 0
        assert_eq!(encode(&Op::AddRealServer(key(), rs.clone()), 30, 1).unwrap(), want);

        let mut del = header(108, 30, 0x0005, 2, 7); // IPVS_CMD_DEL_DEST = 7: identity only
        del.extend([48, 0, 1, 0]);
        del.extend(SERVICE_IDENTITY);
        del.extend([40, 0, 2, 0]);
        del.extend(dest_identity);
        assert_eq!(encode(&Op::DeleteRealServer(key(), rs), 30, 2).unwrap(), del);
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn family_request_and_answers() {
        // nlmsghdr to the controller (0x10), NLM_F_REQUEST; CTRL_CMD_GETFAMILY (3);
        // CTRL_ATTR_FAMILY_NAME (2) = "IPVS\0", 9 bytes padded to 12.
        let mut want = header(32, 0x10, 0x0001, 5, 3);
        want.extend([9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0]);
        assert_eq!(family_request("IPVS", 5), want);

        // The controller's answer: CTRL_CMD_NEWFAMILY (1) with FAMILY_ID (1) = 0x23 among others.
        let mut answer = header(44, 0x10, 0, 5, 1);
        answer.extend([9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0]);
        answer.extend([6, 0, 1, 0, 0x23, 0, 0, 0]);
        answer.extend([8, 0, 3, 0, 1, 0, 0, 0]); // CTRL_ATTR_VERSION
        assert_eq!(decode_family(&answer, 5), Some(Ok(0x23)));
        assert_eq!(decode_family(&answer, 6), None, "another request's answer");

        // No such family: NLMSG_ERROR (2) carrying -ENOENT and the request's header.
        let mut refusal = vec![36, 0, 0, 0, 2, 0, 0, 1, 5, 0, 0, 0, 0, 0, 0, 0];
        refusal.extend((-libc::ENOENT).to_ne_bytes());
        refusal.extend(&family_request("IPVS", 5)[..16]);
        assert_eq!(decode_family(&refusal, 5), Some(Err(libc::ENOENT)));
    }

    /// A message as the kernel sends it in a dump: `cmd` and a nested attribute (with the
    /// NLA_F_NESTED bit, as newer kernels set it) holding `inner`.
    fn kernel_message(family: u16, cmd: u8, kind: u16, inner: &[u8]) -> Vec<u8> {
        let mut a = Attrs::default();
        a.put(kind | 0x8000, inner);
        genl_message(family, NLM_F_MULTI, 9, cmd, 1, &a.0)
    }

    #[test]
    fn dumps_are_requested_and_read_back() {
        let req = dump_services_request(0x23, 9);
        assert_eq!(u16::from_ne_bytes([req[6], req[7]]), NLM_F_REQUEST | NLM_F_DUMP);
        assert_eq!((req[16], req.len()), (IPVS_CMD_GET_SERVICE, 20));
        let dreq = dump_dests_request(0x23, 9, &key());
        assert_eq!(dreq[16], IPVS_CMD_GET_DEST);
        assert_eq!(owned(&owned(&dreq[20..])[0].1).len(), 4);

        let vs = VirtualServer { key: key(), scheduler: "rr".into(), persistence_timeout: Some(10800) };
        let plain = VirtualServer {
            key: VsKey { addr: "10.96.0.11".parse().unwrap(), port: 53, protocol: Protocol::Udp },
            scheduler: "lc".into(),
            persistence_timeout: None,
        };
        let mut reply = Vec::new();
        for v in [&vs, &plain] {
            let mut inner = Attrs(service_attrs(&v.key, Some(v)));
            // Statistics the kernel adds (IPVS_SVC_ATTR_STATS = 10, nested): ignored.
            inner.put(10 | 0x8000, &[0; 4]);
            let inner = inner.0;
            reply.extend(kernel_message(0x23, IPVS_CMD_NEW_SERVICE, IPVS_CMD_ATTR_SERVICE, &inner));
        }
        // A firewall-mark service: not ours.
        let mut fwm = Attrs::default();
        fwm.u16(IPVS_SVC_ATTR_AF, AF_INET).u32(IPVS_SVC_ATTR_FWMARK, 7);
        reply.extend(kernel_message(0x23, IPVS_CMD_NEW_SERVICE, IPVS_CMD_ATTR_SERVICE, &fwm.0));
        reply.extend(genl_message(NLMSG_DONE, NLM_F_MULTI, 9, 0, 0, &[]));
        assert_eq!(decode_services(&reply, 0x23), [vs, plain]);

        let rs = RealServer { addr: "10.244.1.2".parse().unwrap(), port: 8080, weight: 1 };
        let mut inner = dest_attrs(&rs, true);
        inner.extend([8, 0, 7, 0, 3, 0, 0, 0]); // ACTIVECONNS
        let reply = kernel_message(0x23, IPVS_CMD_NEW_DEST, IPVS_CMD_ATTR_DEST, &inner);
        assert_eq!(decode_dests(&reply, 0x23), [rs]);
    }
}
