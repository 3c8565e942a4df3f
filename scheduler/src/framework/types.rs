//! The scheduler's view of the cluster: pods and nodes digested once into the facts the
//! plugins need (resource requests, host ports, compiled selectors, taints), and the
//! [`Snapshot`] of every node with the pods assigned or assumed to it and their running
//! totals. Plugins are pure functions over these types.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use apimachinery::labels::{self, Operator, Requirement};
use k8s_openapi::api::core::v1::{Node, NodeSelector, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub type Labels = BTreeMap<String, String>;

/// Default requests kube-scheduler assumes for scoring when a container asks for none
/// (`DefaultMilliCPURequest`, `DefaultMemoryRequest`).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// A quantity in the unit the scheduler counts `name` in: millicores for cpu, whole units
/// (rounded up, as `Quantity.Value()` does) for everything else.
pub fn quantity_value(name: &str, q: &str) -> i64 {
    if name == "cpu" {
        apimachinery::quantity::milli_value(q)
    } else {
        apimachinery::quantity::value(q)
    }
}

/// A vector of resources (kube-scheduler's `framework.Resource`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resource {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    /// Extended and hugepage resources (`nvidia.com/gpu`, …) in whole units.
    pub scalar: BTreeMap<String, i64>,
}

impl Resource {
    pub fn from_list(list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>) -> Self {
        let mut r = Resource::default();
        for (name, q) in list.into_iter().flatten() {
            let v = quantity_value(name, &q.0);
            match name.as_str() {
                "cpu" => r.milli_cpu += v,
                "memory" => r.memory += v,
                "ephemeral-storage" => r.ephemeral_storage += v,
                "pods" => {}
                other if is_scalar_resource(other) => *r.scalar.entry(other.to_string()).or_default() += v,
                _ => {}
            }
        }
        r
    }
    pub fn add(&mut self, o: &Resource) {
        self.milli_cpu += o.milli_cpu;
        self.memory += o.memory;
        self.ephemeral_storage += o.ephemeral_storage;
        for (k, v) in &o.scalar {
            *self.scalar.entry(k.clone()).or_default() += v;
        }
    }
    pub fn sub(&mut self, o: &Resource) {
        self.milli_cpu -= o.milli_cpu;
        self.memory -= o.memory;
        self.ephemeral_storage -= o.ephemeral_storage;
        for (k, v) in &o.scalar {
            *self.scalar.entry(k.clone()).or_default() -= v;
        }
    }
    /// Component-wise maximum.
    pub fn max_with(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.max(o.milli_cpu);
        self.memory = self.memory.max(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(o.ephemeral_storage);
        for (k, v) in &o.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }
}

/// Extended resources (a domain-qualified name outside `kubernetes.io/`), hugepages and
/// attachable volumes are "scalar" resources.
pub fn is_scalar_resource(name: &str) -> bool {
    name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || (name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests."))
}

/// A compiled `metav1.LabelSelector` (`apimachinery::labels`): an absent or invalid one
/// selects nothing, an empty one everything — Kubernetes' semantics for affinity and spread.
pub use apimachinery::labels::Selector;

/// The selector of an affinity term or spread constraint, with `matchLabelKeys` /
/// `mismatchLabelKeys` added as `key in (pod's value)` / `key notin (pod's value)`.
pub fn term_selector(
    sel: Option<&LabelSelector>,
    labels: &Labels,
    match_keys: &[String],
    mismatch_keys: &[String],
) -> Selector {
    let mut s = labels::selector_or_nothing(sel);
    for k in match_keys {
        if let Some(v) = labels.get(k) {
            s = s.with_requirement(Requirement { key: k.clone(), op: Operator::In(vec![v.clone()]) });
        }
    }
    for k in mismatch_keys {
        if let Some(v) = labels.get(k) {
            s = s.with_requirement(Requirement { key: k.clone(), op: Operator::NotIn(vec![v.clone()]) });
        }
    }
    s
}

/// `key=value` when that is the selector's only requirement.
pub fn single_equality(s: &Selector) -> Option<(&str, &str)> {
    match s.requirements() {
        [Requirement { key, op: Operator::Equals(v) }] => Some((key.as_str(), v.as_str())),
        [Requirement { key, op: Operator::In(vals) }] if vals.len() == 1 => Some((key.as_str(), vals[0].as_str())),
        _ => None,
    }
}

pub use apimachinery::scheduling::{node_selector_matches, node_selector_term_matches};

/// One pod (anti-)affinity term, resolved against the pod that carries it.
#[derive(Clone, Debug)]
pub struct AffinityTerm {
    /// Namespaces the term looks at; empty with `all_namespaces` false means the pod's own.
    pub namespaces: Vec<String>,
    /// `namespaceSelector: {}` — every namespace.
    pub all_namespaces: bool,
    pub selector: Selector,
    pub topology_key: String,
    pub weight: i32,
}

impl AffinityTerm {
    fn new(t: &k8s_openapi::api::core::v1::PodAffinityTerm, pod_ns: &str, labels: &Labels, weight: i32) -> Self {
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        // Namespace labels are not watched: an empty namespaceSelector means all
        // namespaces; a non-empty one is approximated as "the listed namespaces".
        let all_namespaces = t.namespace_selector.as_ref().is_some_and(|s| {
            s.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && s.match_expressions.as_ref().is_none_or(|m| m.is_empty())
        });
        if namespaces.is_empty() && t.namespace_selector.is_none() {
            namespaces.push(pod_ns.to_string());
        }
        let selector = term_selector(
            t.label_selector.as_ref(),
            labels,
            t.match_label_keys.as_deref().unwrap_or_default(),
            t.mismatch_label_keys.as_deref().unwrap_or_default(),
        );
        AffinityTerm { namespaces, all_namespaces, selector, topology_key: t.topology_key.clone(), weight }
    }
    /// Identity of the term (pods of one workload share it).
    pub fn signature(&self) -> String {
        format!("{:?}|{}|{:?}|{}", self.namespaces, self.all_namespaces, self.selector, self.topology_key)
    }
    /// The [`Snapshot::topo_index`] key when the term selects exactly `key=value` in one namespace.
    pub fn index_key(&self) -> Option<String> {
        if self.all_namespaces || self.namespaces.len() != 1 {
            return None;
        }
        single_equality(&self.selector).map(|(k, v)| index_key(&self.namespaces[0], k, v))
    }
    /// Does the term select `pod`?
    pub fn matches(&self, pod: &PodInfo) -> bool {
        (self.all_namespaces || self.namespaces.contains(&pod.namespace)) && self.selector.matches(&pod.labels)
    }
}

/// A topology spread constraint, compiled.
#[derive(Clone, Debug)]
pub struct SpreadConstraint {
    pub max_skew: i32,
    pub topology_key: String,
    pub hard: bool,
    pub selector: Selector,
    pub min_domains: i32,
    /// nodeAffinityPolicy: Honor (default) — only nodes matching the pod's node affinity count.
    pub honor_node_affinity: bool,
    /// nodeTaintsPolicy: Honor — only nodes whose taints the pod tolerates count (default Ignore).
    pub honor_taints: bool,
}

/// A host port the pod asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, o: &HostPort) -> bool {
        let wild = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == o.port && self.protocol == o.protocol && (self.ip == o.ip || wild(&self.ip) || wild(&o.ip))
    }
}

