//! The replica calculator (`pkg/controller/podautoscaler/replica_calculator.go`): from the
//! pods a target selects and one metric's samples, the replica count that metric asks
//! for. Pure: pods, samples and the clock come in as values.
//!
//! Every value is in milli-units (`resource.Quantity.MilliValue()`), as upstream
//! computes: CPU in millicores, memory in milli-bytes, custom metrics in milli-units.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The controller's tunables (kube-controller-manager's flags of the same meaning).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `--horizontal-pod-autoscaler-tolerance` (0.1): a usage ratio this close to 1 is "at target".
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-cpu-initialization-period` (5 min).
    pub cpu_initialization_period: SignedDuration,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay` (30 s).
    pub initial_readiness_delay: SignedDuration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tolerance: 0.1,
            cpu_initialization_period: SignedDuration::from_secs(300),
            initial_readiness_delay: SignedDuration::from_secs(30),
        }
    }
}

/// What the calculator needs to know of one pod.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub name: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub phase: String,
    pub deleting: bool,
    /// The Ready condition: (status is True, lastTransitionTime).
    pub ready: Option<(bool, Timestamp)>,
    pub start_time: Option<Timestamp>,
    /// The sum of the pod's (or the one named container's) requests for the metric's
    /// resource, or why there is none (`missing request for cpu in container app of Pod web-1`).
    pub request: Result<i64, String>,
}

/// One pod's sample of a metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub value: i64,
    pub timestamp: Timestamp,
    pub window: SignedDuration,
}

/// A metric's proposal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Proposal {
    pub replicas: i32,
    /// The current utilization in percent of requests (`Utilization` targets only).
    pub utilization: Option<i32>,
    /// The current average value per pod, in milli-units.
    pub average: i64,
}

/// Which rules `groupPods` applies: CPU has the initialization period, the rest do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Cpu,
    Other,
}

struct Groups {
    ready: usize,
    unready: BTreeSet<String>,
    missing: BTreeSet<String>,
    ignored: BTreeSet<String>,
}

