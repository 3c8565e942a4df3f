//! The `local` provider, for lab machines and VMs on one LAN.
//!
//! **Addresses** come from pools in `--cloud-config` (CIDRs or `first-last` ranges; a pool
//! may serve one `loadBalancerClass`, the pool without a class serves Services without
//! one). A requested `spec.loadBalancerIP` must lie in the Service's pool and be free.
//!
//! **Announcing** an address means holding it as a /32 on a link of this host (`interface`,
//! default `lo`; a missing link of another name is made as a dummy link, as kube-proxy's
//! IPVS mode holds Service addresses on `kube-ipvs0`), labelled `<link>:lb`: the address is
//! local, so the host answers ARP for it on every LAN it is on (Linux' default
//! `arp_ignore=0`) and other machines' packets to it arrive here, where
//! kubeproxy's rules for `status.loadBalancer` addresses send them to the Service's
//! endpoints on any node; connections from this host reach the rules too. One host
//! answers for all addresses (the one running the leader), as MetalLB's layer-2 mode does
//! per address; a failover moves them when the new leader starts. An empty `interface`
//! announces nothing (a LAN that routes the pool to the nodes some other way).
//!
//! **State**: the load balancers are kept in `stateFile` (JSON, written through a
//! temporary file and a rename before an address is announced and after it is withdrawn),
//! so a restarted controller finds every address it gave out; at start the link is made
//! to hold exactly the state's addresses.
//!
//! **Instances**: a node's provider ID is `local://<node name>`; instance type, region and
//! zone come from the configuration; addresses stay the kubelet's.
//!
//! **Routes**: none. Every kubelet programs its own host's routes to the other nodes' pod
//! networks (host-gw), which needs no route table outside the hosts.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

use super::{Cloud, CloudError, InstanceMetadata, Instances, LoadBalancers, Routes};
use crate::model::{Listener, LoadBalancer, Remote};

/// The link that holds the addresses unless `interface` says otherwise.
pub const DEFAULT_INTERFACE: &str = "lo";

/// `--cloud-config` of the local provider (YAML).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// The link holding the addresses (made as a dummy link if there is none of that name);
    /// "" announces nothing. Default `lo`.
    pub interface: Option<String>,
    /// Where the load balancers are kept. Default `/var/lib/minik8s/cloud-controller-manager/load-balancers.json`.
    pub state_file: Option<PathBuf>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// CIDRs (`192.168.1.240/28`) and ranges (`192.168.1.240-192.168.1.250`).
    pub addresses: Vec<String>,
    /// The `loadBalancerClass` this pool serves; none: Services without a class.
    pub load_balancer_class: Option<String>,
}

/// A pool of addresses, as inclusive ranges of u32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub class: Option<String>,
    pub ranges: Vec<(u32, u32)>,
}

/// Parse one pool entry: a CIDR (without its network and broadcast addresses when it has
/// more than two) or `first-last`.
pub fn parse_range(s: &str) -> Result<(u32, u32), String> {
    let s = s.trim();
    if let Some((ip, len)) = s.split_once('/') {
        let ip: Ipv4Addr = ip.trim().parse().map_err(|_| format!("{s:?}: not an IPv4 CIDR"))?;
        let len: u32 =
            len.trim().parse().ok().filter(|l| *l <= 32).ok_or_else(|| format!("{s:?}: bad prefix length"))?;
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        let (first, last) = (u32::from(ip) & mask, (u32::from(ip) & mask) | !mask);
        return Ok(if len <= 30 { (first + 1, last - 1) } else { (first, last) });
    }
    if let Some((a, b)) = s.split_once('-') {
        let a: Ipv4Addr = a.trim().parse().map_err(|_| format!("{s:?}: {a:?} is not an IPv4 address"))?;
        let b: Ipv4Addr = b.trim().parse().map_err(|_| format!("{s:?}: {b:?} is not an IPv4 address"))?;
        if u32::from(a) > u32::from(b) {
            return Err(format!("{s:?}: the range ends before it starts"));
        }
        return Ok((a.into(), b.into()));
    }
    let ip: Ipv4Addr = s.parse().map_err(|_| format!("{s:?}: not a CIDR, a range or an address"))?;
    Ok((ip.into(), ip.into()))
}

