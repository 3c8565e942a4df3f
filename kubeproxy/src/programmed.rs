//! Which service ports a sync must render again — the per-port bookkeeping that the nftables
//! and iptables tables share. Each port's share of the rules is kept with the port it was
//! rendered from; a port still the same `Arc` (the proxy's cache hands out the same one while
//! a Service and its slices are unchanged) is not even compared.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{ServicePort, ServicePortName};

/// A service port's identity in the rules.
pub type PortId = ServicePortName;

struct Entry<P> {
    port: Arc<ServicePort>,
    part: P,
    /// The last sync that saw it.
    seen: u64,
}

/// The service ports as programmed, each with its share `P` of the rules, in `PortId` order.
pub struct Ports<P> {
    entries: BTreeMap<PortId, Entry<P>>,
    /// Counts syncs, to find the ports a sync no longer has.
    generation: u64,
}

impl<P> Default for Ports<P> {
    fn default() -> Self {
        Ports { entries: BTreeMap::new(), generation: 0 }
    }
}

impl<P: Default> Ports<P> {
    /// Every port's share, in `PortId` order.
    pub fn parts(&self) -> impl Iterator<Item = &P> + Clone {
        self.entries.values().map(|e| &e.part)
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Bring the ports to `ports`: each port new or changed since the last sync is rendered
    /// with `render`, and `change(id, before, after)` is told its share before and after (the
    /// default share for a port that is new or gone). Of a port listed twice, the first counts.
    pub fn sync(
        &mut self,
        ports: &[Arc<ServicePort>],
        mut render: impl FnMut(&ServicePort) -> P,
        mut change: impl FnMut(&PortId, &P, &P),
    ) {
        self.generation += 1;
        let generation = self.generation;
        let mut seen = 0;
        for sp in ports {
            match self.entries.get_mut(&sp.name) {
                Some(e) if e.seen == generation => continue,
                Some(e) if Arc::ptr_eq(&e.port, sp) || e.port == *sp => e.seen = generation,
                _ => {
                    let part = render(sp);
                    let before = self.entries.remove(&sp.name).map(|e| e.part).unwrap_or_default();
                    change(&sp.name, &before, &part);
                    self.entries.insert(sp.name.clone(), Entry { port: Arc::clone(sp), part, seen: generation });
                }
            }
            seen += 1;
        }
        if seen < self.entries.len() {
            let gone: Vec<PortId> =
                self.entries.iter().filter(|(_, e)| e.seen != generation).map(|(id, _)| id.clone()).collect();
            for id in gone {
                if let Some(e) = self.entries.remove(&id) {
                    change(&id, &e.part, &P::default());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_service, simple_slice};
    use crate::model::{service_ports, NodeInfo};

    #[test]
    fn only_new_changed_and_gone_ports_are_rendered_and_reported() {
        let node = NodeInfo::named("node-a");
        let svcs = [simple_service("a", "10.96.0.1", 80), simple_service("b", "10.96.0.2", 80)];
        let arcs = |eps: &[&str]| -> Vec<Arc<ServicePort>> {
            let slices = [simple_slice("a", &["10.0.0.1"], 80), simple_slice("b", eps, 80)];
            service_ports(&svcs, &slices, &node).into_iter().map(Arc::new).collect()
        };
        let mut ports: Ports<Vec<String>> = Ports::default();
        let sync = |ports: &mut Ports<Vec<String>>, list: &[Arc<ServicePort>]| {
            let mut rendered = Vec::new();
            let mut changes = Vec::new();
            ports.sync(
                list,
                |sp| {
                    rendered.push(sp.name.name.clone());
                    sp.cluster_endpoints.iter().map(|e| e.ip.to_string()).collect()
                },
                |id, before, after| changes.push((id.name.clone(), before.clone(), after.clone())),
            );
            (rendered, changes)
        };
        let first = arcs(&["10.0.0.2"]);
        let (rendered, changes) = sync(&mut ports, &first);
        assert_eq!(rendered, ["a", "b"]);
        assert_eq!(changes[1], ("b".to_string(), vec![], vec!["10.0.0.2".to_string()]));
        // Equal ports (other Arcs): nothing; the same port twice: the first counts.
        let mut again = arcs(&["10.0.0.2"]);
        again.push(arcs(&["10.0.0.9"])[1].clone());
        assert_eq!(sync(&mut ports, &again), (vec![], vec![]));
        // b changes, then a goes.
        let (rendered, changes) = sync(&mut ports, &arcs(&["10.0.0.3"]));
        assert_eq!((rendered.as_slice(), changes.len()), (["b".to_string()].as_slice(), 1));
        let only_b = vec![arcs(&["10.0.0.3"])[1].clone()];
        let (rendered, changes) = sync(&mut ports, &only_b);
        assert!(rendered.is_empty());
        assert_eq!(changes, [("a".to_string(), vec!["10.0.0.1".to_string()], vec![])]);
        assert_eq!(ports.parts().count(), 1);
    }
}