/// Everything the scheduler needs from a pod, computed once per pod version.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub pod: Arc<Pod>,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: Labels,
    pub node_name: String,
    pub scheduler_name: String,
    pub priority: i32,
    pub requests: Resource,
    /// cpu and memory requests with kube-scheduler's non-zero defaults, for scoring.
    pub non_zero_cpu: i64,
    pub non_zero_mem: i64,
    pub host_ports: Vec<HostPort>,
    pub tolerations: Vec<Toleration>,
    pub node_selector: Labels,
    pub required_node_affinity: Option<NodeSelector>,
    pub preferred_node_affinity: Vec<(i32, k8s_openapi::api::core::v1::NodeSelectorTerm)>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<AffinityTerm>,
    pub preferred_anti_affinity: Vec<AffinityTerm>,
    pub spread: Vec<SpreadConstraint>,
    pub images: Vec<String>,
    pub terminating: bool,
    pub terminal: bool,
    /// `spec.schedulingGates` is not empty: not ready to be scheduled.
    pub gated: bool,
    /// The PersistentVolumeClaims its volumes name.
    pub claims: Vec<String>,
    /// What the VolumeBinding plugin knows of those claims (read before each attempt).
    pub volumes: Option<Arc<super::volumebinding::PodVolumes>>,
}

