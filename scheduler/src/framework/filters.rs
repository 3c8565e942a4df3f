//! Filter plugins: may this pod run on this node? Each is a pure function of the pod, the
//! node's [`NodeInfo`] and, for the cross-node plugins, a pre-filter state computed once
//! per scheduling cycle. A failure carries kube-scheduler's reason strings, which the
//! `FailedScheduling` message counts per node.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Taint;

use super::types::{node_selector_matches, Labels, NodeData, NodeInfo, PodInfo, Snapshot};

pub const ERR_NODE_NAME: &str = "node(s) didn't match the requested node name";
pub const ERR_UNSCHEDULABLE: &str = "node(s) were unschedulable";
pub const ERR_NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
pub const ERR_NODE_PORTS: &str = "node(s) didn't have free ports for the requested pod ports";
pub const ERR_TOO_MANY_PODS: &str = "Too many pods";
pub const ERR_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const ERR_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const ERR_EXISTING_ANTI_AFFINITY: &str = "node(s) didn't satisfy existing pods anti-affinity rules";
pub const ERR_SPREAD: &str = "node(s) didn't match pod topology spread constraints";
pub const ERR_SPREAD_LABEL: &str = "node(s) didn't match pod topology spread constraints (missing required label)";

pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// Why a node was rejected: one or more reason strings.
pub type Reasons = Vec<String>;

pub use apimachinery::scheduling::{tolerated, tolerates};

/// NodeName: `spec.nodeName`, if set, names this node.
pub fn node_name(pod: &PodInfo, node: &NodeData) -> Result<(), Reasons> {
    if pod.node_name.is_empty() || pod.node_name == node.name {
        Ok(())
    } else {
        Err(vec![ERR_NODE_NAME.into()])
    }
}

/// NodeUnschedulable: a cordoned node takes only pods tolerating its unschedulable taint.
pub fn node_unschedulable(pod: &PodInfo, node: &NodeData) -> Result<(), Reasons> {
    if !node.unschedulable {
        return Ok(());
    }
    let taint = Taint { key: TAINT_UNSCHEDULABLE.into(), effect: "NoSchedule".into(), ..Default::default() };
    if tolerated(&pod.tolerations, &taint) {
        Ok(())
    } else {
        Err(vec![ERR_UNSCHEDULABLE.into()])
    }
}

/// TaintToleration: every NoSchedule and NoExecute taint must be tolerated.
pub fn taint_toleration(pod: &PodInfo, node: &NodeData) -> Result<(), Reasons> {
    for taint in &node.taints {
        if (taint.effect == "NoSchedule" || taint.effect == "NoExecute") && !tolerated(&pod.tolerations, taint) {
            return Err(vec![format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or_default()
            )]);
        }
    }
    Ok(())
}

/// Does the node satisfy the pod's nodeSelector and required node affinity?
pub fn node_affinity_matches(pod: &PodInfo, name: &str, labels: &Labels) -> bool {
    pod.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        && pod.required_node_affinity.as_ref().is_none_or(|sel| node_selector_matches(sel, name, labels))
}

/// NodeAffinity: nodeSelector and requiredDuringSchedulingIgnoredDuringExecution.
pub fn node_affinity(pod: &PodInfo, node: &NodeData) -> Result<(), Reasons> {
    if node_affinity_matches(pod, &node.name, &node.labels) {
        Ok(())
    } else {
        Err(vec![ERR_NODE_AFFINITY.into()])
    }
}

/// NodePorts: no requested host port may clash with one in use on the node.
pub fn node_ports(pod: &PodInfo, ni: &NodeInfo) -> Result<(), Reasons> {
    if pod.host_ports.iter().any(|want| ni.used_ports.iter().any(|used| used.conflicts(want))) {
        Err(vec![ERR_NODE_PORTS.into()])
    } else {
        Ok(())
    }
}

