//! MiniK8s' node proxy as a library: the pure rule computation ([`model`], [`iptables`],
//! [`nftables`], [`ipvs`] (with [`ipvs_iptables`] and [`ipvs_netlink`]'s encoding), [`dns`], [`ingress`], [`netpol`]'s policies), the load balancer health checks
//! ([`healthcheck`]) and the thin shells that apply them ([`backend`], [`nft_netlink`]'s send, [`ipvs_netlink::Connection`], [`ipvs_dummy`],
//! [`proxier`], [`sysctl`]). The `kubeproxy` binary wires them to flags; the
//! benchmark (`examples/kubeproxy_bench.rs`) drives them directly.

pub mod backend;
pub mod chains;
pub mod conntrack;
pub mod dns;
pub mod dnsservice;
pub mod healthcheck;
pub mod host;
pub mod ingress;
pub mod iptables;
pub mod ipvs;
pub mod ipvs_dummy;
pub mod ipvs_iptables;
pub mod ipvs_netlink;
pub mod model;
pub mod netpol;
pub mod nft_netlink;
pub mod nftables;
pub mod programmed;
pub mod proxier;
pub mod sysctl;
