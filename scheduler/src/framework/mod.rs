//! The scheduling framework: one decision for one pod is the pure function
//! [`schedule`]`(pod, snapshot, profile, state) -> Result<node, FitError>` — pre-filter,
//! filter (with kube-scheduler's node sampling), score, select — over a [`Snapshot`].
//! Profiles choose the plugins and weights, or one of the simple placement policies.

pub mod filters;
pub mod scores;
pub mod types;
pub mod volumebinding;

use std::collections::BTreeMap;
use std::fmt;

use rand::Rng;

pub use types::{NodeData, NodeInfo, PodInfo, Snapshot};

/// Filter plugin names, in kube-scheduler's default order.
pub const FILTERS: &[&str] = &[
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "VolumeBinding",
    "PodTopologySpread",
    "InterPodAffinity",
];

/// Score plugins with kube-scheduler's default weights.
pub const DEFAULT_SCORES: &[(&str, i64)] = &[
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodeResourcesFit", 1),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
];

/// How a profile picks among the feasible nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// kube-scheduler: score and take the best (ties at random).
    FilterScore,
    /// The feasible nodes in turn, by name.
    RoundRobin,
    /// Any feasible node.
    Random,
    /// Prefer nodes whose labels match the pod's labels, else random.
    NodeAffinityFirst,
}

/// A scheduling profile (`KubeSchedulerProfile`).
#[derive(Clone, Debug)]
pub struct Profile {
    pub scheduler_name: String,
    pub algorithm: Algorithm,
    /// Enabled filters.
    pub filters: Vec<String>,
    /// Enabled scores and weights.
    pub scores: Vec<(String, i64)>,
    /// `percentageOfNodesToScore`; 0 = adaptive (kube's default).
    pub percentage_of_nodes_to_score: u32,
}

impl Profile {
    pub fn new(scheduler_name: &str, algorithm: Algorithm) -> Self {
        Profile {
            scheduler_name: scheduler_name.to_string(),
            algorithm,
            filters: FILTERS.iter().map(|s| s.to_string()).collect(),
            scores: DEFAULT_SCORES.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
            percentage_of_nodes_to_score: 0,
        }
    }
    fn filter_on(&self, name: &str) -> bool {
        self.filters.iter().any(|f| f == name)
    }
}

impl Algorithm {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "default-scheduler" | "default" | "filter-score" => Algorithm::FilterScore,
            "round-robin" => Algorithm::RoundRobin,
            "random" => Algorithm::Random,
            "node-affinity-first" | "node-affinity" => Algorithm::NodeAffinityFirst,
            _ => return None,
        })
    }
}

/// Per-profile state carried between decisions (kube's `nextStartNodeIndex`, the
/// round-robin position).
#[derive(Clone, Debug, Default)]
pub struct ProfileState {
    pub next_start_node_index: usize,
    pub last_round_robin: String,
}

/// Why a pod fits on no node: kube-scheduler's `FitError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitError {
    pub num_all_nodes: usize,
    /// reason → number of nodes that failed for it.
    pub reasons: BTreeMap<String, usize>,
    /// Filter plugins that rejected some node (for requeueing on relevant events).
    pub plugins: Vec<&'static str>,
}

impl fmt::Display for FitError {
    /// `0/3 nodes are available: 1 node(s) had untolerated taint {a: b}, 2 Insufficient cpu.`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.num_all_nodes == 0 {
            return write!(f, "no nodes available to schedule pods");
        }
        let mut parts: Vec<String> = self.reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
        parts.sort();
        write!(f, "0/{} nodes are available: {}.", self.num_all_nodes, parts.join(", "))
    }
}

impl std::error::Error for FitError {}

/// kube-scheduler's `numFeasibleNodesToFind`: all nodes below 100, else an adaptive
/// percentage (50% − nodes/125, at least 5%), at least 100 nodes.
pub fn num_feasible_nodes_to_find(num_all: usize, percentage: u32) -> usize {
    const MIN_FEASIBLE: usize = 100;
    if num_all < MIN_FEASIBLE {
        return num_all;
    }
    let mut pct = percentage as i64;
    if pct == 0 {
        pct = (50 - num_all as i64 / 125).max(5);
    }
    if pct >= 100 {
        return num_all;
    }
    ((num_all as i64 * pct / 100) as usize).max(MIN_FEASIBLE)
}