impl Pool {
    pub fn from_config(c: &PoolConfig) -> Result<Pool, String> {
        if c.addresses.is_empty() {
            return Err(format!("pool {:?} has no addresses", c.name));
        }
        let ranges = c
            .addresses
            .iter()
            .map(|a| parse_range(a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("pool {:?}: {e}", c.name))?;
        Ok(Pool { name: c.name.clone(), class: c.load_balancer_class.clone().filter(|s| !s.is_empty()), ranges })
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        self.ranges.iter().any(|(a, b)| (*a..=*b).contains(&ip))
    }

    pub fn size(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| (*b - *a) as u64 + 1).sum()
    }
}

/// Parse the configuration's pools: names unique, at most one pool per class.
pub fn pools(cfg: &Config) -> Result<Vec<Pool>, String> {
    let pools: Vec<Pool> = cfg.pools.iter().map(Pool::from_config).collect::<Result<_, _>>()?;
    for (i, p) in pools.iter().enumerate() {
        if pools[..i].iter().any(|q| q.name == p.name) {
            return Err(format!("two pools are called {:?}", p.name));
        }
        if pools[..i].iter().any(|q| q.class == p.class) {
            return Err(match &p.class {
                Some(c) => format!("two pools serve loadBalancerClass {c:?}"),
                None => "two pools serve Services without a loadBalancerClass".into(),
            });
        }
    }
    Ok(pools)
}

/// The address for `lb` given the addresses in use (address → Service): the requested one
/// if it is in the pool of `lb`'s class and free (or already `lb`'s), else the first free
/// address of that pool.
pub fn allocate(pools: &[Pool], lb: &LoadBalancer, used: &BTreeMap<Ipv4Addr, String>) -> Result<Ipv4Addr, CloudError> {
    let pool = pools
        .iter()
        .find(|p| p.class == lb.class)
        .ok_or_else(|| CloudError::NoPool(lb.class.clone().unwrap_or_default()))?;
    if let Some(ip) = lb.requested_ip {
        if !pool.contains(ip) {
            return Err(CloudError::NotInPool { ip, pool: pool.name.clone() });
        }
        return match used.get(&ip) {
            Some(by) if *by != lb.service => Err(CloudError::AddressInUse { ip, by: by.clone() }),
            _ => Ok(ip),
        };
    }
    pool.ranges
        .iter()
        .flat_map(|(a, b)| (*a..=*b).map(Ipv4Addr::from))
        .find(|ip| !used.contains_key(ip))
        .ok_or(CloudError::PoolExhausted { pool: pool.name.clone(), size: pool.size() })
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateFile {
    #[serde(default)]
    load_balancers: BTreeMap<String, Remote>,
}

/// [`StateFile`] as it is written.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StateRef<'a> {
    load_balancers: &'a BTreeMap<String, Remote>,
}

/// The local provider.
pub struct Local {
    pools: Vec<Pool>,
    interface: String,
    state_file: PathBuf,
    lbs: tokio::sync::Mutex<BTreeMap<String, Remote>>,
    instance_type: String,
    region: Option<String>,
    zone: Option<String>,
}

