//! The changes of an nftables sync sent straight to the kernel as one `nf_tables` netlink
//! transaction (a batch: `NFNL_MSG_BATCH_BEGIN`, the messages, `NFNL_MSG_BATCH_END`, applied
//! atomically), without `nft`: `nft` lists every chain of every table before each
//! transaction, which at 10,000 Services costs more than the change itself.
//!
//! [`encode`] is pure: the bytes a netlink socket sends, or None when an operation is not
//! one of the forms encoded here (then the caller writes the transaction with `nft -f`).
//! Encoded: chains added, flushed and deleted; map and set elements (keys of IPv4
//! addresses, protocols and ports, verdicts `goto`/`jump`/`drop`); and the rules an endpoint
//! change rewrites ([`Rule::MarkForMasquerade`], [`Rule::Dnat`], [`Rule::Verdict`]) as the
//! expressions `nft` itself generates for them (`nft --debug=netlink` shows them), so that
//! `nft list table` prints them back in the same words. Constants are the kernel's
//! (`include/uapi/linux/netfilter/nf_tables.h`, `nfnetlink.h`, `netlink.h`).
//! [`Connection`] is the thin shell: one `sendmsg`, then one acknowledgement per message, on
//! a socket kept open between syncs.

use std::net::Ipv4Addr;

use anyhow::{bail, Context};

use crate::model::{Cidr, Protocol};
use crate::nftables::{Op, Rule, Verdict, TABLE};

const NETLINK_NETFILTER: isize = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFPROTO_IPV4: u8 = 2;
const NLMSG_ERROR: u16 = 2;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;

// enum nf_tables_msg_types
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_NG_DREG: u16 = 1;
const NFTA_NG_MODULUS: u16 = 2;
const NFTA_NG_TYPE: u16 = 3;
const NFTA_NG_OFFSET: u16 = 4;
const NFT_NG_RANDOM: u32 = 1;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFTA_NAT_FLAGS: u16 = 7;
const NFT_NAT_DNAT: u32 = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NF_DROP: i32 = 0;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;

/// Netlink attributes being written into a buffer (type-length-value, 4-byte aligned).
struct Attrs<'a>(&'a mut Vec<u8>);

impl Attrs<'_> {
    fn bytes(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(value);
        pad(self.0);
    }
    fn str(&mut self, kind: u16, s: &str) {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.bytes(kind, &v);
    }
    fn be32(&mut self, kind: u16, v: u32) {
        self.bytes(kind, &v.to_be_bytes());
    }
    fn nested(&mut self, kind: u16, f: impl FnOnce(&mut Attrs)) {
        let start = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        f(&mut Attrs(self.0));
        let len = (self.0.len() - start) as u16;
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }
    /// `NFTA_DATA_VALUE` nested in `kind`.
    fn data(&mut self, kind: u16, value: &[u8]) {
        self.nested(kind, |a| a.bytes(NFTA_DATA_VALUE, value));
    }
    fn verdict(&mut self, kind: u16, code: i32, chain: Option<&str>) {
        self.nested(kind, |a| {
            a.nested(NFTA_DATA_VERDICT, |a| {
                a.be32(NFTA_VERDICT_CODE, code as u32);
                if let Some(c) = chain {
                    a.str(NFTA_VERDICT_CHAIN, c);
                }
            })
        });
    }
    /// One expression of a rule's list.
    fn expr(&mut self, name: &str, f: impl FnOnce(&mut Attrs)) {
        self.nested(NFTA_LIST_ELEM, |a| {
            a.str(NFTA_EXPR_NAME, name);
            a.nested(NFTA_EXPR_DATA, f);
        });
    }
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// A netlink message: header, `nfgenmsg`, attributes.
fn message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16, f: impl FnOnce(&mut Attrs)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]); // length, below
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    buf.push(family);
    buf.push(0); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    f(&mut Attrs(buf));
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// A set element's key as the kernel stores it: each field of a concatenation padded to
/// 4 bytes (`10.96.0.10 . tcp . 80`, `tcp . 30080`, `10.244.1.1 . 10.244.1.1`).
fn key_bytes(key: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for field in key.split(" . ") {
        if let Ok(ip) = field.parse::<Ipv4Addr>() {
            out.extend_from_slice(&ip.octets());
        } else if let Some(p) = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp].into_iter().find(|p| p.lower() == field)
        {
            out.extend_from_slice(&[protocol_number(p), 0, 0, 0]);
        } else {
            let port: u16 = field.parse().ok()?;
            out.extend_from_slice(&port.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
        }
    }
    Some(out)
}