/// Run the filters of `profile` for one node; `Err` carries the first failing plugin
/// and its reasons.
fn run_filters(
    pod: &PodInfo,
    ni: &NodeInfo,
    profile: &Profile,
    inter: Option<&filters::InterPodState>,
    spread: Option<&(Vec<usize>, filters::SpreadState)>,
) -> Result<(), (&'static str, filters::Reasons)> {
    let Some(node) = &ni.node else { return Err(("NodeName", vec![filters::ERR_NODE_NAME.into()])) };
    for name in FILTERS {
        if !profile.filter_on(name) {
            continue;
        }
        let r = match *name {
            "NodeUnschedulable" => filters::node_unschedulable(pod, node),
            "NodeName" => filters::node_name(pod, node),
            "TaintToleration" => filters::taint_toleration(pod, node),
            "NodeAffinity" => filters::node_affinity(pod, node),
            "NodePorts" => filters::node_ports(pod, ni),
            "NodeResourcesFit" => filters::node_resources_fit(pod, ni, node),
            "VolumeBinding" => match &pod.volumes {
                Some(v) => volumebinding::filter(v, &node.name, &node.labels),
                None => Ok(()),
            },
            "PodTopologySpread" => match spread {
                Some((idx, st)) => filters::pod_topology_spread(pod, node, idx, st),
                None => Ok(()),
            },
            "InterPodAffinity" => match inter {
                Some(st) => filters::inter_pod_affinity(pod, node, st),
                None => Ok(()),
            },
            _ => Ok(()),
        };
        r.map_err(|reasons| (*name, reasons))?;
    }
    Ok(())
}

/// Schedule one pod: the name of the chosen node, or why none fits.
pub fn schedule(
    pod: &PodInfo,
    snap: &Snapshot,
    profile: &Profile,
    state: &mut ProfileState,
    rng: &mut impl Rng,
) -> Result<String, FitError> {
    let all = snap.nodes.len();
    if snap.num_nodes == 0 {
        return Err(FitError { num_all_nodes: 0, reasons: BTreeMap::new(), plugins: Vec::new() });
    }
    let inter = if profile.filter_on("InterPodAffinity") { filters::inter_pod_pre_filter(pod, snap) } else { None };
    let spread = if profile.filter_on("PodTopologySpread") { filters::spread_pre(pod, snap, true) } else { None };

    // The report-4.4 policies choose among every feasible node; kube's own algorithm
    // stops once it has found enough.
    let to_find = if profile.algorithm == Algorithm::FilterScore {
        num_feasible_nodes_to_find(snap.num_nodes, profile.percentage_of_nodes_to_score)
    } else {
        snap.num_nodes
    };
    let mut feasible: Vec<usize> = Vec::with_capacity(to_find.min(all));
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut plugins: Vec<&'static str> = Vec::new();
    let start = state.next_start_node_index % all;
    let mut processed = 0;
    for k in 0..all {
        let i = (start + k) % all;
        let ni = &snap.nodes[i];
        if ni.node.is_none() {
            continue;
        }
        processed = k + 1;
        match run_filters(pod, ni, profile, inter.as_ref(), spread.as_ref()) {
            Ok(()) => {
                feasible.push(i);
                if feasible.len() >= to_find {
                    break;
                }
            }
            Err((plugin, rs)) => {
                if !plugins.contains(&plugin) {
                    plugins.push(plugin);
                }
                for r in rs {
                    *reasons.entry(r).or_default() += 1;
                }
            }
        }
    }
    state.next_start_node_index = (start + processed) % all;
    if feasible.is_empty() {
        return Err(FitError { num_all_nodes: snap.num_nodes, reasons, plugins });
    }
    let name = |i: usize| snap.nodes[i].name().to_string();
    match profile.algorithm {
        Algorithm::FilterScore => {
            if feasible.len() == 1 {
                return Ok(name(feasible[0]));
            }
            let totals = score(pod, snap, profile, &feasible);
            Ok(name(select_host(&feasible, &totals, rng)))
        }
        Algorithm::Random => Ok(name(feasible[rng.random_range(0..feasible.len())])),
        Algorithm::RoundRobin => {
            let mut names: Vec<String> = feasible.iter().map(|i| name(*i)).collect();
            names.sort();
            let chosen = names.iter().find(|n| **n > state.last_round_robin).unwrap_or(&names[0]).clone();
            state.last_round_robin = chosen.clone();
            Ok(chosen)
        }
        Algorithm::NodeAffinityFirst => {
            let shared = |i: usize| {
                let labels = snap.nodes[i].labels();
                pod.labels.iter().filter(|(k, v)| labels.get(*k) == Some(*v)).count()
            };
            let best = feasible.iter().map(|i| shared(*i)).max().unwrap_or(0);
            let pool: Vec<usize> = feasible.iter().copied().filter(|i| shared(*i) == best).collect();
            Ok(name(pool[rng.random_range(0..pool.len())]))
        }
    }
}