/// `groupPods`: failed and deleted pods are ignored, pending ones unready, pods without a
/// sample missing; for CPU, a pod that is not Ready (or still in its initialization
/// period with a sample taken before it became Ready) is unready too.
fn group(
    pods: &[PodInfo],
    metrics: &BTreeMap<String, Sample>,
    resource: Resource,
    now: Timestamp,
    s: &Settings,
) -> Groups {
    let mut g = Groups { ready: 0, unready: BTreeSet::new(), missing: BTreeSet::new(), ignored: BTreeSet::new() };
    for pod in pods {
        if pod.deleting || pod.phase == "Failed" {
            g.ignored.insert(pod.name.clone());
            continue;
        }
        if pod.phase == "Pending" {
            g.unready.insert(pod.name.clone());
            continue;
        }
        let Some(sample) = metrics.get(&pod.name) else {
            g.missing.insert(pod.name.clone());
            continue;
        };
        if resource == Resource::Cpu {
            let unready = match (pod.ready, pod.start_time) {
                (Some((ready, transition)), Some(start)) => {
                    if start + s.cpu_initialization_period > now {
                        // Still initializing: count only samples taken wholly after it became Ready.
                        !ready || sample.timestamp < transition + sample.window
                    } else {
                        // Never became ready within the readiness delay after starting.
                        !ready && start + s.initial_readiness_delay > transition
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.insert(pod.name.clone());
                continue;
            }
        }
        g.ready += 1;
    }
    g
}

/// `GetResourceUtilizationRatio`: (usage ratio, utilization %, average value), over the
/// pods that have both a sample and a request.
fn utilization_ratio(
    metrics: &BTreeMap<String, Sample>,
    requests: &BTreeMap<String, i64>,
    target: i32,
) -> Result<(f64, i32, i64), String> {
    let (mut total, mut requested, mut n) = (0i64, 0i64, 0i64);
    for (pod, sample) in metrics {
        if let Some(r) = requests.get(pod) {
            total += sample.value;
            requested += r;
            n += 1;
        }
    }
    if requested == 0 || n == 0 {
        return Err("no metrics returned matched known pods".into());
    }
    let utilization = (total * 100 / requested) as i32;
    Ok((utilization as f64 / target as f64, utilization, total / n))
}

/// `GetMetricUsageRatio`: (usage ratio, average value).
fn average_ratio(metrics: &BTreeMap<String, Sample>, target: i64) -> (f64, i64) {
    let total: i64 = metrics.values().map(|s| s.value).sum();
    let avg = if metrics.is_empty() { 0 } else { total / metrics.len() as i64 };
    (avg as f64 / target as f64, avg)
}

/// `GetResourceReplicas`: a `Utilization` target (percent of the pods' requests).
pub fn utilization_replicas(
    current: i32,
    target_utilization: i32,
    resource: Resource,
    pods: &[PodInfo],
    samples: &BTreeMap<String, Sample>,
    now: Timestamp,
    s: &Settings,
) -> Result<Proposal, String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    // Requests are checked first: a pod without one is the error a user must fix.
    let mut requests = BTreeMap::new();
    for p in pods {
        requests.insert(p.name.clone(), p.request.clone()?);
    }
    // Scale-down: a missing pod is assumed to use its whole request (or the target, if
    // higher); scale-up: nothing.
    let fallback = 100.max(target_utilization as i64);
    calculate(
        current,
        resource,
        pods,
        samples,
        now,
        s,
        |m| utilization_ratio(m, &requests, target_utilization).map(|(r, u, a)| (r, Some(u), a)),
        |name| requests.get(name).copied().unwrap_or(0) * fallback / 100,
    )
}

/// `calcPlainMetricReplicas`: an `AverageValue` target per pod (resource metrics with an
/// average value target, and `Pods` metrics).
pub fn average_value_replicas(
    current: i32,
    target_average: i64,
    resource: Resource,
    pods: &[PodInfo],
    samples: &BTreeMap<String, Sample>,
    now: Timestamp,
    s: &Settings,
) -> Result<Proposal, String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    if target_average <= 0 {
        return Err("the target average value must be positive".into());
    }
    // Scale-down: a missing pod is assumed to be at the target; scale-up: at nothing.
    calculate(
        current,
        resource,
        pods,
        samples,
        now,
        s,
        |m| {
            let (ratio, average) = average_ratio(m, target_average);
            Ok((ratio, None, average))
        },
        |_| target_average,
    )
}

/// The calculation both kinds of target share: group the pods, compute the ratio over the
/// ready ones; if pods are missing or unready, fill them in (missing ones with
/// `scale_down_fill` on a scale-down, 0 on a scale-up; unready ones with 0 on a scale-up)
/// and recompute, keeping the count when that flips the direction.
#[allow(clippy::too_many_arguments)]
fn calculate(
    current: i32,
    resource: Resource,
    pods: &[PodInfo],
    samples: &BTreeMap<String, Sample>,
    now: Timestamp,
    s: &Settings,
    ratio_of: impl Fn(&BTreeMap<String, Sample>) -> Result<(f64, Option<i32>, i64), String>,
    scale_down_fill: impl Fn(&str) -> i64,
) -> Result<Proposal, String> {
    let mut metrics = samples.clone();
    // Only the samples of the selected pods count.
    metrics.retain(|name, _| pods.iter().any(|p| &p.name == name));
    let g = group(pods, &metrics, resource, now, s);
    metrics.retain(|name, _| !g.ignored.contains(name) && !g.unready.contains(name));
    if metrics.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let (ratio, utilization, average) = ratio_of(&metrics)?;
    let proposal = |replicas| Proposal { replicas, utilization, average };
    let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && g.missing.is_empty() {
        if (1.0 - ratio).abs() <= s.tolerance {
            return Ok(proposal(current));
        }
        return Ok(proposal((ratio * g.ready as f64).ceil() as i32));
    }
    let filled = |value| Sample { value, timestamp: now, window: SignedDuration::ZERO };
    for name in &g.missing {
        metrics.insert(name.clone(), filled(if ratio < 1.0 { scale_down_fill(name) } else { 0 }));
    }
    if scale_up_with_unready {
        for name in &g.unready {
            metrics.insert(name.clone(), filled(0));
        }
    }
    let (new_ratio, _, _) = ratio_of(&metrics)?;
    Ok(proposal(rebalanced(current, ratio, new_ratio, metrics.len(), s)))
}