/// NodeResourcesFit: the pod's requests fit in allocatable minus what is requested already.
/// Reports every insufficient resource, as kube-scheduler does.
pub fn node_resources_fit(pod: &PodInfo, ni: &NodeInfo, node: &NodeData) -> Result<(), Reasons> {
    let mut reasons = Vec::new();
    if ni.pods.len() as i64 + 1 > node.allowed_pods {
        reasons.push(ERR_TOO_MANY_PODS.to_string());
    }
    let (req, used, alloc) = (&pod.requests, &ni.requested, &node.allocatable);
    if req.milli_cpu > 0 && alloc.milli_cpu < req.milli_cpu + used.milli_cpu {
        reasons.push("Insufficient cpu".into());
    }
    if req.memory > 0 && alloc.memory < req.memory + used.memory {
        reasons.push("Insufficient memory".into());
    }
    if req.ephemeral_storage > 0 && alloc.ephemeral_storage < req.ephemeral_storage + used.ephemeral_storage {
        reasons.push("Insufficient ephemeral-storage".into());
    }
    for (name, want) in &req.scalar {
        if *want == 0 {
            continue;
        }
        let have = alloc.scalar.get(name).copied().unwrap_or(0);
        let inuse = used.scalar.get(name).copied().unwrap_or(0);
        if have < want + inuse {
            reasons.push(format!("Insufficient {name}"));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// Pod counts per value of one topology key: borrowed from the snapshot's index, or
/// counted by scanning pods when a selector is not a plain `key=value`.
#[derive(Debug)]
pub enum Counts<'a> {
    Borrowed(Option<&'a HashMap<String, i64>>),
    Owned(HashMap<String, i64>),
}

impl Counts<'_> {
    pub fn get(&self, v: &str) -> i64 {
        match self {
            Counts::Borrowed(m) => m.and_then(|m| m.get(v)).copied().unwrap_or(0),
            Counts::Owned(m) => m.get(v).copied().unwrap_or(0),
        }
    }
    fn map(&self) -> Option<&HashMap<String, i64>> {
        match self {
            Counts::Borrowed(m) => *m,
            Counts::Owned(m) => Some(m),
        }
    }
    /// Domains with at least one pod.
    pub fn len(&self) -> usize {
        self.map().map(|m| m.values().filter(|c| **c > 0).count()).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.map().is_none_or(|m| m.values().all(|c| *c <= 0))
    }
    pub fn min(&self) -> i64 {
        self.map().and_then(|m| m.values().copied().min()).unwrap_or(0)
    }
}

/// Count, per value of `term.topology_key`, the pods on nodes that `selects`.
fn scan_counts<'a>(snap: &'a Snapshot, topology_key: &str, selects: impl Fn(&PodInfo) -> bool) -> Counts<'a> {
    let mut m: HashMap<String, i64> = HashMap::new();
    for ni in &snap.nodes {
        let Some(node) = &ni.node else { continue };
        let Some(v) = node.labels.get(topology_key) else { continue };
        let n = ni.pods.iter().filter(|p| selects(p)).count() as i64;
        if n > 0 {
            *m.entry(v.clone()).or_default() += n;
        }
    }
    Counts::Owned(m)
}

/// Counts for one affinity term: from the index when it is a plain `key=value` selector.
fn term_counts<'a>(snap: &'a Snapshot, t: &super::types::AffinityTerm) -> Counts<'a> {
    match t.index_key() {
        Some(k) => Counts::Borrowed(snap.topo_index.get(&k).and_then(|m| m.get(&t.topology_key))),
        None => scan_counts(snap, &t.topology_key, |p| t.matches(p)),
    }
}

/// InterPodAffinity's pre-filter state (computed once per cycle).
#[derive(Debug, Default)]
pub struct InterPodState<'a> {
    /// Existing pods' anti-affinity terms that select the incoming pod: (topology key, pods per value).
    pub existing_anti: Vec<(&'a str, &'a HashMap<String, i64>)>,
    /// Per required affinity term of the incoming pod: matching pods per value.
    pub affinity: Vec<Counts<'a>>,
    /// Does any existing pod match the affinity terms?
    pub affinity_any: bool,
    /// Per required anti-affinity term of the incoming pod: matching pods per value.
    pub anti: Vec<Counts<'a>>,
}

