//! Score plugins: how good is each feasible node for this pod? Each returns one score per
//! node in 0..=100 (`MaxNodeScore`) after its own normalisation, as kube-scheduler's
//! Score + NormalizeScore do; the profile weights and sums them.

use std::collections::HashMap;

use super::filters::{node_affinity_matches, tolerated};
use super::types::{node_selector_term_matches, NodeInfo, PodInfo, Snapshot};

pub const MAX_NODE_SCORE: i64 = 100;

/// `helper.DefaultNormalizeScore`: scale so the highest becomes 100 (`reverse` flips).
pub fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        *s = MAX_NODE_SCORE * *s / max;
        if reverse {
            *s = MAX_NODE_SCORE - *s;
        }
    }
}

/// NodeResourcesFit with the LeastAllocated strategy (cpu and memory, weight 1 each).
pub fn least_allocated(pod: &PodInfo, ni: &NodeInfo) -> i64 {
    let Some(node) = &ni.node else { return 0 };
    let f = |alloc: i64, req: i64| if alloc == 0 || req > alloc { 0 } else { (alloc - req) * MAX_NODE_SCORE / alloc };
    let cpu = f(node.allocatable.milli_cpu, ni.non_zero_cpu + pod.non_zero_cpu);
    let mem = f(node.allocatable.memory, ni.non_zero_mem + pod.non_zero_mem);
    (cpu + mem) / 2
}

/// NodeResourcesBalancedAllocation: 100 × (1 − standard deviation of the requested fractions).
pub fn balanced_allocation(pod: &PodInfo, ni: &NodeInfo) -> i64 {
    let Some(node) = &ni.node else { return 0 };
    let frac = |alloc: i64, req: i64| if alloc == 0 { 1.0 } else { (req as f64 / alloc as f64).min(1.0) };
    let cpu = frac(node.allocatable.milli_cpu, ni.requested.milli_cpu + pod.requests.milli_cpu);
    let mem = frac(node.allocatable.memory, ni.requested.memory + pod.requests.memory);
    let std = (cpu - mem).abs() / 2.0;
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

/// NodeAffinity's score: the summed weights of preferred terms the node matches (raw;
/// normalise with [`default_normalize`]).
pub fn node_affinity_preferred(pod: &PodInfo, ni: &NodeInfo) -> i64 {
    let Some(node) = &ni.node else { return 0 };
    pod.preferred_node_affinity
        .iter()
        .filter(|(_, term)| node_selector_term_matches(term, &node.name, &node.labels))
        .map(|(w, _)| i64::from(*w))
        .sum()
}

/// TaintToleration's score: the number of PreferNoSchedule taints the pod does not
/// tolerate (raw; normalise reversed).
pub fn taint_toleration_preferred(pod: &PodInfo, ni: &NodeInfo) -> i64 {
    let Some(node) = &ni.node else { return 0 };
    let tols: Vec<_> = pod
        .tolerations
        .iter()
        .filter(|t| t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "PreferNoSchedule"))
        .cloned()
        .collect();
    node.taints.iter().filter(|t| t.effect == "PreferNoSchedule" && !tolerated(&tols, t)).count() as i64
}

/// ImageLocality: bytes of the pod's images already on the node, scaled by how widely each
/// image is spread, mapped between 23 MB and 1000 MB per container onto 0..100.
pub fn image_locality(pod: &PodInfo, ni: &NodeInfo, snap: &Snapshot) -> i64 {
    const MIN: i64 = 23 * 1024 * 1024;
    const MAX_PER_CONTAINER: i64 = 1000 * 1024 * 1024;
    let Some(node) = &ni.node else { return 0 };
    if pod.images.is_empty() || snap.num_nodes == 0 {
        return 0;
    }
    let mut sum = 0i64;
    for img in &pod.images {
        if let Some(size) = node.images.get(img) {
            let spread = snap.image_nodes.get(img).copied().unwrap_or(0) as f64 / snap.num_nodes as f64;
            sum += (*size as f64 * spread) as i64;
        }
    }
    let max = MAX_PER_CONTAINER * pod.images.len() as i64;
    let sum = sum.clamp(MIN, max);
    MAX_NODE_SCORE * (sum - MIN) / (max - MIN)
}