/// The end of the calculation once missing and unready pods were filled in: no change
/// when the new ratio is within tolerance or flips direction, or when the count would
/// move against it.
fn rebalanced(current: i32, ratio: f64, new_ratio: f64, count: usize, s: &Settings) -> i32 {
    if (1.0 - new_ratio).abs() <= s.tolerance || (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0) {
        return current;
    }
    let replicas = (new_ratio * count as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return current;
    }
    replicas
}

/// `GetObjectMetricReplicas`: one object's value against a `Value` target, scaled by the
/// number of ready pods.
pub fn object_value_replicas(current: i32, usage: i64, target: i64, ready_pods: i32, s: &Settings) -> Proposal {
    let ratio = usage as f64 / target as f64;
    let replicas = if (1.0 - ratio).abs() <= s.tolerance { current } else { (ratio * ready_pods as f64).ceil() as i32 };
    Proposal { replicas, utilization: None, average: usage }
}

/// `GetObjectPerPodMetricReplicas` (and external metrics): a total against an
/// `AverageValue` target per pod.
pub fn total_average_replicas(current: i32, usage: i64, target_average: i64, s: &Settings) -> Proposal {
    let ratio = usage as f64 / (target_average as f64 * current.max(1) as f64);
    let replicas =
        if (1.0 - ratio).abs() <= s.tolerance { current } else { (usage as f64 / target_average as f64).ceil() as i32 };
    Proposal { replicas, utilization: None, average: usage / current.max(1) as i64 }
}

/// The number of pods counted as ready for object metrics (`getReadyPodsCount`): Running
/// with Ready true.
pub fn ready_pods(pods: &[PodInfo]) -> i32 {
    pods.iter().filter(|p| p.phase == "Running" && matches!(p.ready, Some((true, _)))).count() as i32
}