impl PodInfo {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
    /// Terms InterPodAffinity scoring reads from existing pods (required affinity and
    /// preferred terms; required anti-affinity only filters).
    pub fn has_affinity(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }

    pub fn new(pod: Arc<Pod>) -> Self {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let labels = meta.labels.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();

        // Requests: max(sum of app containers + sidecars, each init container + the
        // sidecars started before it) + overhead, as resource helpers do.
        let mut requests = Resource::default();
        let (mut non_zero_cpu, mut non_zero_mem) = (0i64, 0i64);
        let mut host_ports = Vec::new();
        let mut images = Vec::new();
        for c in &spec.containers {
            let r = Resource::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
            non_zero_cpu += if r.milli_cpu == 0 { DEFAULT_MILLI_CPU_REQUEST } else { r.milli_cpu };
            non_zero_mem += if r.memory == 0 { DEFAULT_MEMORY_REQUEST } else { r.memory };
            requests.add(&r);
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                    host_ports.push(HostPort {
                        ip: p.host_ip.clone().unwrap_or_default(),
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        port: hp,
                    });
                }
            }
            if let Some(img) = &c.image {
                images.push(normalize_image(img));
            }
        }
        let mut sidecars = Resource::default();
        let mut init_max = Resource::default();
        for c in spec.init_containers.iter().flatten() {
            let r = Resource::from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref()));
            if c.restart_policy.as_deref() == Some("Always") {
                sidecars.add(&r);
                requests.add(&r);
                non_zero_cpu += r.milli_cpu;
                non_zero_mem += r.memory;
            } else {
                let mut with_sidecars = r.clone();
                with_sidecars.add(&sidecars);
                init_max.max_with(&with_sidecars);
            }
        }
        requests.max_with(&init_max);
        non_zero_cpu = non_zero_cpu.max(init_max.milli_cpu);
        non_zero_mem = non_zero_mem.max(init_max.memory);
        if let Some(overhead) = &spec.overhead {
            let o = Resource::from_list(Some(overhead));
            requests.add(&o);
            non_zero_cpu += o.milli_cpu;
            non_zero_mem += o.memory;
        }

        let aff = spec.affinity.clone().unwrap_or_default();
        let na = aff.node_affinity.unwrap_or_default();
        let pa = aff.pod_affinity.unwrap_or_default();
        let paa = aff.pod_anti_affinity.unwrap_or_default();
        let terms = |ts: Option<Vec<k8s_openapi::api::core::v1::PodAffinityTerm>>| -> Vec<AffinityTerm> {
            ts.unwrap_or_default().iter().map(|t| AffinityTerm::new(t, &namespace, &labels, 1)).collect()
        };
        let weighted = |ts: Option<Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| -> Vec<AffinityTerm> {
            ts.unwrap_or_default()
                .iter()
                .map(|t| AffinityTerm::new(&t.pod_affinity_term, &namespace, &labels, t.weight))
                .collect()
        };
        let spread = spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .map(|c| SpreadConstraint {
                max_skew: c.max_skew.max(1),
                topology_key: c.topology_key.clone(),
                hard: c.when_unsatisfiable != "ScheduleAnyway",
                selector: term_selector(
                    c.label_selector.as_ref(),
                    &labels,
                    c.match_label_keys.as_deref().unwrap_or_default(),
                    &[],
                ),
                min_domains: c.min_domains.unwrap_or(1).max(1),
                honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            })
            .collect();

        PodInfo {
            namespace: namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            node_name: spec.node_name.clone().unwrap_or_default(),
            scheduler_name: spec.scheduler_name.clone().unwrap_or_else(|| "default-scheduler".into()),
            priority: spec.priority.unwrap_or(0),
            non_zero_cpu,
            non_zero_mem,
            requests,
            host_ports,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            required_node_affinity: na.required_during_scheduling_ignored_during_execution,
            preferred_node_affinity: na
                .preferred_during_scheduling_ignored_during_execution
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.weight, p.preference))
                .collect(),
            required_affinity: terms(pa.required_during_scheduling_ignored_during_execution),
            required_anti_affinity: terms(paa.required_during_scheduling_ignored_during_execution),
            preferred_affinity: weighted(pa.preferred_during_scheduling_ignored_during_execution),
            preferred_anti_affinity: weighted(paa.preferred_during_scheduling_ignored_during_execution),
            spread,
            images,
            terminating: meta.deletion_timestamp.is_some(),
            gated: spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()),
            terminal: phase == "Succeeded" || phase == "Failed",
            claims: spec
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()))
                .collect(),
            volumes: None,
            labels,
            pod,
        }
    }
}