impl Local {
    /// Read the state, make the link hold exactly its addresses.
    pub async fn start(cfg: Config) -> anyhow::Result<Arc<Local>> {
        let pools = pools(&cfg).map_err(|e| anyhow::anyhow!("--cloud-config: {e}"))?;
        let state_file = cfg
            .state_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/lib/minik8s/cloud-controller-manager/load-balancers.json"));
        let lbs = match std::fs::read(&state_file) {
            Ok(b) => {
                serde_json::from_slice::<StateFile>(&b)
                    .with_context(|| format!("reading the load balancers in {}", state_file.display()))?
                    .load_balancers
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", state_file.display())),
        };
        let interface = cfg.interface.clone().unwrap_or_else(|| DEFAULT_INTERFACE.to_string());
        if !interface.is_empty() {
            let want: BTreeSet<Ipv4Addr> = lbs.values().map(|r| r.address).collect();
            announce::sync(&interface, &want, &pools).await.with_context(|| format!("announcing on {interface}"))?;
        }
        tracing::info!(pools = pools.len(), load_balancers = lbs.len(), %interface, state = %state_file.display(), "local provider ready");
        Ok(Arc::new(Local {
            pools,
            interface,
            state_file,
            lbs: tokio::sync::Mutex::new(lbs),
            instance_type: cfg.instance_type.unwrap_or_else(|| "local".into()),
            region: cfg.region.filter(|s| !s.is_empty()),
            zone: cfg.zone.filter(|s| !s.is_empty()),
        }))
    }

    /// Set (or with None remove) one balancer and write the state; on a failed write the
    /// balancer is as it was. Returns what it was.
    fn commit(
        &self,
        lbs: &mut BTreeMap<String, Remote>,
        name: &str,
        new: Option<Remote>,
    ) -> Result<Option<Remote>, CloudError> {
        let old = match new {
            Some(r) => lbs.insert(name.to_string(), r),
            None => lbs.remove(name),
        };
        let written = serde_json::to_vec(&StateRef { load_balancers: lbs })
            .map_err(|e| CloudError::Failed(e.to_string()))
            .and_then(|body| {
                write_atomic(&self.state_file, &body)
                    .map_err(|e| CloudError::Failed(format!("writing {}: {e:#}", self.state_file.display())))
            });
        if let Err(e) = written {
            match &old {
                Some(o) => lbs.insert(name.to_string(), o.clone()),
                None => lbs.remove(name),
            };
            return Err(e);
        }
        Ok(old)
    }

    async fn change(&self, name: &str, f: impl FnOnce(&mut Remote)) -> Result<(), CloudError> {
        let mut lbs = self.lbs.lock().await;
        let mut r = lbs.get(name).cloned().ok_or_else(|| CloudError::NotFound(name.to_string()))?;
        f(&mut r);
        self.commit(&mut lbs, name, Some(r))?;
        Ok(())
    }
}

fn write_atomic(path: &Path, body: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[async_trait]
impl LoadBalancers for Local {
    fn serves_class(&self, class: Option<&str>) -> bool {
        self.pools.iter().any(|p| p.class.as_deref() == class)
    }
    async fn get(&self, name: &str) -> Result<Option<Remote>, CloudError> {
        Ok(self.lbs.lock().await.get(name).cloned())
    }
    async fn list(&self) -> Result<Vec<Remote>, CloudError> {
        Ok(self.lbs.lock().await.values().cloned().collect())
    }
    async fn create(&self, lb: &LoadBalancer) -> Result<Remote, CloudError> {
        let mut lbs = self.lbs.lock().await;
        let used: BTreeMap<Ipv4Addr, String> =
            lbs.values().filter(|r| r.name != lb.name).map(|r| (r.address, r.service.clone())).collect();
        let address = allocate(&self.pools, lb, &used)?;
        let r = Remote::empty(lb, address);
        // Kept before it is announced: a crash in between leaves an address the next start announces.
        let old = self.commit(&mut lbs, &lb.name, Some(r.clone()))?;
        if !self.interface.is_empty() {
            if let Some(old) = old.filter(|o| o.address != address) {
                announce::del(&self.interface, old.address).await.map_err(|e| CloudError::Failed(format!("{e:#}")))?;
            }
            announce::add(&self.interface, address).await.map_err(|e| CloudError::Failed(format!("{e:#}")))?;
        }
        Ok(r)
    }
    async fn add_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        self.change(name, |r| {
            r.listeners.insert(l.clone());
        })
        .await
    }
    async fn update_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        self.change(name, |r| {
            r.listeners.retain(|x| x.key() != l.key());
            r.listeners.insert(l.clone());
        })
        .await
    }
    async fn delete_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        self.change(name, |r| r.listeners.retain(|x| x.key() != l.key())).await
    }
    async fn set_backends(&self, name: &str, backends: &BTreeSet<String>) -> Result<(), CloudError> {
        self.change(name, |r| r.backends = backends.clone()).await
    }
    async fn set_health_check(&self, name: &str, node_port: Option<i32>) -> Result<(), CloudError> {
        self.change(name, |r| r.health_check_node_port = node_port).await
    }
    async fn delete(&self, name: &str) -> Result<(), CloudError> {
        let mut lbs = self.lbs.lock().await;
        let Some(r) = lbs.get(name).cloned() else { return Ok(()) };
        // Withdrawn before it is forgotten: a crash in between leaves an address the state
        // still names, which the next delete withdraws again.
        if !self.interface.is_empty() {
            announce::del(&self.interface, r.address).await.map_err(|e| CloudError::Failed(format!("{e:#}")))?;
        }
        self.commit(&mut lbs, name, None)?;
        Ok(())
    }
}

