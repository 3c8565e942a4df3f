//! IPv4 CIDR blocks: the node's podCIDR, other nodes' podCIDRs, the routes between them.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use anyhow::{bail, Context, Result};

/// An IPv4 CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Cidr> {
        let (a, p) = s.split_once('/').with_context(|| format!("{s:?} is not a CIDR"))?;
        let addr: Ipv4Addr = a.parse().with_context(|| format!("{s:?}: bad address"))?;
        let prefix: u8 = p.parse().with_context(|| format!("{s:?}: bad prefix"))?;
        if prefix > 30 {
            bail!("{s:?}: prefix must be at most /30");
        }
        let mask = mask(prefix);
        Ok(Cidr { network: Ipv4Addr::from(u32::from(addr) & mask), prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    }
}

impl Cidr {
    /// The bridge's address, the pods' default gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.network)
    }
    /// Whether the two blocks share an address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other.network) || other.contains(self.network)
    }
    /// The block's last address (as a number).
    pub fn broadcast(&self) -> u32 {
        u32::from(self.network) | !mask(self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_and_gateway() {
        let c: Cidr = "10.244.3.7/24".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.3.0/24");
        assert_eq!(c.gateway(), Ipv4Addr::new(10, 244, 3, 1));
        assert!(c.contains(Ipv4Addr::new(10, 244, 3, 200)));
        assert!(!c.contains(Ipv4Addr::new(10, 244, 4, 1)));
        assert!("10.0.0.0".parse::<Cidr>().is_err());
    }
}