/// Compute [`InterPodState`], or `None` when nothing in the cluster or the pod has
/// required pod (anti-)affinity.
pub fn inter_pod_pre_filter<'a>(pod: &PodInfo, snap: &'a Snapshot) -> Option<InterPodState<'a>> {
    if pod.required_affinity.is_empty()
        && pod.required_anti_affinity.is_empty()
        && snap.pods_with_required_anti_affinity == 0
    {
        return None;
    }
    let mut st = InterPodState::default();
    for e in snap.existing_anti.values() {
        if e.pods > 0 && !e.counts.is_empty() && e.term.matches(pod) {
            st.existing_anti.push((e.term.topology_key.as_str(), &e.counts));
        }
    }
    // kube counts a pod for affinity only when it matches every term.
    if pod.required_affinity.len() == 1 {
        st.affinity.push(term_counts(snap, &pod.required_affinity[0]));
    } else {
        for t in &pod.required_affinity {
            st.affinity
                .push(scan_counts(snap, &t.topology_key, |p| pod.required_affinity.iter().all(|t| t.matches(p))));
        }
    }
    st.affinity_any = st.affinity.iter().any(|c| !c.is_empty());
    st.anti = pod.required_anti_affinity.iter().map(|t| term_counts(snap, t)).collect();
    Some(st)
}

/// InterPodAffinity (required terms only).
pub fn inter_pod_affinity(pod: &PodInfo, node: &NodeData, st: &InterPodState) -> Result<(), Reasons> {
    if !pod.required_affinity.is_empty() {
        let all_ok = pod
            .required_affinity
            .iter()
            .zip(&st.affinity)
            .all(|(t, c)| node.labels.get(&t.topology_key).is_some_and(|v| c.get(v) > 0));
        if !all_ok {
            // The first pod of a group that selects itself may go anywhere with the keys.
            let self_ok = !st.affinity_any
                && pod.required_affinity.iter().all(|t| t.matches(pod))
                && pod.required_affinity.iter().all(|t| node.labels.contains_key(&t.topology_key));
            if !self_ok {
                return Err(vec![ERR_AFFINITY.into()]);
            }
        }
    }
    for (t, c) in pod.required_anti_affinity.iter().zip(&st.anti) {
        if let Some(v) = node.labels.get(&t.topology_key) {
            if c.get(v) > 0 {
                return Err(vec![ERR_ANTI_AFFINITY.into()]);
            }
        }
    }
    for (tk, counts) in &st.existing_anti {
        if let Some(v) = node.labels.get(*tk) {
            if counts.get(v).is_some_and(|c| *c > 0) {
                return Err(vec![ERR_EXISTING_ANTI_AFFINITY.into()]);
            }
        }
    }
    Ok(())
}

/// Pod counts per topology domain for a set of spread constraints.
#[derive(Debug, Default)]
pub struct SpreadState<'a> {
    /// Per constraint: topology value → matching pods.
    pub counts: Vec<Counts<'a>>,
    /// Per constraint: the global minimum (0 when there are fewer domains than minDomains).
    pub min: Vec<i64>,
    /// Per constraint: the number of eligible domains.
    pub domains: Vec<usize>,
}

/// Is `node` one of the nodes a constraint counts (node affinity / taints policies, keys present)?
fn spread_eligible(pod: &PodInfo, c: &super::types::SpreadConstraint, node: &NodeData, keys: &[&str]) -> bool {
    keys.iter().all(|k| node.labels.contains_key(*k))
        && (!c.honor_node_affinity || node_affinity_matches(pod, &node.name, &node.labels))
        && (!c.honor_taints || taint_toleration(pod, node).is_ok())
}