/// `nginx` → `nginx:latest`, as node status reports image names.
pub fn normalize_image(img: &str) -> String {
    let last = img.rsplit('/').next().unwrap_or(img);
    if last.contains(':') || last.contains('@') {
        img.to_string()
    } else {
        format!("{img}:latest")
    }
}

/// Everything the scheduler needs from a node.
#[derive(Clone, Debug, Default)]
pub struct NodeData {
    pub name: String,
    pub labels: Labels,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: Resource,
    pub allowed_pods: i64,
    /// Image name → size in bytes, from `status.images`.
    pub images: HashMap<String, i64>,
}

impl NodeData {
    pub fn new(node: &Node) -> Self {
        let spec = node.spec.clone().unwrap_or_default();
        let status = node.status.clone().unwrap_or_default();
        let alloc = status.allocatable.as_ref().or(status.capacity.as_ref());
        let allowed_pods = alloc.and_then(|a| a.get("pods")).map(|q| quantity_value("pods", &q.0)).unwrap_or(110);
        let mut images = HashMap::new();
        for img in status.images.iter().flatten() {
            for n in img.names.iter().flatten() {
                images.insert(n.clone(), img.size_bytes.unwrap_or(0));
            }
        }
        NodeData {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec.taints.unwrap_or_default(),
            unschedulable: spec.unschedulable.unwrap_or(false),
            allocatable: Resource::from_list(alloc),
            allowed_pods,
            images,
        }
    }
    /// Did something change that could make a pod fit that did not before?
    pub fn scheduling_relevant_change(&self, newer: &NodeData) -> bool {
        self.labels != newer.labels
            || self.taints != newer.taints
            || self.unschedulable != newer.unschedulable
            || self.allocatable != newer.allocatable
            || self.allowed_pods != newer.allowed_pods
    }
}

/// A node with the pods assigned or assumed to it and their aggregates.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    /// `None` while pods are known to be bound to a node the watch has not shown yet.
    pub node: Option<NodeData>,
    pub pods: Vec<Arc<PodInfo>>,
    pub requested: Resource,
    pub non_zero_cpu: i64,
    pub non_zero_mem: i64,
    pub used_ports: Vec<HostPort>,
    /// Pods with any (anti-)affinity term; pods with required anti-affinity.
    pub pods_with_affinity: usize,
    pub pods_with_required_anti_affinity: usize,
}