/// A map element's verdict: `goto C`, `jump C` or `drop`.
fn verdict_code(v: &str) -> Option<(i32, Option<&str>)> {
    match v.split_once(' ') {
        None if v == "drop" => Some((NF_DROP, None)),
        Some(("goto", c)) => Some((NFT_GOTO, Some(c))),
        Some(("jump", c)) => Some((NFT_JUMP, Some(c))),
        _ => None,
    }
}

fn payload(a: &mut Attrs, base: u32, offset: u32, len: u32) {
    a.expr("payload", |a| {
        a.be32(NFTA_PAYLOAD_DREG, NFT_REG_1);
        a.be32(NFTA_PAYLOAD_BASE, base);
        a.be32(NFTA_PAYLOAD_OFFSET, offset);
        a.be32(NFTA_PAYLOAD_LEN, len);
    });
}

fn cmp(a: &mut Attrs, op: u32, value: &[u8]) {
    a.expr("cmp", |a| {
        a.be32(NFTA_CMP_SREG, NFT_REG_1);
        a.be32(NFTA_CMP_OP, op);
        a.data(NFTA_CMP_DATA, value);
    });
}

fn l4proto_is(a: &mut Attrs, p: Protocol) {
    a.expr("meta", |a| {
        a.be32(NFTA_META_DREG, NFT_REG_1);
        a.be32(NFTA_META_KEY, NFT_META_L4PROTO);
    });
    cmp(a, NFT_CMP_EQ, &[protocol_number(p)]);
}

/// `numgen random mod n 0`: true with probability 1/n.
fn one_in(a: &mut Attrs, n: u32) {
    a.expr("numgen", |a| {
        a.be32(NFTA_NG_DREG, NFT_REG_1);
        a.be32(NFTA_NG_MODULUS, n);
        a.be32(NFTA_NG_TYPE, NFT_NG_RANDOM);
        a.be32(NFTA_NG_OFFSET, 0);
    });
    cmp(a, NFT_CMP_EQ, &0u32.to_ne_bytes());
}

fn verdict_expr(a: &mut Attrs, v: &Verdict) {
    let (code, chain) = match v {
        Verdict::Jump(c) => (NFT_JUMP, c),
        Verdict::Goto(c) => (NFT_GOTO, c),
    };
    a.expr("immediate", |a| {
        a.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
        a.verdict(NFTA_IMMEDIATE_DATA, code, Some(chain));
    });
}

/// `ip saddr != CIDR`, as nft compiles it: whole bytes of the prefix compared, or the
/// address masked first when the prefix is not a multiple of 8.
fn saddr_not_in(a: &mut Attrs, cidr: &Cidr) {
    let net = cidr.network.octets();
    if cidr.prefix.is_multiple_of(8) {
        let n = usize::from(cidr.prefix / 8);
        payload(a, NFT_PAYLOAD_NETWORK_HEADER, 12, n as u32);
        cmp(a, NFT_CMP_NEQ, &net[..n]);
    } else {
        let mask = (u32::MAX << (32 - u32::from(cidr.prefix))).to_be_bytes();
        payload(a, NFT_PAYLOAD_NETWORK_HEADER, 12, 4);
        a.expr("bitwise", |a| {
            a.be32(NFTA_BITWISE_SREG, NFT_REG_1);
            a.be32(NFTA_BITWISE_DREG, NFT_REG_1);
            a.be32(NFTA_BITWISE_LEN, 4);
            a.data(NFTA_BITWISE_MASK, &mask);
            a.data(NFTA_BITWISE_XOR, &[0; 4]);
        });
        let masked: Vec<u8> = net.iter().zip(mask).map(|(n, m)| n & m).collect();
        cmp(a, NFT_CMP_NEQ, &masked);
    }
}