/// The weighted sum of every enabled score plugin for each feasible node.
pub fn score(pod: &PodInfo, snap: &Snapshot, profile: &Profile, feasible: &[usize]) -> Vec<i64> {
    let mut totals = vec![0i64; feasible.len()];
    let nodes = || feasible.iter().map(|i| &snap.nodes[*i]);
    let mut add = |w: i64, scores: Vec<i64>| {
        for (t, s) in totals.iter_mut().zip(scores) {
            *t += w * s;
        }
    };
    for (plugin, w) in &profile.scores {
        let w = *w;
        if w == 0 {
            continue;
        }
        match plugin.as_str() {
            "NodeResourcesFit" => add(w, nodes().map(|ni| scores::least_allocated(pod, ni)).collect()),
            "NodeResourcesBalancedAllocation" => {
                add(w, nodes().map(|ni| scores::balanced_allocation(pod, ni)).collect())
            }
            "NodeAffinity" if !pod.preferred_node_affinity.is_empty() => {
                let mut s: Vec<i64> = nodes().map(|ni| scores::node_affinity_preferred(pod, ni)).collect();
                scores::default_normalize(&mut s, false);
                add(w, s)
            }
            "TaintToleration" => {
                let mut s: Vec<i64> = nodes().map(|ni| scores::taint_toleration_preferred(pod, ni)).collect();
                scores::default_normalize(&mut s, true);
                add(w, s)
            }
            "ImageLocality" => add(w, nodes().map(|ni| scores::image_locality(pod, ni, snap)).collect()),
            "InterPodAffinity" => {
                if let Some(m) = scores::inter_pod_pre_score(pod, snap) {
                    let mut s: Vec<i64> = nodes().map(|ni| scores::inter_pod_score(ni, &m)).collect();
                    scores::min_max_normalize(&mut s);
                    add(w, s)
                }
            }
            "PodTopologySpread" => {
                if let Some((idx, st)) = filters::spread_pre(pod, snap, false) {
                    let raw: Vec<Option<i64>> =
                        nodes().map(|ni| scores::spread_score(pod, ni, &idx, &st, snap.num_nodes)).collect();
                    add(w, scores::spread_normalize(&raw))
                }
            }
            _ => {}
        }
    }
    totals
}

/// The highest total; ties broken uniformly at random (reservoir sampling, as kube does).
fn select_host(feasible: &[usize], totals: &[i64], rng: &mut impl Rng) -> usize {
    let mut best = 0;
    let mut ties = 1u32;
    for j in 1..totals.len() {
        if totals[j] > totals[best] {
            best = j;
            ties = 1;
        } else if totals[j] == totals[best] {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = j;
            }
        }
    }
    feasible[best]
}

#[cfg(test)]
mod tests {
    use super::types::testutil::*;
    use super::*;
    use serde_json::json;

    fn rng() -> rand::rngs::StdRng {
        use rand::SeedableRng;
        rand::rngs::StdRng::seed_from_u64(7)
    }