impl NodeInfo {
    pub fn with_node(node: NodeData) -> Self {
        NodeInfo { node: Some(node), ..Default::default() }
    }
    pub fn name(&self) -> &str {
        self.node.as_ref().map(|n| n.name.as_str()).unwrap_or_default()
    }
    pub fn labels(&self) -> &Labels {
        static EMPTY: Labels = BTreeMap::new();
        self.node.as_ref().map(|n| &n.labels).unwrap_or(&EMPTY)
    }
    pub fn add_pod(&mut self, p: Arc<PodInfo>) {
        self.requested.add(&p.requests);
        self.non_zero_cpu += p.non_zero_cpu;
        self.non_zero_mem += p.non_zero_mem;
        self.used_ports.extend(p.host_ports.iter().cloned());
        if p.has_affinity() {
            self.pods_with_affinity += 1;
        }
        if !p.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        self.pods.push(p);
    }
    /// Remove the pod with this uid (or namespace/name when uids are empty); true if it was there.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| p.namespace == namespace && p.name == name)?;
        let p = self.pods.swap_remove(i);
        self.requested.sub(&p.requests);
        self.non_zero_cpu -= p.non_zero_cpu;
        self.non_zero_mem -= p.non_zero_mem;
        for hp in &p.host_ports {
            if let Some(j) = self.used_ports.iter().position(|u| u == hp) {
                self.used_ports.swap_remove(j);
            }
        }
        if p.has_affinity() {
            self.pods_with_affinity -= 1;
        }
        if !p.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity -= 1;
        }
        Some(p)
    }
}

/// Every node's [`NodeInfo`], in a stable order, with an index by name and a few
/// cluster-wide aggregates. The scheduling decision is a pure function of this.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeInfo>,
    pub index: HashMap<String, usize>,
    /// Image → number of nodes that have it (ImageLocality's spread factor).
    pub image_nodes: HashMap<String, usize>,
    /// Number of nodes that have a `node` (not placeholders).
    pub num_nodes: usize,
    pub pods_with_affinity: usize,
    pub pods_with_required_anti_affinity: usize,
    /// Pod counts per topology domain: `namespace\0key\0value` of a pod label →
    /// topology key (a node label) → its value → pods (zero entries removed). Lets
    /// InterPodAffinity and PodTopologySpread count `key=value` selectors without scanning pods.
    pub topo_index: HashMap<String, HashMap<String, HashMap<String, i64>>>,
    /// Node label key → value → number of nodes (topology domains).
    pub topology_values: HashMap<String, HashMap<String, usize>>,
    /// Existing pods' required anti-affinity terms, grouped by term: the term and the pods
    /// carrying it per value of its topology key.
    pub existing_anti: HashMap<String, ExistingAntiTerm>,
}

#[derive(Clone, Debug)]
pub struct ExistingAntiTerm {
    pub term: AffinityTerm,
    pub counts: HashMap<String, i64>,
    pub pods: usize,
}

pub fn index_key(ns: &str, k: &str, v: &str) -> String {
    format!("{ns}\0{k}\0{v}")
}

fn bump(m: &mut HashMap<String, i64>, k: &str, delta: i64) {
    match m.get_mut(k) {
        Some(c) => {
            *c += delta;
            if *c == 0 {
                m.remove(k);
            }
        }
        None if delta != 0 => {
            m.insert(k.to_string(), delta);
        }
        None => {}
    }
}