/// A rule's expressions; None for [`Rule::Text`] (and a prefix nft would not write so).
fn rule_exprs(a: &mut Attrs, rule: &Rule) -> Option<()> {
    match rule {
        Rule::MarkForMasquerade { daddr, protocol, dport, unless_from } => {
            if unless_from.is_some_and(|c| c.prefix == 0 || c.prefix > 32) {
                return None;
            }
            payload(a, NFT_PAYLOAD_NETWORK_HEADER, 16, 4);
            cmp(a, NFT_CMP_EQ, &daddr.octets());
            l4proto_is(a, *protocol);
            payload(a, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
            cmp(a, NFT_CMP_EQ, &dport.to_be_bytes());
            if let Some(cidr) = unless_from {
                saddr_not_in(a, cidr);
            }
            verdict_expr(a, &Verdict::Jump("mark-for-masquerade".into()));
        }
        Rule::Dnat { one_in: n, protocol, ip, port } => {
            if let Some(n) = n {
                one_in(a, *n);
            }
            l4proto_is(a, *protocol);
            a.expr("immediate", |a| {
                a.be32(NFTA_IMMEDIATE_DREG, NFT_REG_1);
                a.data(NFTA_IMMEDIATE_DATA, &ip.octets());
            });
            a.expr("immediate", |a| {
                a.be32(NFTA_IMMEDIATE_DREG, NFT_REG_2);
                a.data(NFTA_IMMEDIATE_DATA, &port.to_be_bytes());
            });
            a.expr("nat", |a| {
                a.be32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
                a.be32(NFTA_NAT_FAMILY, u32::from(NFPROTO_IPV4));
                a.be32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
                a.be32(NFTA_NAT_REG_PROTO_MIN, NFT_REG_2);
                a.be32(NFTA_NAT_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
            });
        }
        Rule::Verdict { one_in: n, verdict } => {
            if let Some(n) = n {
                one_in(a, *n);
            }
            verdict_expr(a, verdict);
        }
        Rule::Text(_) => return None,
    }
    Some(())
}

/// The batch for `ops`, numbered from sequence 1; None if one of them is not encoded here.
pub fn encode(ops: &[Op]) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(256 * ops.len() + 64);
    message(&mut buf, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, 0, NFNL_SUBSYS_NFTABLES, |_| {});
    for (i, op) in ops.iter().enumerate() {
        let seq = i as u32 + 1;
        let kind = |msg: u16| (NFNL_SUBSYS_NFTABLES << 8) | msg;
        let flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut ok = Some(());
        match op {
            Op::AddChain(c) | Op::DeleteChain(c) => {
                let (msg, extra) = if matches!(op, Op::AddChain(_)) {
                    (NFT_MSG_NEWCHAIN, NLM_F_CREATE)
                } else {
                    (NFT_MSG_DELCHAIN, 0)
                };
                message(&mut buf, kind(msg), flags | extra, seq, NFPROTO_IPV4, 0, |a| {
                    a.str(NFTA_CHAIN_TABLE, TABLE);
                    a.str(NFTA_CHAIN_NAME, c);
                });
            }
            Op::FlushChain(c) => {
                // A rule deletion naming no rule deletes every rule of the chain.
                message(&mut buf, kind(NFT_MSG_DELRULE), flags, seq, NFPROTO_IPV4, 0, |a| {
                    a.str(NFTA_RULE_TABLE, TABLE);
                    a.str(NFTA_RULE_CHAIN, c);
                });
            }
            Op::AddRule { chain, rule } => {
                let flags = flags | NLM_F_CREATE | NLM_F_APPEND;
                message(&mut buf, kind(NFT_MSG_NEWRULE), flags, seq, NFPROTO_IPV4, 0, |a| {
                    a.str(NFTA_RULE_TABLE, TABLE);
                    a.str(NFTA_RULE_CHAIN, chain);
                    a.nested(NFTA_RULE_EXPRESSIONS, |a| ok = rule_exprs(a, rule));
                });
            }
            Op::AddElement { set, key, verdict } => {
                let verdict = match verdict {
                    Some(v) => Some(verdict_code(v)?),
                    None => None,
                };
                element(&mut buf, NFT_MSG_NEWSETELEM, flags | NLM_F_CREATE, seq, set, &key_bytes(key)?, verdict);
            }
            Op::DeleteElement { set, key } => {
                element(&mut buf, NFT_MSG_DELSETELEM, flags, seq, set, &key_bytes(key)?, None);
            }
            // Affinity sets are rare: nft writes them.
            Op::AddSet { .. } | Op::DeleteSet(_) => return None,
        }
        ok?;
    }
    message(&mut buf, NFNL_MSG_BATCH_END, NLM_F_REQUEST, ops.len() as u32 + 1, 0, NFNL_SUBSYS_NFTABLES, |_| {});
    Some(buf)
}

/// A message adding or deleting one element of a set or map.
fn element(
    buf: &mut Vec<u8>,
    msg: u16,
    flags: u16,
    seq: u32,
    set: &str,
    key: &[u8],
    verdict: Option<(i32, Option<&str>)>,
) {
    message(buf, (NFNL_SUBSYS_NFTABLES << 8) | msg, flags, seq, NFPROTO_IPV4, 0, |a| {
        a.str(NFTA_SET_ELEM_LIST_TABLE, TABLE);
        a.str(NFTA_SET_ELEM_LIST_SET, set);
        a.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |a| {
            a.nested(NFTA_LIST_ELEM, |a| {
                a.data(NFTA_SET_ELEM_KEY, key);
                if let Some((code, chain)) = verdict {
                    a.verdict(NFTA_SET_ELEM_DATA, code, chain);
                }
            })
        });
    });
}

