//! The collector's decisions over one snapshot of the ownerReferences graph (pure).
//!
//! The rule that keeps user data safe, as in Kubernetes: a dependent is deleted, or a
//! reference removed from it, only for owners **verified absent**. An owner found in the
//! graph with the referenced identity (uid, name, kind, a namespace the dependent may
//! reference) is present. Any other reference is resolved outside this module, by a live
//! read of the owner through discovery ([`OwnerKey`] → [`OwnerState`]); a reference with
//! no verdict, an owner kind nobody serves, or a failed read is [`OwnerState::Unknown`]
//! and the dependent waits — it is never treated as absent.
//!
//! Namespace rules (Kubernetes' `OwnerRefInvalidNamespace`): a namespaced dependent can
//! only be owned by a cluster-scoped owner or an owner in its own namespace; a reference
//! to an object in another namespace is looked up in the dependent's namespace (where it
//! is absent) and reported. A cluster-scoped dependent cannot be owned by a namespaced
//! owner: that reference is reported and never resolves, so the dependent is kept.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::discovery::group_of;

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// One object in the graph.
#[derive(Debug, Clone)]
pub struct Node {
    /// Index of its resource (into the caller's table).
    pub resource: usize,
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
    pub owners: Vec<OwnerReference>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

impl Node {
    fn has_finalizer(&self, f: &str) -> bool {
        self.finalizers.iter().any(|x| x == f)
    }
}

/// An owner to read live: the reference as the dependent wrote it, and the dependent's
/// namespace (where a namespaced owner must be).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerKey {
    pub namespace: Option<String>,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl OwnerKey {
    fn of(dependent: &Node, o: &OwnerReference) -> Self {
        OwnerKey {
            namespace: dependent.namespace.clone(),
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        }
    }
}

/// What is known of an owner outside the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerState {
    /// An object with that name and uid exists.
    Present,
    /// Verified: no object of that name and uid exists (a 404 for that object, another
    /// uid under the name, or its deletion seen by a watch).
    Absent,
    /// Cannot be told (kind not served, read failed): the dependent waits.
    Unknown,
}