    #[test]
    fn fit_error_message_has_kubernetes_format() {
        let tainted = node(json!({"metadata": {"name": "cp"}, "spec": {"taints": [
            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}));
        let small = |n: &str| {
            node(
                json!({"metadata": {"name": n}, "status": {"allocatable": {"cpu": "1", "memory": "8Gi", "pods": "110"}}}),
            )
        };
        let s = snapshot(vec![tainted, small("w1"), small("w2")], vec![]);
        let err = schedule(
            &pod_req("p", "2", "1Gi"),
            &s,
            &Profile::new("default-scheduler", Algorithm::FilterScore),
            &mut ProfileState::default(),
            &mut rng(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 2 Insufficient cpu."
        );
        let none = schedule(
            &pod_req("p", "1", "1"),
            &Snapshot::default(),
            &Profile::new("x", Algorithm::FilterScore),
            &mut ProfileState::default(),
            &mut rng(),
        )
        .unwrap_err();
        assert_eq!(none.to_string(), "no nodes available to schedule pods");
    }

    #[test]
    fn picks_the_least_loaded_fitting_node() {
        let s = snapshot(
            vec![node_l("a", json!({})), node_l("b", json!({})), node_l("c", json!({}))],
            vec![("a", pod_req("x", "3", "1Gi")), ("b", pod_req("y", "1", "1Gi"))],
        );
        let got = schedule(
            &pod_req("p", "1", "1Gi"),
            &s,
            &Profile::new("d", Algorithm::FilterScore),
            &mut ProfileState::default(),
            &mut rng(),
        );
        assert_eq!(got.unwrap(), "c");
    }

    #[test]
    fn soft_taints_and_preferred_affinity_steer_placement() {
        let soft = node(
            json!({"metadata": {"name": "a", "labels": {"disk": "ssd"}}, "spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}),
        );
        let s = snapshot(vec![soft, node_l("b", json!({}))], vec![]);
        let p = pod_req("p", "1", "1Gi");
        assert_eq!(
            schedule(&p, &s, &Profile::new("d", Algorithm::FilterScore), &mut ProfileState::default(), &mut rng())
                .unwrap(),
            "b"
        );
    }

    #[test]
    fn sampling_counts() {
        assert_eq!(num_feasible_nodes_to_find(50, 0), 50);
        assert_eq!(num_feasible_nodes_to_find(5000, 0), 500);
        assert_eq!(num_feasible_nodes_to_find(1000, 0), 420);
        assert_eq!(num_feasible_nodes_to_find(1000, 100), 1000);
        assert_eq!(num_feasible_nodes_to_find(200, 10), 100);
    }

    #[test]
    fn report_policies() {
        let s = snapshot(
            vec![node_l("n1", json!({"app": "web"})), node_l("n2", json!({})), node_l("n3", json!({}))],
            vec![],
        );
        let p = pod(json!({"metadata": {"name": "p", "labels": {"app": "web"}}}));
        let rr = Profile::new("round-robin", Algorithm::RoundRobin);
        let mut st = ProfileState::default();
        let seq: Vec<String> = (0..4).map(|_| schedule(&p, &s, &rr, &mut st, &mut rng()).unwrap()).collect();
        assert_eq!(seq, vec!["n1", "n2", "n3", "n1"]);
        let naf = Profile::new("node-affinity-first", Algorithm::NodeAffinityFirst);
        for _ in 0..5 {
            assert_eq!(schedule(&p, &s, &naf, &mut ProfileState::default(), &mut rng()).unwrap(), "n1");
        }
        let random = Profile::new("random", Algorithm::Random);
        let mut r = rng();
        let seen: std::collections::BTreeSet<String> =
            (0..50).map(|_| schedule(&p, &s, &random, &mut ProfileState::default(), &mut r).unwrap()).collect();
        assert_eq!(seen.len(), 3);
        // policies still respect filters
        let cordoned = node(json!({"metadata": {"name": "n0"}, "spec": {"unschedulable": true}}));
        let s2 = snapshot(vec![cordoned, node_l("n9", json!({}))], vec![]);
        assert_eq!(schedule(&p, &s2, &rr, &mut ProfileState::default(), &mut rng()).unwrap(), "n9");
    }

    #[test]
    fn disabled_filter_is_skipped() {
        let s = snapshot(
            vec![node(
                json!({"metadata": {"name": "a"}, "spec": {"unschedulable": true}, "status": {"allocatable": {"pods": "10"}}}),
            )],
            vec![],
        );
        let mut prof = Profile::new("d", Algorithm::FilterScore);
        assert!(schedule(&pod_req("p", "0", "0"), &s, &prof, &mut ProfileState::default(), &mut rng()).is_err());
        prof.filters.retain(|f| f != "NodeUnschedulable");
        assert_eq!(
            schedule(&pod_req("p", "0", "0"), &s, &prof, &mut ProfileState::default(), &mut rng()).unwrap(),
            "a"
        );
    }

    #[test]
    fn spread_places_pods_evenly_over_zones() {
        let mut s = snapshot(
            vec![
                node_l("a", json!({"zone": "z1"})),
                node_l("b", json!({"zone": "z1"})),
                node_l("c", json!({"zone": "z2"})),
            ],
            vec![],
        );
        let prof = Profile::new("d", Algorithm::FilterScore);
        let mut st = ProfileState::default();
        let mut r = rng();
        let mut zones = BTreeMap::<String, i32>::new();
        for i in 0..6 {
            let p = pod(
                json!({"metadata": {"name": format!("w{i}"), "labels": {"app": "w"}}, "spec": {"topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                 "labelSelector": {"matchLabels": {"app": "w"}}}]}}),
            );
            let n = schedule(&p, &s, &prof, &mut st, &mut r).unwrap();
            *zones.entry(s.get(&n).unwrap().labels()["zone"].clone()).or_default() += 1;
            s.add_pod(&n, p);
        }
        assert_eq!(zones.values().copied().collect::<Vec<_>>(), vec![3, 3]);
    }
}
