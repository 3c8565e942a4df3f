//! The HorizontalPodAutoscaler controller (`horizontalpodautoscaling`,
//! `pkg/controller/podautoscaler`): every sync period, for each `autoscaling/v2` HPA, read
//! the target's `scale` subresource (any kind that has one: Deployments, ReplicaSets,
//! StatefulSets, custom resources), ask each metric what replica count it wants
//! ([`replicas`], from [`metrics`]), take the largest, stabilize and rate-limit it
//! ([`normalize`]), write the scale and the HPA's status, conditions and events as
//! upstream does.
//!
//! [`decide`] is the whole decision (pure); [`reconcile`] gathers its inputs and applies
//! its output.

pub mod metrics;
pub mod normalize;
pub mod replicas;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::events::{Recorder, NORMAL, WARNING};
use futures::StreamExt;
use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, CrossVersionObjectReference, HorizontalPodAutoscaler as Hpa,
    HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus, MetricIdentifier, MetricSpec, MetricStatus,
    MetricValueStatus, ObjectMetricStatus, PodsMetricStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use self::normalize::{Args, History, Normalized};
use self::replicas::{Proposal, Resource, Sample, Settings};
use crate::discovery::{group_of, Catalog};
use crate::informer::Informer;

/// The controller's flags (kube-controller-manager's names).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// `--horizontal-pod-autoscaler-sync-period` (15 s).
    pub sync_period: Duration,
    /// `--horizontal-pod-autoscaler-downscale-stabilization` (5 min).
    pub downscale_stabilization: Duration,
    pub calc: Settings,
}