#[async_trait]
impl Instances for Local {
    async fn metadata(&self, node: &Node) -> Result<InstanceMetadata, CloudError> {
        Ok(InstanceMetadata {
            provider_id: format!("local://{}", node.metadata.name.as_deref().unwrap_or_default()),
            instance_type: Some(self.instance_type.clone()),
            region: self.region.clone(),
            zone: self.zone.clone(),
            addresses: vec![],
        })
    }
}

/// The local provider with its capabilities.
pub struct LocalCloud(pub Arc<Local>);

impl Cloud for LocalCloud {
    fn name(&self) -> &str {
        "local"
    }
    fn load_balancers(&self) -> Option<Arc<dyn LoadBalancers>> {
        Some(self.0.clone())
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(self.0.clone())
    }
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        None
    }
}

/// The link and the addresses it holds for us, over netlink. Our addresses carry the label
/// `<link>:lb` (what `ip addr` shows), so that only they are ever removed from a shared
/// link such as `lo`.
mod announce {
    use super::*;
    use futures::TryStreamExt;
    use rtnetlink::packet_route::address::AddressAttribute;
    use rtnetlink::{new_connection, Handle, LinkDummy, LinkUnspec};

    fn connect() -> anyhow::Result<Handle> {
        let (conn, handle, _) = new_connection().context("opening a netlink socket")?;
        tokio::spawn(conn);
        Ok(handle)
    }

    fn errno(e: &rtnetlink::Error) -> Option<i32> {
        match e {
            rtnetlink::Error::NetlinkError(m) => Some(m.raw_code().abs()),
            _ => None,
        }
    }

    /// The label of our addresses on `link` (labels are at most 15 bytes and start with the
    /// link's name).
    pub fn label(link: &str) -> String {
        let mut l = format!("{link}:lb");
        l.truncate(15);
        l
    }

    /// The index of the link, created as a dummy link (and brought up) if missing.
    async fn link(h: &Handle, name: &str) -> anyhow::Result<u32> {
        let find = || async {
            match h.link().get().match_name(name.to_string()).execute().try_next().await {
                Ok(l) => Ok(l.map(|l| l.header.index)),
                Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
                Err(e) => Err(anyhow::Error::from(e).context(format!("looking up link {name}"))),
            }
        };
        let idx = match find().await? {
            Some(i) => i,
            None => {
                if let Err(e) = h.link().add(LinkDummy::new(name).build()).execute().await {
                    if errno(&e) != Some(libc::EEXIST) {
                        return Err(e).with_context(|| {
                            format!("creating dummy link {name} (a kernel without dummy links can hold the addresses on lo: interface: lo)")
                        });
                    }
                }
                find().await?.ok_or_else(|| anyhow::anyhow!("link {name} vanished"))?
            }
        };
        h.link().set(LinkUnspec::new_with_index(idx).up().build()).execute().await.context("bringing the link up")?;
        Ok(idx)
    }