#[cfg(test)]
mod tests {
    //! Cases from upstream's replica calculator tests, restated as inputs and expected counts.
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }
    const NOW: i64 = 3600;

    /// A Running, Ready pod started long ago, with `request` millicores requested.
    fn pod(name: &str, request: i64) -> PodInfo {
        PodInfo {
            name: name.into(),
            phase: "Running".into(),
            deleting: false,
            ready: Some((true, t(10))),
            start_time: Some(t(0)),
            request: Ok(request),
        }
    }

    /// A pod started a minute ago that is not Ready yet.
    fn unready(name: &str) -> PodInfo {
        PodInfo { ready: Some((false, t(NOW - 10))), start_time: Some(t(NOW - 60)), ..pod(name, 1000) }
    }

    fn samples(values: &[(&str, i64)]) -> BTreeMap<String, Sample> {
        values
            .iter()
            .map(|(n, v)| {
                (n.to_string(), Sample { value: *v, timestamp: t(NOW - 30), window: SignedDuration::from_secs(60) })
            })
            .collect()
    }

    fn cpu(current: i32, target: i32, pods: &[PodInfo], s: &[(&str, i64)]) -> Result<Proposal, String> {
        utilization_replicas(current, target, Resource::Cpu, pods, &samples(s), t(NOW), &Settings::default())
    }

    #[test]
    fn scale_up_and_down_by_utilization() {
        let pods = [pod("a", 1000), pod("b", 1000), pod("c", 1000)];
        // 300+500+700 of 3000 requested = 50%, target 30% → ceil(3 * 50/30) = 5.
        let p = cpu(3, 30, &pods, &[("a", 300), ("b", 500), ("c", 700)]).unwrap();
        assert_eq!((p.replicas, p.utilization, p.average), (5, Some(50), 500));
        // 100+100+100 of 3000 = 10%, target 50% → ceil(3 * 0.2) = 1.
        assert_eq!(cpu(3, 50, &pods, &[("a", 100), ("b", 100), ("c", 100)]).unwrap().replicas, 1);
    }

    #[test]
    fn within_tolerance_keeps_the_count() {
        let pods = [pod("a", 1000), pod("b", 1000), pod("c", 1000)];
        // 52% against 50%: ratio 1.04.
        assert_eq!(cpu(3, 50, &pods, &[("a", 520), ("b", 520), ("c", 520)]).unwrap().replicas, 3);
        // 44% against 50%: 0.88 is outside the 10% tolerance.
        assert_eq!(cpu(3, 50, &pods, &[("a", 440), ("b", 440), ("c", 440)]).unwrap().replicas, 3);
        assert_eq!(cpu(4, 50, &pods, &[("a", 400), ("b", 400), ("c", 400)]).unwrap().replicas, 3);
    }

    #[test]
    fn unready_pods_count_as_zero_on_scale_up() {
        // Upstream's "ScaleUpUnreadyLessScale": one pod is not ready.
        let pods = [pod("a", 1000), pod("b", 1000), unready("c")];
        // Ready pods at 100% and 90% against 30% (ratio 3.17, up); the unready pod counted
        // as 0: 1900*100/3000 = 63% (truncated) → 63/30 * 3 pods = 6.3 → 7.
        let p = cpu(3, 30, &pods, &[("a", 1000), ("b", 900), ("c", 800)]).unwrap();
        assert_eq!(p.replicas, 7);
        // Ready pods at 40% and 35% against 30% → ratio 1.25 over 2 ready pods; with the
        // unready one as 0: 750/3000=25% → ratio 0.83 < 1 flips direction → keep 3.
        assert_eq!(cpu(3, 30, &pods, &[("a", 400), ("b", 350), ("c", 800)]).unwrap().replicas, 3);
    }

    #[test]
    fn unready_pods_are_left_out_on_scale_down() {
        let pods = [pod("a", 1000), pod("b", 1000), unready("c")];
        // Ready pods at 10% against 50% → ceil(2 * 0.2) = 1; the unready pod's high usage is ignored.
        assert_eq!(cpu(3, 50, &pods, &[("a", 100), ("b", 100), ("c", 1000)]).unwrap().replicas, 1);
    }

    #[test]
    fn missing_metrics_are_assumed_full_on_scale_down_and_zero_on_scale_up() {
        let pods = [pod("a", 1000), pod("b", 1000), pod("c", 1000), pod("d", 1000)];
        // Upstream's "ScaleDownMissingMetrics": 3 pods at 10%, target 50%, d missing →
        // d counted at 100%: (300+1000)/4000 = 32% → ratio 0.65 → ceil(4*0.65)=3.
        assert_eq!(cpu(4, 50, &pods, &[("a", 100), ("b", 100), ("c", 100)]).unwrap().replicas, 3);
        // Scale-up with one missing: 3 at 90% against 50%, d as 0: 2700/4000 = 67% → ceil(4*1.34)=6.
        assert_eq!(cpu(4, 50, &pods, &[("a", 900), ("b", 900), ("c", 900)]).unwrap().replicas, 6);
        // Missing pod flips the direction: 3 at 56% against 50% (ratio 1.12 → up), with d
        // at 0: 1680/4000 = 42% → below 1: keep the count.
        assert_eq!(cpu(4, 50, &pods, &[("a", 560), ("b", 560), ("c", 560)]).unwrap().replicas, 4);
    }

    #[test]
    fn failed_deleted_and_pending_pods() {
        let mut failed = pod("f", 1000);
        failed.phase = "Failed".into();
        let mut deleting = pod("d", 1000);
        deleting.deleting = true;
        let mut pending = pod("p", 1000);
        pending.phase = "Pending".into();
        let pods = [pod("a", 1000), pod("b", 1000), failed, deleting];
        // Ignored pods do not count at all: 2 pods at 100% against 50% → 4.
        assert_eq!(cpu(2, 50, &pods, &[("a", 1000), ("b", 1000), ("f", 5000), ("d", 5000)]).unwrap().replicas, 4);
        // A pending pod counts as 0 on scale-up: (2000+0)/3000 = 66% → ratio 1.33 → ceil(3*1.33)=4.
        let pods = [pod("a", 1000), pod("b", 1000), pending];
        assert_eq!(cpu(3, 50, &pods, &[("a", 1000), ("b", 1000)]).unwrap().replicas, 4);
    }

    #[test]
    fn cpu_initialization_period() {
        // Started 60 s ago (inside the 5 min period), Ready since 50 s ago; a sample whose
        // window began before it became Ready is not trusted.
        let mut young = pod("y", 1000);
        young.start_time = Some(t(NOW - 60));
        young.ready = Some((true, t(NOW - 50)));
        let pods = [pod("a", 1000), young.clone()];
        // The sample of y (taken at NOW-30 over 60 s) started before Ready → unready → on
        // scale-up counted as 0: (1000+0)/2000 = 50% against 50% → keep 2.
        assert_eq!(cpu(2, 50, &pods, &[("a", 1000), ("y", 1000)]).unwrap().replicas, 2);
        // Ready long enough before the sample's window: counted.
        young.ready = Some((true, t(NOW - 200)));
        young.start_time = Some(t(NOW - 250));
        let pods = [pod("a", 1000), young];
        assert_eq!(cpu(2, 50, &pods, &[("a", 1000), ("y", 1000)]).unwrap().replicas, 4);
        // Past the period, a pod that became unready later (not within the readiness delay
        // after start) is still counted as ready for CPU.
        let mut flapped = pod("z", 1000);
        flapped.ready = Some((false, t(NOW - 100)));
        let pods = [pod("a", 1000), flapped];
        assert_eq!(cpu(2, 50, &pods, &[("a", 1000), ("z", 1000)]).unwrap().replicas, 4);
    }

    #[test]
    fn memory_ignores_readiness() {
        let mut unready = pod("c", 1000);
        unready.ready = Some((false, t(NOW - 10)));
        let pods = [pod("a", 1000), unready];
        let p = utilization_replicas(
            2,
            50,
            Resource::Other,
            &pods,
            &samples(&[("a", 1000), ("c", 1000)]),
            t(NOW),
            &Settings::default(),
        )
        .unwrap();
        assert_eq!(p.replicas, 4);
    }

    #[test]
    fn errors() {
        assert_eq!(cpu(1, 50, &[], &[]).unwrap_err(), "no pods returned by selector while calculating replica count");
        let pods = [pod("a", 1000)];
        assert_eq!(
            cpu(1, 50, &pods, &[]).unwrap_err(),
            "did not receive metrics for targeted pods (pods might be unready)"
        );
        let mut no_request = pod("a", 0);
        no_request.request = Err("missing request for cpu in container app of Pod a".into());
        assert_eq!(
            cpu(1, 50, &[no_request.clone()], &[("a", 10)]).unwrap_err(),
            "missing request for cpu in container app of Pod a"
        );
        // Even when the pod has no usable sample yet.
        assert_eq!(cpu(1, 50, &[no_request], &[]).unwrap_err(), "missing request for cpu in container app of Pod a");
    }

    #[test]
    fn average_values() {
        let pods = [pod("a", 0), pod("b", 0)];
        let s = Settings::default();
        // 20 and 40 (avg 30) against 10 → ceil(2*3) = 6.
        let p = average_value_replicas(
            2,
            10_000,
            Resource::Other,
            &pods,
            &samples(&[("a", 20_000), ("b", 40_000)]),
            t(NOW),
            &s,
        )
        .unwrap();
        assert_eq!((p.replicas, p.average), (6, 30_000));
        // Missing pod on scale-down is assumed at the target: (5+10)/2 = 7.5 → 0.75 → 2*0.75 → 2.
        let p =
            average_value_replicas(2, 10_000, Resource::Other, &pods, &samples(&[("a", 5_000)]), t(NOW), &s).unwrap();
        assert_eq!(p.replicas, 2);
        assert_eq!(object_value_replicas(3, 20_000, 10_000, 3, &s).replicas, 6);
        assert_eq!(object_value_replicas(3, 10_500, 10_000, 3, &s).replicas, 3);
        assert_eq!(total_average_replicas(2, 50_000, 10_000, &s).replicas, 5);
        assert_eq!(total_average_replicas(5, 51_000, 10_000, &s).replicas, 5);
    }
}