/// Count matching pods per domain for `hard` (DoNotSchedule) or soft constraints.
pub fn spread_pre<'a>(pod: &PodInfo, snap: &'a Snapshot, hard: bool) -> Option<(Vec<usize>, SpreadState<'a>)> {
    let idx: Vec<usize> = pod.spread.iter().enumerate().filter(|(_, c)| c.hard == hard).map(|(i, _)| i).collect();
    if idx.is_empty() {
        return None;
    }
    let mut st = SpreadState::default();
    // Fast path: one `key=value` constraint counted over every node with the key.
    if let [ci] = idx.as_slice() {
        let c = &pod.spread[*ci];
        let plain = pod.node_selector.is_empty() && pod.required_node_affinity.is_none();
        if let (Some((k, v)), true, false) =
            (super::types::single_equality(&c.selector), plain || !c.honor_node_affinity, c.honor_taints)
        {
            let counts = Counts::Borrowed(
                snap.topo_index
                    .get(&super::types::index_key(&pod.namespace, k, v))
                    .and_then(|m| m.get(&c.topology_key)),
            );
            let domains = snap.topology_values.get(&c.topology_key).map(|m| m.len()).unwrap_or(0);
            let min = if (domains as i32) < c.min_domains || counts.len() < domains { 0 } else { counts.min() };
            st.counts.push(counts);
            st.min.push(min);
            st.domains.push(domains);
            return Some((idx, st));
        }
    }
    let keys: Vec<&str> = idx.iter().map(|i| pod.spread[*i].topology_key.as_str()).collect();
    let mut owned: Vec<HashMap<String, i64>> = vec![HashMap::new(); idx.len()];
    for ni in &snap.nodes {
        let Some(node) = &ni.node else { continue };
        for (j, &ci) in idx.iter().enumerate() {
            let c = &pod.spread[ci];
            if !spread_eligible(pod, c, node, &keys) {
                continue;
            }
            let Some(v) = node.labels.get(&c.topology_key) else { continue };
            let n = ni
                .pods
                .iter()
                .filter(|p| p.namespace == pod.namespace && !p.terminating && c.selector.matches(&p.labels))
                .count() as i64;
            *owned[j].entry(v.clone()).or_default() += n;
        }
    }
    for (j, &ci) in idx.iter().enumerate() {
        let c = &pod.spread[ci];
        let domains = owned[j].len();
        st.min.push(if (domains as i32) < c.min_domains { 0 } else { owned[j].values().copied().min().unwrap_or(0) });
        st.domains.push(domains);
    }
    st.counts = owned.into_iter().map(Counts::Owned).collect();
    Some((idx, st))
}