    fn address_of(m: &rtnetlink::packet_route::address::AddressMessage) -> Option<Ipv4Addr> {
        m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(IpAddr::V4(ip)) | AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
            _ => None,
        })
    }

    fn labelled(m: &rtnetlink::packet_route::address::AddressMessage, label: &str) -> bool {
        m.attributes.iter().any(|a| matches!(a, AddressAttribute::Label(l) if l == label))
    }

    /// Our addresses on the link.
    async fn ours(
        h: &Handle,
        idx: u32,
        label: &str,
    ) -> anyhow::Result<Vec<rtnetlink::packet_route::address::AddressMessage>> {
        let mut out = Vec::new();
        let mut s = h.address().get().set_link_index_filter(idx).execute();
        while let Some(m) = s.try_next().await.context("listing addresses")? {
            if labelled(&m, label) && address_of(&m).is_some() {
                out.push(m);
            }
        }
        Ok(out)
    }

    async fn add_on(h: &Handle, idx: u32, name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        let mut req = h.address().add(idx, IpAddr::V4(ip), 32).replace();
        req.message_mut().attributes.push(AddressAttribute::Label(label(name)));
        req.execute().await.with_context(|| format!("adding {ip} to {name}"))
    }

    async fn del_on(h: &Handle, idx: u32, name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        for m in ours(h, idx, &label(name)).await? {
            if address_of(&m) == Some(ip) {
                match h.address().del(m).execute().await {
                    Err(e) if errno(&e) != Some(libc::EADDRNOTAVAIL) => {
                        return Err(e).with_context(|| format!("removing {ip} from {name}"));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    pub async fn add(name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        let h = connect()?;
        let idx = link(&h, name).await?;
        add_on(&h, idx, name, ip).await
    }

    pub async fn del(name: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        let h = connect()?;
        let idx = link(&h, name).await?;
        del_on(&h, idx, name, ip).await
    }

    /// Make the link hold exactly `want` of our addresses in `pools` (another cluster's
    /// pool on the same host is left alone).
    pub async fn sync(name: &str, want: &BTreeSet<Ipv4Addr>, pools: &[Pool]) -> anyhow::Result<()> {
        let h = connect()?;
        let idx = link(&h, name).await?;
        let have: BTreeSet<Ipv4Addr> = ours(&h, idx, &label(name))
            .await?
            .iter()
            .filter_map(address_of)
            .filter(|ip| pools.iter().any(|p| p.contains(*ip)))
            .collect();
        for ip in have.difference(want) {
            del_on(&h, idx, name, *ip).await?;
        }
        for ip in want.difference(&have) {
            add_on(&h, idx, name, *ip).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(service: &str, class: Option<&str>, ip: Option<&str>) -> LoadBalancer {
        LoadBalancer {
            name: format!("a-{service}"),
            service: service.into(),
            class: class.map(String::from),
            requested_ip: ip.map(|s| s.parse().unwrap()),
            listeners: BTreeSet::new(),
            backends: BTreeSet::new(),
            health_check_node_port: None,
        }
    }

    fn config(yaml: &str) -> Config {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn pools_parse_cidrs_ranges_and_single_addresses() {
        let ip = |s: &str| u32::from(s.parse::<Ipv4Addr>().unwrap());
        assert_eq!(parse_range("192.168.1.0/30").unwrap(), (ip("192.168.1.1"), ip("192.168.1.2")));
        assert_eq!(parse_range("192.168.1.7/32").unwrap(), (ip("192.168.1.7"), ip("192.168.1.7")));
        assert_eq!(parse_range("10.0.0.5 - 10.0.0.9").unwrap(), (ip("10.0.0.5"), ip("10.0.0.9")));
        assert_eq!(parse_range("10.0.0.5").unwrap(), (ip("10.0.0.5"), ip("10.0.0.5")));
        assert!(parse_range("10.0.0.9-10.0.0.5").unwrap_err().contains("ends before"));
        assert!(parse_range("10.0.0.0/33").is_err());
        assert!(parse_range("nope").is_err());
        let cfg = config("pools:\n- name: a\n  addresses: [10.0.0.0/24]\n- name: b\n  addresses: [10.0.1.1-10.0.1.3]\n  loadBalancerClass: x\n");
        let p = pools(&cfg).unwrap();
        assert_eq!((p[0].size(), p[1].size()), (254, 3));
        let twice = config("pools:\n- name: a\n  addresses: [10.0.0.0/24]\n- name: b\n  addresses: [10.0.1.0/24]\n");
        assert_eq!(pools(&twice).unwrap_err(), "two pools serve Services without a loadBalancerClass");
        assert!(serde_yaml::from_str::<Config>("pool: []").is_err(), "unknown fields are refused");
    }

    #[test]
    fn allocation_takes_the_first_free_address_of_the_class_pool_or_the_requested_one() {
        let cfg = config("pools:\n- name: default\n  addresses: [10.0.0.1-10.0.0.2]\n- name: lab\n  addresses: [10.9.0.0/31]\n  loadBalancerClass: minik8s.io/lab\n");
        let p = pools(&cfg).unwrap();
        let mut used = BTreeMap::new();
        let a = allocate(&p, &lb("ns/a", None, None), &used).unwrap();
        assert_eq!(a.to_string(), "10.0.0.1");
        used.insert(a, "ns/a".to_string());
        assert_eq!(
            allocate(&p, &lb("ns/a", None, Some("10.0.0.1")), &used).unwrap().to_string(),
            "10.0.0.1",
            "its own"
        );
        assert_eq!(
            allocate(&p, &lb("ns/b", None, Some("10.0.0.1")), &used).unwrap_err().to_string(),
            "requested address 10.0.0.1 is already in use by the load balancer of Service ns/a"
        );
        assert_eq!(
            allocate(&p, &lb("ns/b", None, Some("10.9.0.1")), &used).unwrap_err(),
            CloudError::NotInPool { ip: "10.9.0.1".parse().unwrap(), pool: "default".into() }
        );
        used.insert("10.0.0.2".parse().unwrap(), "ns/c".into());
        assert_eq!(
            allocate(&p, &lb("ns/d", None, None), &used).unwrap_err().to_string(),
            "no address left in pool \"default\" (2 addresses, all in use)"
        );
        assert_eq!(allocate(&p, &lb("ns/e", Some("minik8s.io/lab"), None), &used).unwrap().to_string(), "10.9.0.0");
        assert_eq!(
            allocate(&p, &lb("ns/f", Some("other"), None), &used).unwrap_err(),
            CloudError::NoPool("other".into())
        );
    }

    #[tokio::test]
    async fn the_state_survives_a_restart_without_an_interface() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            pools: vec![PoolConfig {
                name: "p".into(),
                addresses: vec!["10.0.0.1-10.0.0.3".into()],
                load_balancer_class: None,
            }],
            interface: Some(String::new()),
            state_file: Some(dir.path().join("lbs.json")),
            ..Config::default()
        };
        let local = Local::start(cfg.clone()).await.unwrap();
        let a = local.create(&lb("ns/a", None, None)).await.unwrap();
        local.add_listener(&a.name, &Listener { port: 80, protocol: "TCP".into(), node_port: 30080 }).await.unwrap();
        let b = local.create(&lb("ns/b", None, None)).await.unwrap();
        drop(local);
        let again = Local::start(cfg).await.unwrap();
        let got = again.get(&a.name).await.unwrap().unwrap();
        assert_eq!((got.address, got.listeners.len()), (a.address, 1));
        let c = again.create(&lb("ns/c", None, None)).await.unwrap();
        assert_eq!(c.address.to_string(), "10.0.0.3", "addresses of the old state stay taken");
        again.delete(&b.name).await.unwrap();
        again.delete(&b.name).await.unwrap();
        let d = again.create(&lb("ns/d", None, None)).await.unwrap();
        assert_eq!(d.address, b.address, "a deleted balancer's address is free again");
    }
}