/// A native-endian field of a netlink header (the caller checked the bounds).
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

/// The number of messages in a batch that expect an acknowledgement.
fn acked_messages(batch: &[u8]) -> usize {
    let mut n = 0;
    let mut at = 0;
    while at + 16 <= batch.len() {
        let len = u32_at(batch, at) as usize;
        let flags = u16_at(batch, at + 6);
        if flags & NLM_F_ACK != 0 {
            n += 1;
        }
        if len < 16 {
            break;
        }
        at += len;
    }
    n
}

/// A netlink socket to `nf_tables`, kept open between transactions: closing one makes the
/// kernel wait for the previous transactions' cleanup (an RCU grace period, 10–16 ms here).
pub struct Connection {
    socket: netlink_sys::Socket,
}

impl Connection {
    pub fn open() -> anyhow::Result<Connection> {
        let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER).context("netlink socket (NETLINK_NETFILTER)")?;
        socket.bind_auto().context("binding the netlink socket")?;
        // Acknowledgements without a copy of the request; at most a few seconds of waiting.
        let _ = socket.set_cap_ack(true);
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_rx_buf_sz(4 << 20);
        set_receive_timeout(&socket, std::time::Duration::from_secs(5))?;
        Ok(Connection { socket })
    }

    /// Send one batch from [`encode`] and wait for every message's acknowledgement; the
    /// first error the kernel reports (the whole transaction is then undone) fails the call,
    /// naming the message by its position.
    pub fn send(&mut self, batch: &[u8]) -> anyhow::Result<()> {
        let kernel = netlink_sys::SocketAddr::new(0, 0);
        let sent = self.socket.send_to(batch, &kernel, 0).context("sending the nftables transaction")?;
        if sent != batch.len() {
            bail!("sent {sent} of {} bytes of the nftables transaction", batch.len());
        }
        let mut expected = acked_messages(batch);
        let mut failure = None;
        while expected > 0 {
            let (reply, _) = self.socket.recv_from_full().context("waiting for the kernel's acknowledgements")?;
            let mut at = 0;
            while at + 16 <= reply.len() {
                let len = u32_at(&reply, at) as usize;
                if u16_at(&reply, at + 4) == NLMSG_ERROR && at + 20 + 16 <= reply.len() {
                    // struct nlmsgerr: the error code, then the request's header (its seq at +8).
                    let code = u32_at(&reply, at + 16) as i32;
                    let seq = u32_at(&reply, at + 28);
                    if code != 0 && failure.is_none() {
                        failure = Some((seq, std::io::Error::from_raw_os_error(-code)));
                    }
                    expected -= 1;
                }
                if len < 16 {
                    break;
                }
                at += (len + 3) & !3;
            }
            // After a refusal the kernel acknowledges what it processed; nothing more is owed.
            if failure.is_some() && expected > 0 && !more_waiting(&self.socket) {
                break;
            }
        }
        match failure {
            Some((seq, e)) => bail!("the kernel refused operation {seq} of the transaction: {e}"),
            None => Ok(()),
        }
    }
}