/// PodTopologySpread (DoNotSchedule constraints).
pub fn pod_topology_spread(pod: &PodInfo, node: &NodeData, idx: &[usize], st: &SpreadState) -> Result<(), Reasons> {
    for (j, &ci) in idx.iter().enumerate() {
        let c = &pod.spread[ci];
        let Some(v) = node.labels.get(&c.topology_key) else {
            return Err(vec![ERR_SPREAD_LABEL.into()]);
        };
        let self_match = i64::from(c.selector.matches(&pod.labels));
        let matched = st.counts[j].get(v) + self_match;
        if matched - st.min[j] > i64::from(c.max_skew) {
            return Err(vec![ERR_SPREAD.into()]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::types::testutil::*;
    use super::*;
    use serde_json::json;

    fn ni(snap: &Snapshot, n: &str) -> NodeInfo {
        snap.get(n).unwrap().clone()
    }

    #[test]
    fn node_name_filter() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "a"}}));
        assert!(node_name(&p, &node_l("a", json!({}))).is_ok());
        assert_eq!(node_name(&p, &node_l("b", json!({}))).unwrap_err(), vec![ERR_NODE_NAME]);
    }

    #[test]
    fn unschedulable_filter() {
        let n = node(json!({"metadata": {"name": "a"}, "spec": {"unschedulable": true}}));
        let p = pod(json!({"metadata": {"name": "p"}}));
        assert_eq!(node_unschedulable(&p, &n).unwrap_err(), vec![ERR_UNSCHEDULABLE]);
        let tol = pod(json!({"metadata": {"name": "p"}, "spec": {"tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert!(node_unschedulable(&tol, &n).is_ok());
        assert!(node_unschedulable(&p, &node_l("b", json!({}))).is_ok());
    }

    #[test]
    fn taint_filter() {
        let n = node(json!({"metadata": {"name": "a"}, "spec": {"taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"}]}}));
        let p = pod(json!({"metadata": {"name": "p"}}));
        assert_eq!(taint_toleration(&p, &n).unwrap_err(), vec!["node(s) had untolerated taint {dedicated: gpu}"]);
        let ok = pod(json!({"metadata": {"name": "p"}, "spec": {"tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}}));
        assert!(taint_toleration(&ok, &n).is_ok());
        let wrong = pod(json!({"metadata": {"name": "p"}, "spec": {"tolerations": [
            {"key": "dedicated", "value": "cpu"}]}}));
        assert!(taint_toleration(&wrong, &n).is_err());
        let all = pod(json!({"metadata": {"name": "p"}, "spec": {"tolerations": [{"operator": "Exists"}]}}));
        assert!(taint_toleration(&all, &n).is_ok());
        let noexec =
            node(json!({"metadata": {"name": "a"}, "spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}));
        assert!(taint_toleration(&p, &noexec).is_err());
    }

    #[test]
    fn node_affinity_filter() {
        let n = node_l("a", json!({"zone": "z1", "gen": "5"}));
        let sel = pod(json!({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"zone": "z1"}}}));
        assert!(node_affinity(&sel, &n).is_ok());
        let bad = pod(json!({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"zone": "z2"}}}));
        assert_eq!(node_affinity(&bad, &n).unwrap_err(), vec![ERR_NODE_AFFINITY]);
        let aff = |expr: serde_json::Value| {
            pod(json!({"metadata": {"name": "p"}, "spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [expr]}}}}}))
        };
        assert!(node_affinity(
            &aff(json!({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]})),
            &n
        )
        .is_ok());
        assert!(node_affinity(
            &aff(json!({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]})),
            &n
        )
        .is_err());
        assert!(node_affinity(
            &aff(json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]})),
            &n
        )
        .is_ok());
        assert!(node_affinity(
            &aff(json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z1"]}]})),
            &n
        )
        .is_err());
    }

    #[test]
    fn resources_fit_filter() {
        let gpu = node(json!({"metadata": {"name": "a"}, "status": {"allocatable": {
            "cpu": "2", "memory": "2Gi", "pods": "2", "nvidia.com/gpu": "1"}}}));
        let s = snapshot(vec![gpu.clone()], vec![("a", pod_req("x", "1500m", "1Gi"))]);
        let info = ni(&s, "a");
        assert!(node_resources_fit(&pod_req("p", "500m", "1Gi"), &info, &gpu).is_ok());
        assert_eq!(
            node_resources_fit(&pod_req("p", "600m", "2Gi"), &info, &gpu).unwrap_err(),
            vec!["Insufficient cpu", "Insufficient memory"]
        );
        let want_gpu = |n: &str| {
            pod(json!({"metadata": {"name": "g"}, "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"nvidia.com/gpu": n}, "limits": {"nvidia.com/gpu": n}}}]}}))
        };
        assert!(node_resources_fit(&want_gpu("1"), &info, &gpu).is_ok());
        assert_eq!(node_resources_fit(&want_gpu("2"), &info, &gpu).unwrap_err(), vec!["Insufficient nvidia.com/gpu"]);
        let full = snapshot(vec![gpu.clone()], vec![("a", pod_req("x", "0", "0")), ("a", pod_req("y", "0", "0"))]);
        assert_eq!(
            node_resources_fit(&pod_req("p", "0", "0"), &ni(&full, "a"), &gpu).unwrap_err(),
            vec![ERR_TOO_MANY_PODS]
        );
    }

    #[test]
    fn node_ports_filter() {
        let hp = |ip: &str, port: i32| {
            pod(
                json!({"metadata": {"name": format!("p{port}{ip}")}, "spec": {"containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip}]}]}}),
            )
        };
        let s = snapshot(vec![node_l("a", json!({}))], vec![("a", hp("", 8080))]);
        let info = ni(&s, "a");
        assert_eq!(node_ports(&hp("", 8080), &info).unwrap_err(), vec![ERR_NODE_PORTS]);
        assert!(node_ports(&hp("10.0.0.1", 8080), &info).is_err());
        assert!(node_ports(&hp("", 8081), &info).is_ok());
    }

    fn anti_pod(name: &str, app: &str, key: &str) -> std::sync::Arc<PodInfo> {
        pod(json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {"affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}}}}))
    }

    #[test]
    fn inter_pod_anti_affinity_filter() {
        let nodes = vec![
            node_l("a", json!({"kubernetes.io/hostname": "a", "zone": "z1"})),
            node_l("b", json!({"kubernetes.io/hostname": "b", "zone": "z1"})),
            node_l("c", json!({"kubernetes.io/hostname": "c", "zone": "z2"})),
        ];
        let s = snapshot(nodes, vec![("a", anti_pod("web-1", "web", "kubernetes.io/hostname"))]);
        let p = anti_pod("web-2", "web", "kubernetes.io/hostname");
        let st = inter_pod_pre_filter(&p, &s).unwrap();
        let f = |n: &str| inter_pod_affinity(&p, s.get(n).unwrap().node.as_ref().unwrap(), &st);
        assert_eq!(f("a").unwrap_err(), vec![ERR_ANTI_AFFINITY]);
        assert!(f("b").is_ok());
        // An existing pod's anti-affinity keeps a plain matching pod away.
        let plain = pod(json!({"metadata": {"name": "x", "labels": {"app": "web"}}}));
        let st = inter_pod_pre_filter(&plain, &s).unwrap();
        assert_eq!(
            inter_pod_affinity(&plain, s.get("a").unwrap().node.as_ref().unwrap(), &st).unwrap_err(),
            vec![ERR_EXISTING_ANTI_AFFINITY]
        );
        // zone-level anti-affinity excludes the whole zone
        let zp = anti_pod("web-3", "web", "zone");
        let st = inter_pod_pre_filter(&zp, &s).unwrap();
        assert!(inter_pod_affinity(&zp, s.get("b").unwrap().node.as_ref().unwrap(), &st).is_err());
        assert!(inter_pod_affinity(&zp, s.get("c").unwrap().node.as_ref().unwrap(), &st).is_ok());
    }

    #[test]
    fn inter_pod_affinity_filter() {
        let nodes =
            vec![node_l("a", json!({"zone": "z1"})), node_l("b", json!({"zone": "z2"})), node_l("c", json!({}))];
        let db = pod(json!({"metadata": {"name": "db", "labels": {"app": "db"}}}));
        let s = snapshot(nodes.clone(), vec![("a", db)]);
        let web =
            pod(json!({"metadata": {"name": "web", "labels": {"app": "web"}}, "spec": {"affinity": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}]}}}}));
        let st = inter_pod_pre_filter(&web, &s).unwrap();
        let f = |n: &str, p: &PodInfo, st: &InterPodState, s: &Snapshot| {
            inter_pod_affinity(p, s.get(n).unwrap().node.as_ref().unwrap(), st)
        };
        assert!(f("a", &web, &st, &s).is_ok());
        assert_eq!(f("b", &web, &st, &s).unwrap_err(), vec![ERR_AFFINITY]);
        assert!(f("c", &web, &st, &s).is_err());
        // A pod whose term selects itself may start the group anywhere with the key.
        let first =
            pod(json!({"metadata": {"name": "c1", "labels": {"app": "cache"}}, "spec": {"affinity": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "zone"}]}}}}));
        let empty = snapshot(nodes, vec![]);
        let st = inter_pod_pre_filter(&first, &empty).unwrap();
        assert!(f("b", &first, &st, &empty).is_ok());
        assert!(f("c", &first, &st, &empty).is_err());
    }

    #[test]
    fn topology_spread_filter() {
        let nodes = vec![
            node_l("a", json!({"zone": "z1"})),
            node_l("b", json!({"zone": "z1"})),
            node_l("c", json!({"zone": "z2"})),
            node_l("d", json!({})),
        ];
        let w = |n: &str| pod(json!({"metadata": {"name": n, "labels": {"app": "w"}}}));
        let s = snapshot(nodes, vec![("a", w("w1")), ("b", w("w2"))]);
        let p = pod(json!({"metadata": {"name": "w3", "labels": {"app": "w"}}, "spec": {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "w"}}}]}}));
        let (idx, st) = spread_pre(&p, &s, true).unwrap();
        let f = |n: &str| pod_topology_spread(&p, s.get(n).unwrap().node.as_ref().unwrap(), &idx, &st);
        assert_eq!(f("a").unwrap_err(), vec![ERR_SPREAD]);
        assert!(f("c").is_ok());
        assert_eq!(f("d").unwrap_err(), vec![ERR_SPREAD_LABEL]);
        assert!(spread_pre(&p, &s, false).is_none());
    }
}
