//! HorizontalPodAutoscalers (autoscaling/v2): `kube_horizontalpodautoscaler_*`, each series
//! labelled `namespace`, `horizontalpodautoscaler` first.

use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscaler, MetricSpec, MetricStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::render::{self, alpha, gauge, Family, Gen, Series};
use crate::resource::milli_float;

/// The autoscalers' families, in the upstream exporter's order.
pub fn families(hpas: &[&HorizontalPodAutoscaler]) -> Vec<Family> {
    render::families(hpas, &generators(), |h| {
        vec![
            ("namespace", render::namespace_of(&h.metadata)),
            ("horizontalpodautoscaler", render::name_of(&h.metadata)),
        ]
    })
}

fn generators() -> Vec<Gen<HorizontalPodAutoscaler>> {
    vec![
        alpha("kube_horizontalpodautoscaler_info", "Information about this autoscaler.", info),
        gauge(
            "kube_horizontalpodautoscaler_metadata_generation",
            "The generation observed by the HorizontalPodAutoscaler controller.",
            |h| render::one(h.metadata.generation.unwrap_or(0) as f64),
        ),
        gauge(
            "kube_horizontalpodautoscaler_spec_max_replicas",
            "Upper limit for the number of pods that can be set by the autoscaler; cannot be smaller than MinReplicas.",
            |h| render::one(h.spec.max_replicas),
        ),
        gauge(
            "kube_horizontalpodautoscaler_spec_min_replicas",
            "Lower limit for the number of pods that can be set by the autoscaler, default 1.",
            |h| render::one(h.spec.min_replicas.unwrap_or(1)),
        ),
        alpha(
            "kube_horizontalpodautoscaler_spec_target_metric",
            "The metric specifications used by this autoscaler when calculating the desired replica count.",
            |h| h.spec.metrics.as_deref().unwrap_or_default().iter().flat_map(spec_metric).collect(),
        ),
        alpha(
            "kube_horizontalpodautoscaler_spec_behavior_scale_down_tolerance",
            "The tolerance on the ratio between the current and desired metric value below which no scale down occurs.",
            |h| tolerance(h, false),
        ),
        alpha(
            "kube_horizontalpodautoscaler_spec_behavior_scale_up_tolerance",
            "The tolerance on the ratio between the current and desired metric value below which no scale up occurs.",
            |h| tolerance(h, true),
        ),
        gauge(
            "kube_horizontalpodautoscaler_status_target_metric",
            "The current metric status used by this autoscaler when calculating the desired replica count.",
            |h| {
                let current = h.status.as_ref().and_then(|s| s.current_metrics.as_deref()).unwrap_or_default();
                current.iter().flat_map(status_metric).collect()
            },
        ),
        gauge(
            "kube_horizontalpodautoscaler_status_current_replicas",
            "Current number of replicas of pods managed by this autoscaler.",
            |h| render::one(h.status.as_ref().and_then(|s| s.current_replicas).unwrap_or(0)),
        ),
        gauge(
            "kube_horizontalpodautoscaler_status_desired_replicas",
            "Desired number of replicas of pods managed by this autoscaler.",
            |h| render::one(h.status.as_ref().map(|s| s.desired_replicas).unwrap_or(0)),
        ),
        gauge("kube_horizontalpodautoscaler_status_condition", "The condition of this autoscaler.", |h| {
            let conditions = h.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
            conditions
                .iter()
                .flat_map(|c| render::condition_series(&[("condition", &c.type_)], "status", &c.status))
                .collect()
        }),
        alpha("kube_horizontalpodautoscaler_created", "Unix creation timestamp", |h| {
            render::timestamp(h.metadata.creation_timestamp.as_ref())
        }),
        alpha("kube_horizontalpodautoscaler_deletion_timestamp", "Unix deletion timestamp", |h| {
            render::timestamp(h.metadata.deletion_timestamp.as_ref())
        }),
    ]
}