/// What one metric said: its status entry, and a proposal or why there is none.
#[derive(Clone, Debug)]
pub struct MetricResult {
    pub status: Option<MetricStatus>,
    /// (replicas, the metric's name in messages) or (condition reason, error).
    pub outcome: Result<(i32, String), (&'static str, String)>,
}

/// Everything [`decide`] needs of the target and its metrics.
#[derive(Clone, Debug)]
pub enum Observed {
    /// The scale could not be read (unknown kind, no scale subresource, not found).
    NoScale(String),
    /// The target's scale has no usable selector.
    BadSelector { event: &'static str, message: String },
    /// The scale and, unless scaling is disabled or out of bounds, each metric's result.
    Scale { current: i32, metrics: Vec<MetricResult> },
}

/// A condition to set: (type, status, reason, message).
pub type Condition = (&'static str, bool, String, String);

/// What [`decide`] wants done.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Set the target's replicas to this.
    pub rescale_to: Option<i32>,
    pub current: i32,
    pub desired: i32,
    pub conditions: Vec<Condition>,
    /// (type, reason, message)
    pub events: Vec<(&'static str, &'static str, String)>,
    pub metrics: Option<Vec<MetricStatus>>,
}

fn cond(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Condition {
    (type_, status, reason.to_string(), message.into())
}

/// `reconcileAutoscaler`'s decision.
pub fn decide(hpa: &Hpa, observed: Observed, history: &mut History, cfg: &Config, now: Timestamp) -> Decision {
    let spec = &hpa.spec;
    let min = spec.min_replicas.unwrap_or(1);
    let max = spec.max_replicas;
    let mut d = Decision::default();
    let (current, metrics) = match observed {
        Observed::NoScale(e) => {
            d.events.push((WARNING, "FailedGetScale", e.clone()));
            d.conditions.push(cond(
                "AbleToScale",
                false,
                "FailedGetScale",
                format!("the HPA controller was unable to get the target's current scale: {e}"),
            ));
            d.current = hpa.status.as_ref().and_then(|s| s.current_replicas).unwrap_or(0);
            d.desired = hpa.status.as_ref().map(|s| s.desired_replicas).unwrap_or(0);
            return d;
        }
        Observed::BadSelector { event, message } => {
            d.events.push((WARNING, event, message.clone()));
            d.conditions.push(cond(
                "AbleToScale",
                true,
                "SucceededGetScale",
                "the HPA controller was able to get the target's current scale",
            ));
            d.conditions.push(cond("ScalingActive", false, "InvalidSelector", message));
            return d;
        }
        Observed::Scale { current, metrics } => (current, metrics),
    };
    d.current = current;
    d.conditions.push(cond(
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale",
    ));
    let mut reason = String::new();
    let desired = if current == 0 && min != 0 {
        d.conditions.push(cond(
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
        ));
        d.desired = 0;
        return d;
    } else if current > max {
        reason = "Current number of replicas above Spec.MaxReplicas".into();
        max
    } else if current < min {
        reason = "Current number of replicas below Spec.MinReplicas".into();
        min
    } else {
        // computeReplicasForMetrics: the largest valid proposal; invalid metrics block a
        // scale-down and, if all are invalid, the whole sync.
        let statuses: Vec<MetricStatus> = metrics.iter().filter_map(|m| m.status.clone()).collect();
        let mut best: Option<(i32, String)> = None;
        let mut first_invalid: Option<(&'static str, String)> = None;
        let mut invalid = 0;
        for m in &metrics {
            match &m.outcome {
                Ok((r, name)) => {
                    if best.as_ref().is_none_or(|(b, _)| *r > *b) {
                        best = Some((*r, name.clone()));
                    }
                }
                Err((why, e)) => {
                    d.events.push((WARNING, why, e.clone()));
                    invalid += 1;
                    first_invalid.get_or_insert((why, e.clone()));
                }
            }
        }
        d.metrics = Some(statuses);
        let proposal = best.as_ref().map(|b| b.0).unwrap_or(0);
        if let Some((why, e)) = first_invalid.filter(|_| invalid >= metrics.len() || proposal < current) {
            d.conditions.push(cond(
                "ScalingActive",
                false,
                why,
                format!("the HPA was unable to compute the replica count: {e}"),
            ));
            d.events.push((
                WARNING,
                "FailedComputeMetricsReplicas",
                format!("invalid metrics ({invalid} invalid out of {}), first error is: {e}", metrics.len()),
            ));
            d.desired = hpa.status.as_ref().map(|s| s.desired_replicas).unwrap_or(current);
            return d;
        }
        let (proposal, name) = best.unwrap_or((0, String::new()));
        d.conditions.push(cond(
            "ScalingActive",
            true,
            "ValidMetricFound",
            format!("the HPA was able to successfully calculate a replica count from {name}"),
        ));
        if proposal > current {
            reason = format!("{name} above target");
        } else if proposal < current {
            reason = "All metrics below target".into();
        }
        let args = Args { min, max, current, desired: proposal };
        let down = SignedDuration::try_from(cfg.downscale_stabilization).unwrap_or(SignedDuration::from_secs(300));
        let n: Normalized = match &spec.behavior {
            None => normalize::without_behavior(history, args, down, now),
            Some(b) => normalize::with_behavior(history, b, args, down, now),
        };
        let (able, able_reason, able_message) = n.able_to_scale;
        d.conditions[0] = cond("AbleToScale", able, able_reason, able_message);
        let (limited, lreason, lmessage) = n.scaling_limited;
        d.conditions.push(cond("ScalingLimited", limited, lreason, lmessage));
        n.replicas
    };
    d.desired = desired;
    if desired != current {
        normalize::record_rescale(history, spec.behavior.as_ref(), current, desired, now);
        d.rescale_to = Some(desired);
        d.events.push((NORMAL, "SuccessfulRescale", format!("New size: {desired}; reason: {reason}")));
        d.conditions[0] = cond(
            "AbleToScale",
            true,
            "SucceededRescale",
            format!("the HPA controller was able to update the target scale to {desired}"),
        );
    }
    d
}

/// `setCondition`: replace the condition of that type, keeping its transition time when
/// the status did not change.
pub fn merge_conditions(
    old: &[HorizontalPodAutoscalerCondition],
    new: &[Condition],
    now: Timestamp,
) -> Vec<HorizontalPodAutoscalerCondition> {
    let mut out: Vec<HorizontalPodAutoscalerCondition> = old.to_vec();
    for (type_, status, reason, message) in new {
        let status = if *status { "True" } else { "False" }.to_string();
        let since = out
            .iter()
            .find(|c| c.type_ == *type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        let c = HorizontalPodAutoscalerCondition {
            type_: type_.to_string(),
            status,
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            last_transition_time: Some(since),
            observed_generation: None,
        };
        match out.iter_mut().find(|o| o.type_ == *type_) {
            Some(o) => *o = c,
            None => out.push(c),
        }
    }
    out
}

/// A milli-unit value as a quantity (`resource.NewMilliQuantity`, DecimalSI).
pub fn milli_quantity(v: i64) -> Quantity {
    if v % 1000 == 0 {
        Quantity((v / 1000).to_string())
    } else {
        Quantity(format!("{v}m"))
    }
}

// ------------------------------------------------------------------ the I/O shell

struct Ctx {
    client: kube::Client,
    pods: Informer<Pod>,
    catalog: watch::Receiver<Arc<Catalog>>,
    source: metrics::Source,
    events: Recorder,
    cfg: Config,
    histories: Mutex<HashMap<String, History>>,
}

/// Run until the HPA watch ends: every HPA each sync period, and an HPA whose spec
/// changed (generation not yet observed) at once.
pub async fn run(
    client: kube::Client,
    pods: Informer<Pod>,
    catalog: watch::Receiver<Arc<Catalog>>,
    events: Recorder,
    cfg: Config,
) {
    let hpas = Informer::start(Api::<Hpa>::all(client.clone()));
    let (tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<Arc<Hpa>>();
    hpas.add_handler(move |h: &Hpa, deleted| {
        let observed = h.status.as_ref().and_then(|s| s.observed_generation);
        if !deleted && observed != h.metadata.generation {
            let _ = tx.send(Arc::new(h.clone()));
        }
    });
    let ctx = Arc::new(Ctx {
        source: metrics::Source::new(client.clone()),
        client,
        pods: pods.clone(),
        catalog,
        events,
        cfg,
        histories: Mutex::default(),
    });
    hpas.synced().await;
    pods.synced().await;
    let mut tick = tokio::time::interval(cfg.sync_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut full_pass = false;
        let batch: Vec<Arc<Hpa>> = tokio::select! {
            _ = tick.tick() => {
                full_pass = true;
                let all = hpas.state();
                let keys: std::collections::HashSet<String> = all.iter().map(|h| crate::util::key(&h.metadata)).collect();
                if let Ok(mut hs) = ctx.histories.lock() {
                    hs.retain(|k, _| keys.contains(k));
                }
                all
            }
            Some(h) = changed.recv() => {
                // A burst of new or changed HPAs is one concurrent batch, not a queue.
                let mut batch = BTreeMap::new();
                batch.insert(crate::util::key(&h.metadata), h);
                while let Ok(h) = changed.try_recv() {
                    batch.insert(crate::util::key(&h.metadata), h);
                }
                batch.into_values().collect()
            }
            else => return,
        };
        let started = std::time::Instant::now();
        futures::stream::iter(batch)
            .for_each_concurrent(32, |hpa| {
                let ctx = ctx.clone();
                async move {
                    let ok = match reconcile(&ctx, &hpa).await {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::warn!(hpa = %crate::util::key(&hpa.metadata), error = %e, "horizontal pod autoscaler sync failed");
                            false
                        }
                    };
                    crate::metrics::sync("horizontalpodautoscaling", ok);
                }
            })
            .await;
        if full_pass {
            crate::metrics::hpa_pass_seconds(started.elapsed().as_secs_f64());
            tracing::debug!(elapsed = ?started.elapsed(), "horizontal pod autoscalers synced");
        }
    }
}

async fn reconcile(ctx: &Ctx, hpa: &Hpa) -> Result<(), kube::Error> {
    let ns = hpa.metadata.namespace.clone().unwrap_or_default();
    let name = hpa.metadata.name.clone().unwrap_or_default();
    let key = format!("{ns}/{name}");
    let now = Timestamp::now();
    let target = &hpa.spec.scale_target_ref;
    let target_api = target.api_version.clone().unwrap_or_default();
    let served = ctx.catalog.borrow().resolve(&target_api, &target.kind).cloned();
    let mut scale_api = None;
    let observed = match served {
        None => {
            Observed::NoScale(format!("no matches for kind \"{}\" in group \"{}\"", target.kind, group_of(&target_api)))
        }
        Some(s) => {
            let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &s.ar);
            match api.get_scale(&target.name).await {
                Err(kube::Error::Api(e)) => Observed::NoScale(e.message),
                Err(e) => return Err(e),
                Ok(scale) => {
                    let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                    scale_api = Some(api);
                    observe_metrics(ctx, hpa, &ns, current, scale.status.as_ref().and_then(|s| s.selector.clone()), now)
                        .await
                }
            }
        }
    };
    let decision = {
        let mut hs = ctx.histories.lock().unwrap_or_else(|e| e.into_inner());
        let h = hs.entry(key.clone()).or_default();
        decide(hpa, observed, h, &ctx.cfg, now)
    };
    let mut last_scale = hpa.status.as_ref().and_then(|s| s.last_scale_time.clone());
    let mut conditions = decision.conditions.clone();
    if let (Some(replicas), Some(api)) = (decision.rescale_to, scale_api) {
        let patch = json!({"spec": {"replicas": replicas}});
        match api.patch_scale(&target.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                last_scale = Some(Time(now));
                tracing::info!(hpa = %key, from = decision.current, to = replicas, "rescaled");
            }
            Err(e) => {
                let msg = e.to_string();
                ctx.events.event(hpa, WARNING, "FailedRescale", format!("New size: {replicas}; error: {msg}"));
                conditions[0] = cond(
                    "AbleToScale",
                    false,
                    "FailedUpdateScale",
                    format!("the HPA controller was unable to update the target scale: {msg}"),
                );
            }
        }
    }
    for (type_, reason, message) in &decision.events {
        if *reason == "SuccessfulRescale" && last_scale.as_ref().map(|t| t.0) != Some(now) {
            continue;
        }
        ctx.events.event(hpa, type_, reason, message.clone());
    }
    let old = hpa.status.clone().unwrap_or_default();
    let status = HorizontalPodAutoscalerStatus {
        current_replicas: Some(decision.current),
        desired_replicas: decision.desired,
        current_metrics: decision.metrics.clone().or(old.current_metrics.clone()),
        conditions: Some(merge_conditions(old.conditions.as_deref().unwrap_or_default(), &conditions, now)),
        last_scale_time: last_scale,
        observed_generation: hpa.metadata.generation,
    };
    let api: Api<Hpa> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await?;
    Ok(())
}

/// The pods of the target (from the pod informer) and each metric's result.
async fn observe_metrics(
    ctx: &Ctx,
    hpa: &Hpa,
    ns: &str,
    current: i32,
    selector: Option<String>,
    now: Timestamp,
) -> Observed {
    let min = hpa.spec.min_replicas.unwrap_or(1);
    if (current == 0 && min != 0) || current > hpa.spec.max_replicas || current < min {
        return Observed::Scale { current, metrics: Vec::new() };
    }
    let selector = match selector.as_deref().filter(|s| !s.is_empty()) {
        None => {
            return Observed::BadSelector {
                event: "SelectorRequired",
                message: "the HPA target's scale is missing a selector".into(),
            }
        }
        Some(s) => s.to_string(),
    };
    let parsed = match apimachinery::labels::Selector::parse(&selector) {
        Ok(p) => p,
        Err(e) => {
            return Observed::BadSelector {
                event: "InvalidSelector",
                message: format!("the HPA target's scale has an invalid selector: {}", e.0),
            }
        }
    };
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
        .filter(|p| parsed.matches(&p.metadata.labels.clone().unwrap_or_default()))
        .collect();
    let mut results = Vec::new();
    for spec in hpa.spec.metrics.clone().unwrap_or_else(default_metrics) {
        results.push(metric(ctx, ns, &spec, current, &selector, &pods, now).await);
    }
    Observed::Scale { current, metrics: results }
}

/// An HPA without metrics targets 80% CPU (the API's default).
fn default_metrics() -> Vec<MetricSpec> {
    serde_json::from_value(json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]))
        .unwrap_or_default()
}

/// One metric's proposal and status (`computeReplicasForMetric`).
async fn metric(
    ctx: &Ctx,
    ns: &str,
    spec: &MetricSpec,
    current: i32,
    selector: &str,
    pods: &[Arc<Pod>],
    now: Timestamp,
) -> MetricResult {
    let calc = &ctx.cfg.calc;
    let fail = |why: &'static str, e: String| MetricResult { status: None, outcome: Err((why, e)) };
    match spec.type_.as_str() {
        "Resource" | "ContainerResource" => {
            let (resource, container, target) = match (&spec.resource, &spec.container_resource) {
                (Some(r), _) if spec.type_ == "Resource" => (r.name.clone(), None, r.target.clone()),
                (_, Some(c)) if spec.type_ == "ContainerResource" => {
                    (c.name.clone(), Some(c.container.clone()), c.target.clone())
                }
                _ => return fail("FailedGetResourceMetric", format!("missing {} metric source", spec.type_)),
            };
            let kind = if resource == "cpu" { Resource::Cpu } else { Resource::Other };
            let why = if container.is_some() { "FailedGetContainerResourceMetric" } else { "FailedGetResourceMetric" };
            let infos: Vec<_> = pods.iter().map(|p| metrics::pod_info(p, &resource, container.as_deref())).collect();
            let names: Vec<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
            let samples = match ctx.source.resource(ns, &names, &resource, container.as_deref()).await {
                Ok(s) => s,
                Err(e) => return fail(why, format!("failed to get {resource} utilization: {e}")),
            };
            let (proposal, what): (Result<Proposal, String>, &str) =
                match (target.average_utilization, &target.average_value) {
                    (Some(u), _) if target.type_ == "Utilization" => {
                        (replicas::utilization_replicas(current, u, kind, &infos, &samples, now, calc), "utilization")
                    }
                    (_, Some(v)) => (
                        replicas::average_value_replicas(
                            current,
                            apimachinery::quantity::milli_value(&v.0),
                            kind,
                            &infos,
                            &samples,
                            now,
                            calc,
                        ),
                        "usage",
                    ),
                    _ => (Err(format!("invalid {resource} target")), "utilization"),
                };
            let p = match proposal {
                Ok(p) => p,
                Err(e) => return fail(why, format!("failed to get {resource} {what}: {e}")),
            };
            let value = MetricValueStatus {
                average_utilization: p.utilization,
                average_value: Some(milli_quantity(p.average)),
                value: None,
            };
            let (status, name) = match container {
                None => (
                    MetricStatus {
                        type_: "Resource".into(),
                        resource: Some(ResourceMetricStatus { name: resource.clone(), current: value }),
                        ..Default::default()
                    },
                    resource.clone(),
                ),
                Some(c) => (
                    MetricStatus {
                        type_: "ContainerResource".into(),
                        container_resource: Some(ContainerResourceMetricStatus {
                            name: resource.clone(),
                            container: c,
                            current: value,
                        }),
                        ..Default::default()
                    },
                    format!("{resource} container"),
                ),
            };
            let label = if p.utilization.is_some() {
                format!("{name} resource utilization (percentage of request)")
            } else {
                format!("{name} resource")
            };
            MetricResult { status: Some(status), outcome: Ok((p.replicas, label)) }
        }
        "Pods" => {
            let Some(m) = &spec.pods else { return fail("FailedGetPodsMetric", "missing pods metric source".into()) };
            let Some(target) = m.target.average_value.as_ref() else {
                return fail("FailedGetPodsMetric", "a pods metric needs an averageValue target".into());
            };
            let samples: BTreeMap<String, Sample> = match ctx.source.pods(ns, selector, &m.metric.name).await {
                Ok(s) => s,
                Err(e) => return fail("FailedGetPodsMetric", format!("unable to get metric {}: {e}", m.metric.name)),
            };
            let infos: Vec<_> = pods.iter().map(|p| metrics::pod_info(p, "", None)).collect();
            match replicas::average_value_replicas(
                current,
                apimachinery::quantity::milli_value(&target.0),
                Resource::Other,
                &infos,
                &samples,
                now,
                calc,
            ) {
                Ok(p) => MetricResult {
                    status: Some(MetricStatus {
                        type_: "Pods".into(),
                        pods: Some(PodsMetricStatus {
                            metric: m.metric.clone(),
                            current: MetricValueStatus {
                                average_value: Some(milli_quantity(p.average)),
                                ..Default::default()
                            },
                        }),
                        ..Default::default()
                    }),
                    outcome: Ok((p.replicas, format!("pods metric {}", m.metric.name))),
                },
                Err(e) => fail("FailedGetPodsMetric", format!("unable to get metric {}: {e}", m.metric.name)),
            }
        }
        "Object" => {
            let Some(m) = &spec.object else {
                return fail("FailedGetObjectMetric", "missing object metric source".into());
            };
            let described = &m.described_object;
            let Some(served) = ctx
                .catalog
                .borrow()
                .resolve(described.api_version.as_deref().unwrap_or("v1"), &described.kind)
                .cloned()
            else {
                return fail(
                    "FailedGetObjectMetric",
                    format!("unable to get metric {}: no matches for kind \"{}\"", m.metric.name, described.kind),
                );
            };
            let plural_group = if served.ar.group.is_empty() {
                served.ar.plural.clone()
            } else {
                format!("{}.{}", served.ar.plural, served.ar.group)
            };
            let usage = match ctx.source.object(ns, &plural_group, &described.name, &m.metric.name).await {
                Ok(u) => u,
                Err(e) => {
                    return fail(
                        "FailedGetObjectMetric",
                        format!("unable to get metric {}: {}/{}: {e}", m.metric.name, described.kind, described.name),
                    )
                }
            };
            let infos: Vec<_> = pods.iter().map(|p| metrics::pod_info(p, "", None)).collect();
            let (p, current_value) = match (&m.target.value, &m.target.average_value) {
                (Some(v), _) if m.target.type_ == "Value" => (
                    replicas::object_value_replicas(
                        current,
                        usage,
                        apimachinery::quantity::milli_value(&v.0),
                        replicas::ready_pods(&infos),
                        calc,
                    ),
                    MetricValueStatus { value: Some(milli_quantity(usage)), ..Default::default() },
                ),
                (_, Some(v)) => {
                    let p = replicas::total_average_replicas(
                        current,
                        usage,
                        apimachinery::quantity::milli_value(&v.0),
                        calc,
                    );
                    (p, MetricValueStatus { average_value: Some(milli_quantity(p.average)), ..Default::default() })
                }
                _ => {
                    return fail(
                        "FailedGetObjectMetric",
                        "an object metric needs a value or averageValue target".into(),
                    )
                }
            };
            MetricResult {
                status: Some(MetricStatus {
                    type_: "Object".into(),
                    object: Some(ObjectMetricStatus {
                        metric: MetricIdentifier { name: m.metric.name.clone(), selector: m.metric.selector.clone() },
                        described_object: CrossVersionObjectReference { ..described.clone() },
                        current: current_value,
                    }),
                    ..Default::default()
                }),
                outcome: Ok((p.replicas, format!("{} metric {}", described.kind, m.metric.name))),
            }
        }
        "External" => fail(
            "FailedGetExternalMetric",
            "unable to get external metric: no external.metrics.k8s.io adapter is served by this cluster".into(),
        ),
        other => fail("InvalidMetricSourceType", format!("unknown metric source type {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(min: i32, max: i32) -> Hpa {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 1},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": min, "maxReplicas": max},
        }))
        .unwrap()
    }

    fn cfg() -> Config {
        Config {
            sync_period: Duration::from_secs(15),
            downscale_stabilization: Duration::from_secs(300),
            calc: Settings::default(),
        }
    }

    fn ok(replicas: i32) -> MetricResult {
        MetricResult {
            status: Some(MetricStatus { type_: "Resource".into(), ..Default::default() }),
            outcome: Ok((replicas, "cpu resource utilization (percentage of request)".into())),
        }
    }

    fn bad() -> MetricResult {
        MetricResult {
            status: None,
            outcome: Err(("FailedGetResourceMetric", "failed to get cpu utilization: missing request for cpu".into())),
        }
    }

    fn reasons(d: &Decision) -> Vec<(&str, bool, &str)> {
        d.conditions.iter().map(|(t, s, r, _)| (*t, *s, r.as_str())).collect()
    }

    #[test]
    fn scales_up_with_upstream_event_and_conditions() {
        let t = Timestamp::from_second(1_700_000_000).unwrap();
        let d = decide(
            &hpa(1, 10),
            Observed::Scale { current: 2, metrics: vec![ok(4), ok(3)] },
            &mut History::default(),
            &cfg(),
            t,
        );
        assert_eq!(d.rescale_to, Some(4));
        assert_eq!(
            d.events,
            vec![(
                NORMAL,
                "SuccessfulRescale",
                "New size: 4; reason: cpu resource utilization (percentage of request) above target".to_string()
            )]
        );
        assert_eq!(
            reasons(&d),
            vec![
                ("AbleToScale", true, "SucceededRescale"),
                ("ScalingActive", true, "ValidMetricFound"),
                ("ScalingLimited", false, "DesiredWithinRange")
            ]
        );
    }

    #[test]
    fn bounds_and_disabled_scaling() {
        let t = Timestamp::from_second(1_700_000_000).unwrap();
        let d = decide(&hpa(1, 5), Observed::Scale { current: 8, metrics: vec![] }, &mut History::default(), &cfg(), t);
        assert_eq!(d.rescale_to, Some(5));
        assert_eq!(d.events[0].2, "New size: 5; reason: Current number of replicas above Spec.MaxReplicas");
        let d = decide(&hpa(3, 5), Observed::Scale { current: 1, metrics: vec![] }, &mut History::default(), &cfg(), t);
        assert_eq!(d.rescale_to, Some(3));
        let d = decide(&hpa(1, 5), Observed::Scale { current: 0, metrics: vec![] }, &mut History::default(), &cfg(), t);
        assert_eq!(d.rescale_to, None);
        assert!(reasons(&d).contains(&("ScalingActive", false, "ScalingDisabled")));
    }

    #[test]
    fn invalid_metrics_block_scale_down_but_not_scale_up() {
        let t = Timestamp::from_second(1_700_000_000).unwrap();
        let d = decide(
            &hpa(1, 10),
            Observed::Scale { current: 4, metrics: vec![bad()] },
            &mut History::default(),
            &cfg(),
            t,
        );
        assert_eq!(d.rescale_to, None);
        assert!(reasons(&d).contains(&("ScalingActive", false, "FailedGetResourceMetric")));
        assert!(d.events.iter().any(|e| e.1 == "FailedGetResourceMetric"));
        assert!(d.events.iter().any(|e| e.1 == "FailedComputeMetricsReplicas"
            && e.2 == "invalid metrics (1 invalid out of 1), first error is: failed to get cpu utilization: missing request for cpu"));
        let d = decide(
            &hpa(1, 10),
            Observed::Scale { current: 4, metrics: vec![bad(), ok(2)] },
            &mut History::default(),
            &cfg(),
            t,
        );
        assert_eq!(d.rescale_to, None, "a scale-down with an invalid metric is not done");
        let d = decide(
            &hpa(1, 10),
            Observed::Scale { current: 4, metrics: vec![bad(), ok(6)] },
            &mut History::default(),
            &cfg(),
            t,
        );
        assert_eq!(d.rescale_to, Some(6));
    }

    #[test]
    fn missing_target_and_selector() {
        let t = Timestamp::from_second(1_700_000_000).unwrap();
        let d = decide(
            &hpa(1, 10),
            Observed::NoScale("deployments.apps \"web\" not found".into()),
            &mut History::default(),
            &cfg(),
            t,
        );
        assert_eq!(reasons(&d), vec![("AbleToScale", false, "FailedGetScale")]);
        assert_eq!(d.events[0].1, "FailedGetScale");
        let d = decide(
            &hpa(1, 10),
            Observed::BadSelector {
                event: "SelectorRequired",
                message: "the HPA target's scale is missing a selector".into(),
            },
            &mut History::default(),
            &cfg(),
            t,
        );
        assert!(reasons(&d).contains(&("ScalingActive", false, "InvalidSelector")));
        assert_eq!(d.rescale_to, None);
    }

    #[test]
    fn conditions_keep_their_transition_time() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let first = merge_conditions(&[], &[cond("AbleToScale", true, "ReadyForNewScale", "x")], t0);
        let second = merge_conditions(&first, &[cond("AbleToScale", true, "SucceededRescale", "y")], t1);
        assert_eq!(second[0].last_transition_time, Some(Time(t0)));
        assert_eq!(second[0].reason.as_deref(), Some("SucceededRescale"));
        let third = merge_conditions(&second, &[cond("AbleToScale", false, "FailedGetScale", "z")], t1);
        assert_eq!(third[0].last_transition_time, Some(Time(t1)));
        assert_eq!(milli_quantity(250), Quantity("250m".into()));
        assert_eq!(milli_quantity(2000), Quantity("2".into()));
    }
}