/// InterPodAffinity's preferred terms: per topology (key, value), the weights of the
/// incoming pod's preferred (anti-)affinity matching existing pods, plus existing pods'
/// terms matching the incoming pod (their required affinity counts with weight 1).
pub fn inter_pod_pre_score(pod: &PodInfo, snap: &Snapshot) -> Option<HashMap<(String, String), i64>> {
    let has_own = !pod.preferred_affinity.is_empty() || !pod.preferred_anti_affinity.is_empty();
    if !has_own && snap.pods_with_affinity == 0 {
        return None;
    }
    let mut m: HashMap<(String, String), i64> = HashMap::new();
    for ni in &snap.nodes {
        let Some(node) = &ni.node else { continue };
        if !has_own && ni.pods_with_affinity == 0 {
            continue;
        }
        let mut add = |key: &str, w: i64| {
            if let Some(v) = node.labels.get(key) {
                *m.entry((key.to_string(), v.clone())).or_default() += w;
            }
        };
        for ep in &ni.pods {
            for t in &pod.preferred_affinity {
                if t.matches(ep) {
                    add(&t.topology_key, i64::from(t.weight));
                }
            }
            for t in &pod.preferred_anti_affinity {
                if t.matches(ep) {
                    add(&t.topology_key, -i64::from(t.weight));
                }
            }
            if !ep.has_affinity() {
                continue;
            }
            for t in &ep.required_affinity {
                if t.matches(pod) {
                    add(&t.topology_key, 1);
                }
            }
            for t in &ep.preferred_affinity {
                if t.matches(pod) {
                    add(&t.topology_key, i64::from(t.weight));
                }
            }
            for t in &ep.preferred_anti_affinity {
                if t.matches(pod) {
                    add(&t.topology_key, -i64::from(t.weight));
                }
            }
        }
    }
    Some(m)
}

/// A node's raw InterPodAffinity score from [`inter_pod_pre_score`].
pub fn inter_pod_score(ni: &NodeInfo, m: &HashMap<(String, String), i64>) -> i64 {
    let Some(node) = &ni.node else { return 0 };
    if m.is_empty() {
        return 0;
    }
    node.labels.iter().map(|(k, v)| m.get(&(k.clone(), v.clone())).copied().unwrap_or(0)).sum()
}

/// InterPodAffinity's normalisation: min-max onto 0..100.
pub fn min_max_normalize(scores: &mut [i64]) {
    let (min, max) = (scores.iter().copied().min().unwrap_or(0), scores.iter().copied().max().unwrap_or(0));
    let diff = max - min;
    for s in scores.iter_mut() {
        *s = if diff > 0 { MAX_NODE_SCORE * (*s - min) / diff } else { 0 };
    }
}

/// PodTopologySpread's score (ScheduleAnyway constraints): the weighted count of matching
/// pods in the node's domains (raw; lower is better), `None` for nodes missing a key.
pub fn spread_score(
    pod: &PodInfo,
    ni: &NodeInfo,
    idx: &[usize],
    st: &super::filters::SpreadState,
    snap_nodes: usize,
) -> Option<i64> {
    let node = ni.node.as_ref()?;
    let mut score = 0f64;
    for (j, &ci) in idx.iter().enumerate() {
        let c = &pod.spread[ci];
        let v = node.labels.get(&c.topology_key)?;
        let domains = if c.topology_key == "kubernetes.io/hostname" { snap_nodes } else { st.domains[j] };
        let weight = ((domains + 2) as f64).ln();
        let cnt = st.counts[j].get(v);
        score += (cnt as f64 + f64::from(c.max_skew - 1)) * weight;
    }
    Some(score.round() as i64)
}

/// PodTopologySpread's normalisation: fewer matching pods scores higher; nodes missing a
/// topology key score 0.
pub fn spread_normalize(raw: &[Option<i64>]) -> Vec<i64> {
    let vals: Vec<i64> = raw.iter().flatten().copied().collect();
    let (min, max) = (vals.iter().copied().min().unwrap_or(0), vals.iter().copied().max().unwrap_or(0));
    raw.iter()
        .map(|s| match s {
            None => 0,
            Some(_) if max == 0 => MAX_NODE_SCORE,
            Some(s) => MAX_NODE_SCORE * (max + min - s) / max,
        })
        .collect()
}

/// Does the node pass the pod's node affinity (used by spread scoring to pick nodes to count)?
pub fn counts_for_spread(pod: &PodInfo, ni: &NodeInfo) -> bool {
    ni.node.as_ref().is_some_and(|n| node_affinity_matches(pod, &n.name, &n.labels))
}

#[cfg(test)]
mod tests {
    use super::super::filters::spread_pre;
    use super::super::types::testutil::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn normalize_helpers() {
        let mut s = vec![0, 5, 10];
        default_normalize(&mut s, false);
        assert_eq!(s, vec![0, 50, 100]);
        let mut r = vec![0, 1, 2];
        default_normalize(&mut r, true);
        assert_eq!(r, vec![100, 50, 0]);
        let mut z = vec![0, 0];
        default_normalize(&mut z, true);
        assert_eq!(z, vec![100, 100]);
        let mut m = vec![-4, 0, 4];
        min_max_normalize(&mut m);
        assert_eq!(m, vec![0, 50, 100]);
    }