/// Add (`delta` 1) or remove (-1) a pod on a node with `node_labels` from the indices.
fn index_pod(
    topo: &mut HashMap<String, HashMap<String, HashMap<String, i64>>>,
    anti: &mut HashMap<String, ExistingAntiTerm>,
    node_labels: &Labels,
    p: &PodInfo,
    delta: i64,
) {
    if node_labels.is_empty() {
        return;
    }
    for (k, v) in &p.labels {
        let per_key = topo.entry(index_key(&p.namespace, k, v)).or_default();
        for (tk, tv) in node_labels {
            match per_key.get_mut(tk) {
                Some(m) => bump(m, tv, delta),
                None => {
                    let mut m = HashMap::new();
                    bump(&mut m, tv, delta);
                    per_key.insert(tk.clone(), m);
                }
            }
        }
    }
    for t in &p.required_anti_affinity {
        let Some(tv) = node_labels.get(&t.topology_key) else { continue };
        let e = anti.entry(t.signature()).or_insert_with(|| ExistingAntiTerm {
            term: t.clone(),
            counts: HashMap::new(),
            pods: 0,
        });
        bump(&mut e.counts, tv, delta);
        e.pods = (e.pods as i64 + delta).max(0) as usize;
    }
}

impl Snapshot {
    fn count_topology(&mut self, labels: &Labels, delta: i64) {
        for (k, v) in labels {
            let m = self.topology_values.entry(k.clone()).or_default();
            let c = m.entry(v.clone()).or_default();
            *c = (*c as i64 + delta).max(0) as usize;
            if *c == 0 {
                m.remove(v);
            }
        }
    }
    /// Re-index the pods of node `i` after its labels changed from `old` to `new`.
    fn reindex(&mut self, i: usize, old: &Labels, new: &Labels) {
        if old == new {
            return;
        }
        let Snapshot { nodes, topo_index, existing_anti, .. } = self;
        for p in &nodes[i].pods {
            index_pod(topo_index, existing_anti, old, p, -1);
            index_pod(topo_index, existing_anti, new, p, 1);
        }
    }
    pub fn get(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|i| &self.nodes[*i])
    }
    fn slot(&mut self, name: &str) -> usize {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        self.nodes.push(NodeInfo::default());
        self.index.insert(name.to_string(), self.nodes.len() - 1);
        self.nodes.len() - 1
    }
    /// Add or replace a node.
    pub fn set_node(&mut self, node: NodeData) {
        let i = self.slot(&node.name);
        let old = self.nodes[i].node.take();
        match &old {
            None => self.num_nodes += 1,
            Some(o) => {
                for img in o.images.keys() {
                    if let Some(c) = self.image_nodes.get_mut(img) {
                        *c = c.saturating_sub(1);
                    }
                }
            }
        }
        for img in node.images.keys() {
            *self.image_nodes.entry(img.clone()).or_default() += 1;
        }
        let old_labels = old.map(|o| o.labels).unwrap_or_default();
        self.count_topology(&old_labels, -1);
        self.count_topology(&node.labels.clone(), 1);
        let new_labels = node.labels.clone();
        self.reindex(i, &old_labels, &new_labels);
        self.nodes[i].node = Some(node);
    }
    /// Remove a node; its pods stay in a placeholder until they are deleted.
    pub fn remove_node(&mut self, name: &str) {
        let Some(&i) = self.index.get(name) else { return };
        if let Some(o) = self.nodes[i].node.take() {
            self.num_nodes -= 1;
            for img in o.images.keys() {
                if let Some(c) = self.image_nodes.get_mut(img) {
                    *c = c.saturating_sub(1);
                }
            }
            self.count_topology(&o.labels, -1);
            self.reindex(i, &o.labels, &Labels::new());
        }
        if self.nodes[i].pods.is_empty() {
            self.drop_slot(i);
        }
    }
    fn drop_slot(&mut self, i: usize) {
        let name = self.nodes[i].pods.first().map(|p| p.node_name.clone());
        let name = self.index.iter().find(|(_, v)| **v == i).map(|(k, _)| k.clone()).or(name);
        if let Some(n) = name {
            self.index.remove(&n);
        }
        self.nodes.swap_remove(i);
        if i < self.nodes.len() {
            let moved = self.index.iter().find(|(_, v)| **v == self.nodes.len()).map(|(k, _)| k.clone());
            if let Some(k) = moved {
                self.index.insert(k, i);
            }
        }
    }
    pub fn add_pod(&mut self, node: &str, p: Arc<PodInfo>) {
        let i = self.slot(node);
        if p.has_affinity() {
            self.pods_with_affinity += 1;
        }
        if !p.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        let Snapshot { nodes, topo_index, existing_anti, .. } = self;
        if let Some(n) = &nodes[i].node {
            index_pod(topo_index, existing_anti, &n.labels, &p, 1);
        }
        self.nodes[i].add_pod(p);
    }
    pub fn remove_pod(&mut self, node: &str, namespace: &str, name: &str) -> Option<Arc<PodInfo>> {
        let i = *self.index.get(node)?;
        let p = self.nodes[i].remove_pod(namespace, name)?;
        let Snapshot { nodes, topo_index, existing_anti, .. } = self;
        if let Some(n) = &nodes[i].node {
            index_pod(topo_index, existing_anti, &n.labels, &p, -1);
        }
        if p.has_affinity() {
            self.pods_with_affinity -= 1;
        }
        if !p.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity -= 1;
        }
        if self.nodes[i].node.is_none() && self.nodes[i].pods.is_empty() {
            self.drop_slot(i);
        }
        Some(p)
    }
}

