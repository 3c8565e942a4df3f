//! MiniK8s API machinery: pure functions that the apiserver, our kubectl, the scheduler and
//! the controller-manager share.
//!
//! - [`strategicpatch`] — Kubernetes' strategic merge patch, driven by the OpenAPI schema's
//!   `x-kubernetes-patch-merge-key` / `x-kubernetes-patch-strategy` extensions.
//! - [`fieldmanager`] — server-side apply: managedFields, conflicts, the apply merge.
//! - [`duration`] — the short human durations `kubectl get` prints in AGE columns.
//! - [`printers`] — renderings tables and describe share (access modes).
//! - [`quantity`] — resource quantities (`100m`, `128Mi`) as numbers.
//! - [`names`] — generated-name suffixes and the hash encoding of `pod-template-hash`.
//! - [`labels`] — label selectors: the string form, `metav1.LabelSelector`, matching.
//! - [`validation`] — the rules for names, label keys and label values.
//! - [`scheduling`] — tolerations against taints and node selectors against nodes.
//! - [`resources`] — native, hugepage and extended resource names.
//! - [`openapiproto`] — the protobuf form of an OpenAPI v2 document (what kubectl asks for).

pub mod duration;
pub mod fieldmanager;
pub mod labels;
pub mod names;
pub mod openapiproto;
pub mod printers;
pub mod quantity;
pub mod resources;
pub mod scheduling;
pub mod strategicpatch;
pub mod validation;