/// Whether a reply is already queued on the socket.
fn more_waiting(socket: &netlink_sys::Socket) -> bool {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    n > 0
}

/// [`Connection::send`] on a connection of its own.
pub fn send(batch: &[u8]) -> anyhow::Result<()> {
    Connection::open()?.send(batch)
}

pub(crate) fn set_receive_timeout(socket: &netlink_sys::Socket, t: std::time::Duration) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: a valid socket descriptor and a timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    anyhow::ensure!(rc == 0, "setting the netlink receive timeout: {}", std::io::Error::last_os_error());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_laid_out_as_nft_stores_them() {
        // As `nft --debug=netlink` prints them: `0a00600a 00000006 00005000` (words, little-endian).
        assert_eq!(key_bytes("10.96.0.10 . tcp . 80").unwrap(), [10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(key_bytes("udp . 30080").unwrap(), [17, 0, 0, 0, 0x75, 0x80, 0, 0]);
        assert_eq!(key_bytes("10.244.1.1 . 10.244.1.2").unwrap(), [10, 244, 1, 1, 10, 244, 1, 2]);
        assert!(key_bytes("10.96.0.10 . icmp . 80").is_none());
        assert_eq!(verdict_code("goto reject-chain"), Some((NFT_GOTO, Some("reject-chain"))));
        assert_eq!(verdict_code("drop"), Some((NF_DROP, None)));
        assert_eq!(verdict_code("accept"), None);
    }

    #[test]
    fn a_batch_is_framed_and_every_message_asks_for_an_ack() {
        let ops = vec![
            Op::AddChain("service-x".into()),
            Op::AddRule {
                chain: "service-x".into(),
                rule: Rule::Dnat {
                    one_in: Some(2),
                    protocol: Protocol::Tcp,
                    ip: Ipv4Addr::new(10, 0, 0, 1),
                    port: 8080,
                },
            },
            Op::AddElement {
                set: "service-ips",
                key: "10.96.0.10 . tcp . 80".into(),
                verdict: Some("goto service-x".into()),
            },
            Op::FlushChain("service-y".into()),
            Op::DeleteChain("service-y".into()),
        ];
        let batch = encode(&ops).unwrap();
        assert_eq!(acked_messages(&batch), ops.len());
        // Begins and ends with the batch markers, for the nf_tables subsystem.
        assert_eq!(u16::from_ne_bytes([batch[4], batch[5]]), NFNL_MSG_BATCH_BEGIN);
        assert_eq!(u16::from_be_bytes([batch[18], batch[19]]), NFNL_SUBSYS_NFTABLES);
        let end = batch.len() - 20;
        assert_eq!(u16::from_ne_bytes([batch[end + 4], batch[end + 5]]), NFNL_MSG_BATCH_END);
        // The expressions nft generates for this rule, by name and in order.
        let names: Vec<&str> = ["numgen", "cmp", "meta", "cmp", "immediate", "immediate", "nat"].to_vec();
        let text = String::from_utf8_lossy(&batch);
        let mut at = 0;
        for n in names {
            let found = text[at..].find(&format!("{n}\0")).unwrap_or_else(|| panic!("{n} after {at}"));
            at += found + n.len();
        }
    }

    #[test]
    fn what_netlink_does_not_encode_goes_to_nft() {
        let text = vec![Op::AddRule { chain: "c".into(), rule: Rule::Text("fib saddr type local goto x".into()) }];
        assert!(encode(&text).is_none());
        assert!(encode(&[Op::AddSet { name: "affinity-x".into(), timeout: 10800 }]).is_none());
        let cidr0 = Rule::MarkForMasquerade {
            daddr: Ipv4Addr::new(10, 96, 0, 1),
            protocol: Protocol::Udp,
            dport: 53,
            unless_from: Some(Cidr { network: Ipv4Addr::UNSPECIFIED, prefix: 0 }),
        };
        assert!(encode(&[Op::AddRule { chain: "c".into(), rule: cidr0 }]).is_none());
    }
}