#[cfg(test)]
pub mod testutil {
    //! Builders for pods and nodes in unit tests.
    use super::*;
    use serde_json::{json, Value};

    pub fn pod(v: Value) -> Arc<PodInfo> {
        let mut v = v;
        if v.pointer("/metadata/namespace").is_none() {
            v["metadata"]["namespace"] = json!("default");
        }
        if v.pointer("/spec/containers").is_none() {
            v["spec"]["containers"] = json!([{"name": "c", "image": "busybox"}]);
        }
        let p: Pod = serde_json::from_value(v).expect("test pod");
        Arc::new(PodInfo::new(Arc::new(p)))
    }
    /// A pod named `name` requesting cpu/memory.
    pub fn pod_req(name: &str, cpu: &str, mem: &str) -> Arc<PodInfo> {
        pod(json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}}))
    }
    pub fn node(v: Value) -> NodeData {
        let n: Node = serde_json::from_value(v).expect("test node");
        NodeData::new(&n)
    }
    /// A node with 4 cpu, 8Gi, 110 pods and the given labels.
    pub fn node_l(name: &str, labels: Value) -> NodeData {
        node(json!({"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
    }
    pub fn snapshot(nodes: Vec<NodeData>, pods: Vec<(&str, Arc<PodInfo>)>) -> Snapshot {
        let mut s = Snapshot::default();
        for n in nodes {
            s.set_node(n);
        }
        for (n, p) in pods {
            s.add_pod(n, p);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities() {
        assert_eq!(quantity_value("cpu", "100m"), 100);
        assert_eq!(quantity_value("cpu", "1.5"), 1500);
        assert_eq!(quantity_value("memory", "128Mi"), 128 * 1024 * 1024);
        assert_eq!(quantity_value("memory", "1G"), 1_000_000_000);
        assert_eq!(quantity_value("memory", "1e3"), 1000);
        assert_eq!(quantity_value("cpu", "junk"), 0);
    }

    #[test]
    fn pod_requests_include_init_sidecars_and_overhead() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "200m", "nvidia.com/gpu": "1"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"memory": "1Gi"}}}],
            "initContainers": [{"name": "init", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
            "overhead": {"cpu": "10m"}}}));
        assert_eq!(p.requests.milli_cpu, 1010);
        assert_eq!(p.requests.memory, 1 << 30);
        assert_eq!(p.requests.scalar.get("nvidia.com/gpu"), Some(&1));
        // b asks for no cpu: 100m default for scoring
        assert_eq!(p.non_zero_cpu, 1010);
    }

    #[test]
    fn selector_semantics() {
        let l: Labels = [("app".to_string(), "web".to_string())].into();
        assert!(!term_selector(None, &l, &[], &[]).matches(&l));
        assert!(term_selector(Some(&LabelSelector::default()), &l, &[], &[]).matches(&l));
        let s: LabelSelector = serde_json::from_value(json!({"matchExpressions": [
            {"key": "app", "operator": "In", "values": ["web", "api"]},
            {"key": "tier", "operator": "DoesNotExist"}]}))
        .unwrap();
        assert!(term_selector(Some(&s), &l, &[], &[]).matches(&l));
        // An unknown operator selects nothing, whatever the rest says.
        let bad: LabelSelector = serde_json::from_value(json!({"matchExpressions": [
            {"key": "tier", "operator": "DoesNotExist"}, {"key": "app", "operator": "Bogus"}]}))
        .unwrap();
        assert!(!term_selector(Some(&bad), &l, &[], &[]).matches(&l));
        // matchLabelKeys narrow to the pod's value; mismatchLabelKeys exclude it.
        let other: Labels = [("app".to_string(), "api".to_string())].into();
        let everything = LabelSelector::default();
        let same = term_selector(Some(&everything), &l, &["app".to_string()], &[]);
        assert!(same.matches(&l) && !same.matches(&other));
        assert_eq!(single_equality(&same), Some(("app", "web")));
        let differ = term_selector(Some(&everything), &l, &[], &["app".to_string()]);
        assert!(!differ.matches(&l) && differ.matches(&other));
        assert_eq!(single_equality(&differ), None);
        // A selector of nothing stays one whatever keys are added.
        assert!(!term_selector(None, &l, &["app".to_string()], &[]).matches(&l));
        let m: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "web"}})).unwrap();
        assert_eq!(single_equality(&term_selector(Some(&m), &l, &[], &[])), Some(("app", "web")));
    }

    #[test]
    fn snapshot_tracks_pods_and_nodes() {
        let mut s = snapshot(vec![node_l("a", json!({})), node_l("b", json!({}))], vec![]);
        s.add_pod("a", pod_req("p1", "1", "1Gi"));
        s.add_pod("ghost", pod_req("p2", "1", "1Gi"));
        assert_eq!(s.num_nodes, 2);
        assert_eq!(s.get("a").unwrap().requested.milli_cpu, 1000);
        assert!(s.get("ghost").unwrap().node.is_none());
        s.remove_pod("ghost", "default", "p2");
        assert!(s.get("ghost").is_none());
        s.remove_node("b");
        assert_eq!(s.num_nodes, 1);
        assert_eq!(s.get("a").unwrap().pods.len(), 1);
        s.remove_pod("a", "default", "p1");
        assert_eq!(s.get("a").unwrap().requested.milli_cpu, 0);
    }

    #[test]
    fn topology_index_follows_pods_and_node_labels() {
        let w = |n: &str| pod(json!({"metadata": {"name": n, "labels": {"app": "w"}}}));
        let mut s = snapshot(
            vec![node_l("a", json!({"zone": "z1"})), node_l("b", json!({"zone": "z2"}))],
            vec![("a", w("w1")), ("b", w("w2")), ("b", w("w3"))],
        );
        let zone = |s: &Snapshot| s.topo_index[&index_key("default", "app", "w")]["zone"].clone();
        assert_eq!(zone(&s), HashMap::from([("z1".to_string(), 1), ("z2".to_string(), 2)]));
        s.set_node(node_l("a", json!({"zone": "z3"})));
        assert_eq!(zone(&s), HashMap::from([("z3".to_string(), 1), ("z2".to_string(), 2)]));
        s.remove_pod("b", "default", "w2");
        s.remove_node("a");
        assert_eq!(zone(&s), HashMap::from([("z2".to_string(), 1)]));
        assert_eq!(s.topology_values["zone"].len(), 1);
    }
}
