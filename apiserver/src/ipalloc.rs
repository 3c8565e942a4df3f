//! Service ClusterIP and NodePort allocation: bitmaps persisted in storage (one key per
//! range, like Kubernetes' RangeAllocation objects), changed with compare-and-swap in the
//! same transaction as the Service itself.

use std::net::Ipv4Addr;

use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};

pub const SERVICE_IPS_KEY: &str = "/registry/ranges/serviceips";
pub const NODE_PORTS_KEY: &str = "/registry/ranges/servicenodeports";

/// An IPv4 CIDR such as `10.96.0.0/12`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpRange {
    pub base: u32,
    pub prefix: u8,
    pub text: String,
}

impl IpRange {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (ip, prefix) = s.split_once('/').ok_or_else(|| format!("{s:?} is not a CIDR"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| format!("{s:?}: only IPv4 service ranges are supported"))?;
        let prefix: u8 = prefix.parse().map_err(|_| format!("{s:?}: bad prefix length"))?;
        if !(8..=30).contains(&prefix) {
            return Err(format!("{s:?}: prefix length must be between 8 and 30"));
        }
        let mask = u32::MAX << (32 - prefix);
        let base = u32::from(ip) & mask;
        Ok(IpRange { base, prefix, text: format!("{}/{prefix}", Ipv4Addr::from(base)) })
    }
    /// Number of addresses in the range, network and broadcast included.
    pub fn size(&self) -> usize {
        1usize << (32 - self.prefix)
    }
    /// Offset of `ip` if it is a usable address (not network, not broadcast).
    pub fn offset(&self, ip: Ipv4Addr) -> Option<usize> {
        let v = u32::from(ip);
        if v < self.base {
            return None;
        }
        let off = (v - self.base) as usize;
        (off >= 1 && off < self.size() - 1).then_some(off)
    }
    pub fn ip_at(&self, offset: usize) -> Ipv4Addr {
        Ipv4Addr::from(self.base + offset as u32)
    }
    /// The first usable address, reserved for the `kubernetes` Service.
    pub fn first(&self) -> Ipv4Addr {
        self.ip_at(1)
    }
}

/// A port range such as `30000-32767` (inclusive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub base: u16,
    pub last: u16,
}

impl PortRange {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        let a: u16 = a.trim().parse().map_err(|_| format!("{s:?} is not a port range"))?;
        let b: u16 = b.trim().parse().map_err(|_| format!("{s:?} is not a port range"))?;
        if a == 0 || b < a {
            return Err(format!("{s:?} is not a port range"));
        }
        Ok(PortRange { base: a, last: b })
    }
    pub fn size(&self) -> usize {
        (self.last - self.base) as usize + 1
    }
    pub fn offset(&self, port: i64) -> Option<usize> {
        (port >= self.base as i64 && port <= self.last as i64).then(|| (port - self.base as i64) as usize)
    }
    pub fn text(&self) -> String {
        format!("{}-{}", self.base, self.last)
    }
}

/// A fixed-size bitmap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitmap {
    pub bits: Vec<u8>,
    pub size: usize,
}

impl Bitmap {
    pub fn new(size: usize) -> Self {
        Bitmap { bits: vec![0; size.div_ceil(8)], size }
    }
    pub fn get(&self, i: usize) -> bool {
        i < self.size && self.bits[i / 8] & (1 << (i % 8)) != 0
    }
    pub fn set(&mut self, i: usize, on: bool) {
        if i >= self.size {
            return;
        }
        if on {
            self.bits[i / 8] |= 1 << (i % 8);
        } else {
            self.bits[i / 8] &= !(1 << (i % 8));
        }
    }
    pub fn count(&self) -> usize {
        self.bits.iter().map(|b| b.count_ones() as usize).sum()
    }
    /// The first free index in `[lo, hi)` scanning from `start` and wrapping around.
    pub fn find_free(&self, lo: usize, hi: usize, start: usize) -> Option<usize> {
        if hi <= lo {
            return None;
        }
        let n = hi - lo;
        let start = lo + (start.saturating_sub(lo)) % n;
        (0..n).map(|k| lo + (start - lo + k) % n).find(|&i| !self.get(i))
    }

    /// Encode as the stored JSON document `{"range": ..., "data": base64}`.
    pub fn encode(&self, range: &str) -> Bytes {
        let data = base64::engine::general_purpose::STANDARD.encode(&self.bits);
        Bytes::from(json!({"kind": "RangeAllocation", "apiVersion": "v1", "range": range, "data": data}).to_string())
    }

    /// Decode a stored document; a document for a different range is an error (the flags
    /// changed under existing Services).
    pub fn decode(bytes: &[u8], range: &str, size: usize) -> Result<Self, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("corrupt range allocation: {e}"))?;
        let stored_range = v.get("range").and_then(Value::as_str).unwrap_or_default();
        if stored_range != range {
            return Err(format!(
                "the stored allocation is for range {stored_range}, but the configured range is {range}"
            ));
        }
        let data = v.get("data").and_then(Value::as_str).unwrap_or_default();
        let mut bits = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| format!("corrupt range allocation: {e}"))?;
        bits.resize(size.div_ceil(8), 0);
        Ok(Bitmap { bits, size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_ranges() {
        let r = IpRange::parse("10.96.0.0/12").unwrap();
        assert_eq!(r.size(), 1 << 20);
        assert_eq!(r.first(), Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(r.offset(Ipv4Addr::new(10, 96, 0, 10)), Some(10));
        assert_eq!(r.offset(Ipv4Addr::new(10, 96, 0, 0)), None);
        assert_eq!(r.offset(Ipv4Addr::new(10, 111, 255, 255)), None);
        assert_eq!(r.offset(Ipv4Addr::new(10, 112, 0, 1)), None);
        assert_eq!(r.offset(Ipv4Addr::new(10, 0, 0, 1)), None);
        assert_eq!(IpRange::parse("10.96.1.7/24").unwrap().text, "10.96.1.0/24");
        assert!(IpRange::parse("fd00::/108").is_err());
    }

    #[test]
    fn port_ranges() {
        let p = PortRange::parse("30000-32767").unwrap();
        assert_eq!(p.size(), 2768);
        assert_eq!(p.offset(30080), Some(80));
        assert_eq!(p.offset(29999), None);
        assert_eq!(p.offset(32768), None);
        assert!(PortRange::parse("x").is_err());
    }

    #[test]
    fn bitmaps() {
        let mut b = Bitmap::new(10);
        b.set(3, true);
        assert!(b.get(3));
        assert_eq!(b.find_free(1, 9, 3), Some(4));
        for i in 1..9 {
            b.set(i, true);
        }
        assert_eq!(b.find_free(1, 9, 5), None);
        b.set(2, false);
        assert_eq!(b.find_free(1, 9, 7), Some(2));
        let enc = b.encode("r");
        let dec = Bitmap::decode(&enc, "r", 10).unwrap();
        assert_eq!(dec, b);
        assert!(Bitmap::decode(&enc, "other", 10).is_err());
        assert_eq!(dec.count(), 7);
    }
}