/// Where one owner reference points.
#[derive(Debug, Clone, PartialEq)]
enum Located {
    /// The owner is node `.0` of the graph.
    Graph(usize),
    /// Not in the graph (or not with that identity): needs a live read.
    Lookup(OwnerKey),
    /// A cluster-scoped dependent naming a namespaced owner: never resolves.
    Invalid,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GcAction {
    /// Delete the node with a propagation policy (its uid as precondition).
    Delete { node: usize, policy: &'static str },
    /// Remove the references to these owner uids from the node.
    RemoveOwnerRefs { node: usize, owner_uids: Vec<String> },
    /// Remove a finalizer from the node.
    RemoveFinalizer { node: usize, finalizer: &'static str },
}

/// A reference Kubernetes reports with an `OwnerRefInvalidNamespace` warning event.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidRef {
    pub node: usize,
    pub owner: OwnerReference,
}

/// The graph of one snapshot with every reference located.
pub struct Graph<'a> {
    nodes: &'a [Node],
    /// `located[i][k]`: where node i's k-th owner reference points.
    located: Vec<Vec<Located>>,
    /// owner node → the nodes whose references locate it.
    dependents: HashMap<usize, Vec<usize>>,
    invalid: Vec<InvalidRef>,
}

impl<'a> Graph<'a> {
    pub fn new(nodes: &'a [Node]) -> Self {
        let by_uid: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.uid.as_str(), i)).collect();
        let mut located = Vec::with_capacity(nodes.len());
        let mut dependents: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut invalid = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let mut refs = Vec::with_capacity(n.owners.len());
            for o in &n.owners {
                let l = match by_uid.get(o.uid.as_str()).map(|&j| (j, &nodes[j])) {
                    Some((j, owner))
                        if owner.name == o.name
                            && owner.kind == o.kind
                            && group_of(&owner.api_version) == group_of(&o.api_version) =>
                    {
                        match (&n.namespace, &owner.namespace) {
                            (_, None) => Located::Graph(j),
                            (Some(a), Some(b)) if a == b => Located::Graph(j),
                            (Some(_), Some(_)) => {
                                invalid.push(InvalidRef { node: i, owner: o.clone() });
                                Located::Lookup(OwnerKey::of(n, o))
                            }
                            (None, Some(_)) => {
                                invalid.push(InvalidRef { node: i, owner: o.clone() });
                                Located::Invalid
                            }
                        }
                    }
                    _ => Located::Lookup(OwnerKey::of(n, o)),
                };
                if let Located::Graph(j) = l {
                    dependents.entry(j).or_default().push(i);
                }
                refs.push(l);
            }
            located.push(refs);
        }
        Graph { nodes, located, dependents, invalid }
    }

    /// The owners the plan needs a live verdict on: references of dependents that are
    /// not being deleted and whose owner the graph does not hold.
    pub fn lookups(&self) -> Vec<OwnerKey> {
        let mut out: Vec<OwnerKey> = self
            .nodes
            .iter()
            .zip(&self.located)
            .filter(|(n, _)| !n.deleting)
            .flat_map(|(_, refs)| refs.iter())
            .filter_map(|l| match l {
                Located::Lookup(k) => Some(k.clone()),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// References to report as `OwnerRefInvalidNamespace`.
    pub fn invalid_refs(&self) -> &[InvalidRef] {
        &self.invalid
    }

    /// The decision. `states` holds the live verdicts on [`Graph::lookups`] (a missing one
    /// is `Unknown`). `complete` says every monitored resource is in the snapshot: only
    /// then may an owner's `orphan` or `foregroundDeletion` finalizer go, since a dependent
    /// the snapshot lacks would otherwise keep its reference or outlive the owner.
    pub fn plan(&self, states: &HashMap<OwnerKey, OwnerState>, complete: bool) -> Vec<GcAction> {
        let nodes = self.nodes;
        let mut actions = Vec::new();

        // Owners being deleted with a garbage-collection finalizer.
        for (i, n) in nodes.iter().enumerate() {
            if !n.deleting {
                continue;
            }
            let deps = self.dependents.get(&i).map(Vec::as_slice).unwrap_or_default();
            if n.has_finalizer(ORPHAN) {
                for &d in deps {
                    actions.push(GcAction::RemoveOwnerRefs { node: d, owner_uids: vec![n.uid.clone()] });
                }
                if complete {
                    actions.push(GcAction::RemoveFinalizer { node: i, finalizer: ORPHAN });
                }
            } else if n.has_finalizer(FOREGROUND) {
                // The dependents themselves are decided below, each on all its owners.
                let blocking = deps
                    .iter()
                    .any(|&d| nodes[d].owners.iter().any(|o| o.uid == n.uid && o.block_owner_deletion == Some(true)));
                if !blocking && complete {
                    actions.push(GcAction::RemoveFinalizer { node: i, finalizer: FOREGROUND });
                }
            }
        }

        // Each dependent, on all its owners (Kubernetes' attemptToDeleteItem).
        for (i, n) in nodes.iter().enumerate() {
            if n.owners.is_empty() || n.deleting {
                continue;
            }
            let (mut solid, mut unknown) = (0, 0);
            let (mut absent, mut waiting) = (Vec::new(), Vec::new());
            for (o, l) in n.owners.iter().zip(&self.located[i]) {
                match l {
                    Located::Graph(j) if nodes[*j].deleting && nodes[*j].has_finalizer(FOREGROUND) => {
                        waiting.push(o.uid.clone())
                    }
                    Located::Graph(_) => solid += 1,
                    Located::Lookup(k) => match states.get(k).unwrap_or(&OwnerState::Unknown) {
                        OwnerState::Present => solid += 1,
                        OwnerState::Absent => absent.push(o.uid.clone()),
                        OwnerState::Unknown => unknown += 1,
                    },
                    Located::Invalid => unknown += 1,
                }
            }
            if solid > 0 {
                // Kept by a live owner: drop the references to gone owners and to owners
                // waiting for their dependents (which would otherwise wait forever).
                let drop: Vec<String> = absent.into_iter().chain(waiting).collect();
                if !drop.is_empty() {
                    actions.push(GcAction::RemoveOwnerRefs { node: i, owner_uids: drop });
                }
                continue;
            }
            if unknown > 0 {
                continue; // wait for a verdict
            }
            let has_dependents = self.dependents.get(&i).is_some_and(|v| !v.is_empty());
            let policy = if !waiting.is_empty() && has_dependents {
                // An owner is deleted in the foreground: so is this one, dependents first.
                "Foreground"
            } else if n.has_finalizer(ORPHAN) {
                "Orphan"
            } else if n.has_finalizer(FOREGROUND) {
                "Foreground"
            } else {
                "Background"
            };
            actions.push(GcAction::Delete { node: i, policy });
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(uid: &str, owners: &[(&str, bool)]) -> Node {
        Node {
            resource: 0,
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            namespace: Some("default".into()),
            name: uid.into(),
            uid: uid.into(),
            resource_version: Some("1".into()),
            owners: owners
                .iter()
                .map(|(o, block)| OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: o.to_string(),
                    uid: o.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(*block),
                })
                .collect(),
            deleting: false,
            finalizers: vec![],
        }
    }

    fn key(n: &Node, k: usize) -> OwnerKey {
        OwnerKey::of(n, &n.owners[k])
    }

    fn states(pairs: &[(OwnerKey, OwnerState)]) -> HashMap<OwnerKey, OwnerState> {
        pairs.iter().cloned().collect()
    }

    #[test]
    fn an_owner_outside_the_graph_is_read_and_only_a_verified_absence_deletes() {
        let nodes = vec![node("pod", &[("rs", true)])];
        let g = Graph::new(&nodes);
        assert_eq!(g.lookups(), vec![key(&nodes[0], 0)]);
        // No verdict, or an unknown one (kind not served, read failed): wait.
        assert!(g.plan(&HashMap::new(), true).is_empty());
        assert!(g.plan(&states(&[(key(&nodes[0], 0), OwnerState::Unknown)]), true).is_empty());
        // Present (e.g. a custom resource the collector does not monitor yet): keep.
        assert!(g.plan(&states(&[(key(&nodes[0], 0), OwnerState::Present)]), true).is_empty());
        // Verified absent: delete in the background.
        assert_eq!(
            g.plan(&states(&[(key(&nodes[0], 0), OwnerState::Absent)]), true),
            vec![GcAction::Delete { node: 0, policy: "Background" }]
        );
        // With its owner in the graph there is nothing to read and nothing to do.
        let with_owner = vec![node("pod", &[("rs", true)]), node("rs", &[])];
        let g = Graph::new(&with_owner);
        assert!(g.lookups().is_empty());
        assert!(g.plan(&HashMap::new(), true).is_empty());
    }

    #[test]
    fn a_uid_match_with_another_identity_is_not_the_owner() {
        // The reference names "rs" but the object with that uid is called "other".
        let mut rs = node("rs", &[]);
        rs.name = "other".into();
        let nodes = vec![node("pod", &[("rs", true)]), rs];
        let g = Graph::new(&nodes);
        assert_eq!(g.lookups(), vec![key(&nodes[0], 0)]);
        assert!(g.plan(&HashMap::new(), true).is_empty());
        // Another kind under the uid is not it either.
        let mut cm = node("rs", &[]);
        cm.api_version = "v1".into();
        cm.kind = "ConfigMap".into();
        let nodes = vec![node("pod", &[("rs", true)]), cm];
        assert_eq!(Graph::new(&nodes).lookups().len(), 1);
        // Another version of the same group and kind is the same object.
        let mut v2 = node("rs", &[]);
        v2.api_version = "apps/v2".into();
        let nodes = vec![node("pod", &[("rs", true)]), v2];
        assert!(Graph::new(&nodes).lookups().is_empty());
    }

    #[test]
    fn references_across_namespaces_are_reported_and_never_resolve_to_the_other_object() {
        // A namespaced dependent naming an owner of another namespace: reported, and
        // looked up in its own namespace.
        let mut owner = node("rs", &[]);
        owner.namespace = Some("other".into());
        let nodes = vec![node("pod", &[("rs", true)]), owner];
        let g = Graph::new(&nodes);
        assert_eq!(g.invalid_refs(), &[InvalidRef { node: 0, owner: nodes[0].owners[0].clone() }]);
        assert_eq!(g.lookups(), vec![key(&nodes[0], 0)]);
        assert_eq!(g.lookups()[0].namespace.as_deref(), Some("default"));
        // A cluster-scoped owner of a namespaced dependent is fine.
        let mut owner = node("rs", &[]);
        owner.namespace = None;
        let nodes = vec![node("pod", &[("rs", true)]), owner];
        let g = Graph::new(&nodes);
        assert!(g.invalid_refs().is_empty() && g.lookups().is_empty());
        // A cluster-scoped dependent of a namespaced owner: reported, kept forever.
        let mut dep = node("pv", &[("rs", true)]);
        dep.namespace = None;
        let nodes = vec![dep, node("rs", &[])];
        let g = Graph::new(&nodes);
        assert_eq!(g.invalid_refs().len(), 1);
        assert!(g.lookups().is_empty());
        assert!(g.plan(&HashMap::new(), true).is_empty());
    }

    #[test]
    fn orphan_finalizer_releases_dependents_then_goes_once_the_graph_is_complete() {
        let mut rs = node("rs", &[]);
        rs.deleting = true;
        rs.finalizers = vec![ORPHAN.into()];
        let nodes = vec![node("pod", &[("rs", true)]), rs];
        let g = Graph::new(&nodes);
        assert_eq!(
            g.plan(&HashMap::new(), true),
            vec![
                GcAction::RemoveOwnerRefs { node: 0, owner_uids: vec!["rs".into()] },
                GcAction::RemoveFinalizer { node: 1, finalizer: ORPHAN }
            ]
        );
        assert_eq!(
            g.plan(&HashMap::new(), false),
            vec![GcAction::RemoveOwnerRefs { node: 0, owner_uids: vec!["rs".into()] }]
        );
    }

    #[test]
    fn foreground_deletes_dependents_and_waits_for_blocking_ones() {
        let mut d = node("deploy", &[]);
        d.deleting = true;
        d.finalizers = vec![FOREGROUND.into()];
        let rs = node("rs", &[("deploy", true)]);
        let pod = node("pod", &[("rs", true)]);
        let nodes = vec![d.clone(), rs, pod];
        // The ReplicaSet has dependents: deleted in the foreground too; owner waits.
        assert_eq!(
            Graph::new(&nodes).plan(&HashMap::new(), true),
            vec![GcAction::Delete { node: 1, policy: "Foreground" }]
        );
        // Once the blocking dependent is gone the finalizer is removed — not while a
        // monitored resource is missing from the snapshot.
        let alone = [d.clone()];
        assert_eq!(
            Graph::new(&alone).plan(&HashMap::new(), true),
            vec![GcAction::RemoveFinalizer { node: 0, finalizer: FOREGROUND }]
        );
        assert!(Graph::new(&alone).plan(&HashMap::new(), false).is_empty());
        // A non-blocking dependent does not hold the owner.
        let nodes = [d, node("cm", &[("deploy", false)])];
        let acts = Graph::new(&nodes).plan(&HashMap::new(), true);
        assert!(acts.contains(&GcAction::RemoveFinalizer { node: 0, finalizer: FOREGROUND }));
        assert!(acts.contains(&GcAction::Delete { node: 1, policy: "Background" }));
    }

    #[test]
    fn a_dependent_with_another_live_owner_is_released_not_deleted_by_a_foreground_owner() {
        let mut d = node("deploy", &[]);
        d.deleting = true;
        d.finalizers = vec![FOREGROUND.into()];
        let nodes = vec![d, node("cm", &[("deploy", true), ("rs", false)]), node("rs", &[])];
        assert_eq!(
            Graph::new(&nodes).plan(&HashMap::new(), true),
            vec![GcAction::RemoveOwnerRefs { node: 1, owner_uids: vec!["deploy".into()] }]
        );
    }

    #[test]
    fn verified_dangling_refs_are_dropped_when_another_owner_lives() {
        let nodes = vec![node("pod", &[("gone", false), ("rs", true)]), node("rs", &[])];
        let g = Graph::new(&nodes);
        assert!(g.plan(&HashMap::new(), true).is_empty(), "an unverified owner keeps its reference");
        assert_eq!(
            g.plan(&states(&[(key(&nodes[0], 0), OwnerState::Absent)]), true),
            vec![GcAction::RemoveOwnerRefs { node: 0, owner_uids: vec!["gone".into()] }]
        );
    }

    #[test]
    fn one_unknown_owner_keeps_a_dependent_whose_other_owners_are_gone() {
        let nodes = vec![node("pod", &[("gone", false), ("crd-owner", true)])];
        let g = Graph::new(&nodes);
        let s = states(&[(key(&nodes[0], 0), OwnerState::Absent), (key(&nodes[0], 1), OwnerState::Unknown)]);
        assert!(g.plan(&s, true).is_empty());
    }

    #[test]
    fn dependents_being_deleted_need_no_verdicts() {
        let mut pod = node("pod", &[("rs", true)]);
        pod.deleting = true;
        let nodes = [pod];
        let g = Graph::new(&nodes);
        assert!(g.lookups().is_empty());
        assert!(g.plan(&HashMap::new(), true).is_empty());
    }
}