fn info(h: &HorizontalPodAutoscaler) -> Vec<Series> {
    let target = &h.spec.scale_target_ref;
    let mut labels: Vec<(&'static str, &str)> = Vec::new();
    if let Some(v) = target.api_version.as_deref().filter(|v| !v.is_empty()) {
        labels.push(("scaletargetref_api_version", v));
    }
    labels.push(("scaletargetref_kind", &target.kind));
    labels.push(("scaletargetref_name", &target.name));
    vec![Series::with(&labels, 1.0)]
}

fn tolerance(h: &HorizontalPodAutoscaler, up: bool) -> Vec<Series> {
    let behavior = h.spec.behavior.as_ref();
    let rules = behavior.and_then(|b| if up { b.scale_up.as_ref() } else { b.scale_down.as_ref() });
    let t = rules.and_then(|r| r.tolerance.as_ref()).and_then(|q| apimachinery::quantity::parse(&q.0));
    render::optional(t)
}

/// A metric's series: `value`, `utilization`, `average`, whichever are set, labelled
/// `metric_name`, `metric_target_type`, `container`.
fn target_series(
    name: &str,
    container: &str,
    value: Option<&Quantity>,
    utilization: Option<i32>,
    average: Option<&Quantity>,
) -> Vec<Series> {
    let mut out = Vec::new();
    let mut push = |kind: &str, v: f64| {
        out.push(Series::with(&[("metric_name", name), ("metric_target_type", kind), ("container", container)], v))
    };
    if let Some(v) = value {
        push("value", milli_float(v));
    }
    if let Some(u) = utilization {
        push("utilization", f64::from(u));
    }
    if let Some(a) = average {
        push("average", milli_float(a));
    }
    out
}

fn spec_metric(m: &MetricSpec) -> Vec<Series> {
    let (name, container, target) = match m.type_.as_str() {
        "Object" => match &m.object {
            Some(o) => (o.metric.name.as_str(), "", &o.target),
            None => return Vec::new(),
        },
        "Pods" => match &m.pods {
            Some(p) => (p.metric.name.as_str(), "", &p.target),
            None => return Vec::new(),
        },
        "Resource" => match &m.resource {
            Some(r) => (r.name.as_str(), "", &r.target),
            None => return Vec::new(),
        },
        "ContainerResource" => match &m.container_resource {
            Some(c) => (c.name.as_str(), c.container.as_str(), &c.target),
            None => return Vec::new(),
        },
        "External" => match &m.external {
            Some(e) => (e.metric.name.as_str(), "", &e.target),
            None => return Vec::new(),
        },
        _ => return Vec::new(),
    };
    target_series(name, container, target.value.as_ref(), target.average_utilization, target.average_value.as_ref())
}

fn status_metric(m: &MetricStatus) -> Vec<Series> {
    let (name, container, current) = match m.type_.as_str() {
        "Object" => match &m.object {
            Some(o) => (o.metric.name.as_str(), "", &o.current),
            None => return Vec::new(),
        },
        "Pods" => match &m.pods {
            Some(p) => (p.metric.name.as_str(), "", &p.current),
            None => return Vec::new(),
        },
        "Resource" => match &m.resource {
            Some(r) => (r.name.as_str(), "", &r.current),
            None => return Vec::new(),
        },
        "ContainerResource" => match &m.container_resource {
            Some(c) => (c.name.as_str(), c.container.as_str(), &c.current),
            None => return Vec::new(),
        },
        "External" => match &m.external {
            Some(e) => (e.metric.name.as_str(), "", &e.current),
            None => return Vec::new(),
        },
        _ => return Vec::new(),
    };
    target_series(name, container, current.value.as_ref(), current.average_utilization, current.average_value.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn replicas_targets_and_conditions() {
        let h: HorizontalPodAutoscaler = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 2},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 2, "maxReplicas": 10,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
            },
            "status": {
                "currentReplicas": 3, "desiredReplicas": 4,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 95, "averageValue": "450m"}}}],
                "conditions": [{"type": "AbleToScale", "status": "True"}]
            }
        }))
        .unwrap();
        let text = render_text(&families(&[&h]));
        let got = lines(&text);
        let l = r#"namespace="default",horizontalpodautoscaler="web""#;
        for w in [
            format!("kube_horizontalpodautoscaler_info{{{l},scaletargetref_api_version=\"apps/v1\",scaletargetref_kind=\"Deployment\",scaletargetref_name=\"web\"}} 1"),
            format!("kube_horizontalpodautoscaler_spec_min_replicas{{{l}}} 2"),
            format!("kube_horizontalpodautoscaler_spec_max_replicas{{{l}}} 10"),
            format!("kube_horizontalpodautoscaler_status_current_replicas{{{l}}} 3"),
            format!("kube_horizontalpodautoscaler_status_desired_replicas{{{l}}} 4"),
            format!("kube_horizontalpodautoscaler_metadata_generation{{{l}}} 2"),
            format!("kube_horizontalpodautoscaler_spec_target_metric{{{l},metric_name=\"cpu\",metric_target_type=\"utilization\",container=\"\"}} 80"),
            format!("kube_horizontalpodautoscaler_status_target_metric{{{l},metric_name=\"cpu\",metric_target_type=\"utilization\",container=\"\"}} 95"),
            format!("kube_horizontalpodautoscaler_status_target_metric{{{l},metric_name=\"cpu\",metric_target_type=\"average\",container=\"\"}} 0.45"),
            format!("kube_horizontalpodautoscaler_status_condition{{{l},condition=\"AbleToScale\",status=\"true\"}} 1"),
        ] {
            assert!(got.contains(&w.as_str()), "missing {w}\n{text}");
        }
    }

    #[test]
    fn default_min_replicas() {
        let h: HorizontalPodAutoscaler = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "b"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 3}
        }))
        .unwrap();
        let text = render_text(&families(&[&h]));
        assert!(text.contains(
            "kube_horizontalpodautoscaler_spec_min_replicas{namespace=\"b\",horizontalpodautoscaler=\"a\"} 1\n"
        ));
        assert!(text.contains(
            "horizontalpodautoscaler=\"a\",scaletargetref_kind=\"Deployment\",scaletargetref_name=\"x\"} 1\n"
        ));
    }
}