    #[test]
    fn least_allocated_prefers_emptier_nodes() {
        let s = snapshot(vec![node_l("a", json!({})), node_l("b", json!({}))], vec![("a", pod_req("x", "2", "4Gi"))]);
        let p = pod_req("p", "1", "1Gi");
        let a = least_allocated(&p, s.get("a").unwrap());
        let b = least_allocated(&p, s.get("b").unwrap());
        assert!(b > a, "{b} > {a}");
        // b: cpu (4-1)/4 = 75, mem (8-1)/8 = 87 → 81
        assert_eq!(b, 81);
    }

    #[test]
    fn balanced_allocation_prefers_even_use() {
        let s = snapshot(vec![node_l("a", json!({})), node_l("b", json!({}))], vec![("a", pod_req("x", "2", "0"))]);
        let p = pod_req("p", "1", "2Gi");
        // a: cpu 3/4, mem 2/8 → std .25 → 75; b: cpu 1/4, mem 2/8 → 100
        assert_eq!(balanced_allocation(&p, s.get("a").unwrap()), 75);
        assert_eq!(balanced_allocation(&p, s.get("b").unwrap()), 100);
    }

    #[test]
    fn preferred_node_affinity_sums_weights() {
        let s = snapshot(
            vec![node_l("a", json!({"disk": "ssd", "zone": "z1"})), node_l("b", json!({"disk": "hdd"}))],
            vec![],
        );
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
                {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]}}}}));
        assert_eq!(node_affinity_preferred(&p, s.get("a").unwrap()), 15);
        assert_eq!(node_affinity_preferred(&p, s.get("b").unwrap()), 0);
    }

    #[test]
    fn taint_preference_counts_intolerable_soft_taints() {
        let n = node(json!({"metadata": {"name": "a"}, "spec": {"taints": [
            {"key": "x", "effect": "PreferNoSchedule"}, {"key": "y", "effect": "PreferNoSchedule"}, {"key": "z", "effect": "NoSchedule"}]}}));
        let s = snapshot(vec![n], vec![]);
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"tolerations": [{"key": "x", "operator": "Exists"}]}}));
        assert_eq!(taint_toleration_preferred(&p, s.get("a").unwrap()), 1);
    }

    #[test]
    fn image_locality_prefers_nodes_with_the_image() {
        let with = node(
            json!({"metadata": {"name": "a"}, "status": {"images": [{"names": ["nginx:latest"], "sizeBytes": 500 * 1024 * 1024}]}}),
        );
        let s = snapshot(vec![with, node_l("b", json!({}))], vec![]);
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}));
        assert!(image_locality(&p, s.get("a").unwrap(), &s) > 0);
        assert_eq!(image_locality(&p, s.get("b").unwrap(), &s), 0);
    }

    #[test]
    fn preferred_inter_pod_affinity() {
        let nodes = vec![node_l("a", json!({"zone": "z1"})), node_l("b", json!({"zone": "z2"}))];
        let cache = pod(json!({"metadata": {"name": "c", "labels": {"app": "cache"}}}));
        let s = snapshot(nodes, vec![("a", cache)]);
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"affinity": {"podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}}]}}}}));
        let m = inter_pod_pre_score(&p, &s).unwrap();
        assert_eq!(inter_pod_score(s.get("a").unwrap(), &m), 50);
        assert_eq!(inter_pod_score(s.get("b").unwrap(), &m), 0);
        let anti = pod(json!({"metadata": {"name": "p"}, "spec": {"affinity": {"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}}]}}}}));
        let m = inter_pod_pre_score(&anti, &s).unwrap();
        assert_eq!(inter_pod_score(s.get("a").unwrap(), &m), -50);
    }

    #[test]
    fn soft_spread_prefers_emptier_domains() {
        let nodes =
            vec![node_l("a", json!({"zone": "z1"})), node_l("b", json!({"zone": "z2"})), node_l("c", json!({}))];
        let w = |n: &str| pod(json!({"metadata": {"name": n, "labels": {"app": "w"}}}));
        let s = snapshot(nodes, vec![("a", w("w1")), ("a", w("w2"))]);
        let p = pod(json!({"metadata": {"name": "w3", "labels": {"app": "w"}}, "spec": {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": "w"}}}]}}));
        let (idx, st) = spread_pre(&p, &s, false).unwrap();
        let raw: Vec<_> = ["a", "b", "c"].iter().map(|n| spread_score(&p, s.get(n).unwrap(), &idx, &st, 3)).collect();
        let norm = spread_normalize(&raw);
        assert!(norm[1] > norm[0]);
        assert_eq!(norm[2], 0);
    }
}
