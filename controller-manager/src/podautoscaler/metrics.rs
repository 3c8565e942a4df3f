//! Where the HPA's numbers come from: per-pod samples from `metrics.k8s.io` (what
//! metrics-server and our apiserver serve), per-pod and per-object custom metrics from
//! `custom.metrics.k8s.io` (served where an adapter is installed), and the pods' requests.
//! The parsing is pure; [`Source`] is the I/O.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use super::replicas::{PodInfo, Sample};

/// `metrics.k8s.io/v1beta1` PodMetrics list → per-pod samples of `resource` in
/// milli-units, summed over the containers (only `container`, when given). A pod whose
/// containers lack the resource is left out, as upstream does.
pub fn resource_samples(list: &Value, resource: &str, container: Option<&str>) -> BTreeMap<String, Sample> {
    let mut out = BTreeMap::new();
    for item in list.get("items").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) else { continue };
        let timestamp = item
            .get("timestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .unwrap_or_else(Timestamp::now);
        let window =
            item.get("window").and_then(Value::as_str).and_then(go_duration).unwrap_or(SignedDuration::from_secs(15));
        let mut total = 0i64;
        let mut found = false;
        let mut missing = false;
        for c in item.get("containers").and_then(Value::as_array).into_iter().flatten() {
            if container.is_some_and(|want| c.get("name").and_then(Value::as_str) != Some(want)) {
                continue;
            }
            match c.pointer(&format!("/usage/{resource}")).and_then(Value::as_str) {
                Some(q) => {
                    total += apimachinery::quantity::milli_value(q);
                    found = true;
                }
                None => missing = true,
            }
        }
        if found && !missing {
            out.insert(name.to_string(), Sample { value: total, timestamp, window });
        }
    }
    out
}

/// `custom.metrics.k8s.io` MetricValueList → per-object values (by described object name).
pub fn custom_samples(list: &Value) -> BTreeMap<String, Sample> {
    let mut out = BTreeMap::new();
    for item in list.get("items").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = item.pointer("/describedObject/name").and_then(Value::as_str) else { continue };
        let Some(value) = item.get("value").and_then(Value::as_str) else { continue };
        let timestamp = item
            .get("timestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .unwrap_or_else(Timestamp::now);
        let window = SignedDuration::from_secs(item.get("windowSeconds").and_then(Value::as_i64).unwrap_or(60));
        out.insert(name.to_string(), Sample { value: apimachinery::quantity::milli_value(value), timestamp, window });
    }
    out
}

/// What the replica calculator needs of a pod; `resource` (and `container`) choose the
/// request that is summed (`calculatePodRequests`).
pub fn pod_info(pod: &Pod, resource: &str, container: Option<&str>) -> PodInfo {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status == "True", c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH)));
    let mut request = Ok(0i64);
    if let Some(spec) = &pod.spec {
        for c in &spec.containers {
            if container.is_some_and(|want| c.name != want) {
                continue;
            }
            let q = c.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get(resource));
            match (q, &mut request) {
                (Some(q), Ok(sum)) => *sum += apimachinery::quantity::milli_value(&q.0),
                (None, Ok(_)) => {
                    request = Err(format!("missing request for {resource} in container {} of Pod {name}", c.name));
                }
                _ => {}
            }
        }
        if let (Some(want), Ok(0)) = (container, &request) {
            if !spec.containers.iter().any(|c| c.name == want) {
                request = Err(format!("container {want} not present in Pod {name}"));
            }
        }
    }
    PodInfo {
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into()),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        ready,
        start_time: status.and_then(|s| s.start_time.as_ref()).map(|t| t.0),
        request,
        name,
    }
}

/// How long one namespace's PodMetrics list is reused: the kubelets refresh their samples
/// every 10 s, so a pass over many HPAs in one namespace asks the metrics API once.
const RESOURCE_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(5);

type Samples = std::sync::Arc<BTreeMap<String, Sample>>;
type SampleCache = HashMap<(String, String, String), (std::time::Instant, Samples)>;

/// The metric APIs, read through the apiserver.
#[derive(Clone)]
pub struct Source {
    pub client: kube::Client,
    /// The samples of every pod of a namespace for one resource (and container), as parsed
    /// from the last PodMetrics list, and when that was read.
    resource_samples: std::sync::Arc<tokio::sync::Mutex<SampleCache>>,
}

impl Source {
    pub fn new(client: kube::Client) -> Self {
        Source { client, resource_samples: Default::default() }
    }

    /// Every pod's sample of `resource` in `namespace`, at most [`RESOURCE_CACHE_TTL`] old.
    /// Concurrent callers wait for one read and parse instead of each making their own.
    async fn namespace_samples(
        &self,
        namespace: &str,
        resource: &str,
        container: Option<&str>,
    ) -> Result<Samples, String> {
        let key = (namespace.to_string(), resource.to_string(), container.unwrap_or_default().to_string());
        let mut cache = self.resource_samples.lock().await;
        if let Some((at, samples)) = cache.get(&key) {
            if at.elapsed() < RESOURCE_CACHE_TTL {
                return Ok(samples.clone());
            }
        }
        let list = self.get(&format!("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods")).await?;
        let samples = std::sync::Arc::new(resource_samples(&list, resource, container));
        cache.retain(|_, (at, _)| at.elapsed() < RESOURCE_CACHE_TTL);
        cache.insert(key, (std::time::Instant::now(), samples.clone()));
        Ok(samples)
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        let req = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
        self.client.request::<Value>(req).await.map_err(|e| match e {
            kube::Error::Api(s) => s.message.clone(),
            e => e.to_string(),
        })
    }

    /// `GetResourceMetric`: per-pod usage of `resource` from `metrics.k8s.io`, for the pods
    /// named in `pods` (looked up in the namespace's samples, see [`Source::namespace_samples`]).
    pub async fn resource(
        &self,
        namespace: &str,
        pods: &[String],
        resource: &str,
        container: Option<&str>,
    ) -> Result<BTreeMap<String, Sample>, String> {
        let all = self.namespace_samples(namespace, resource, container).await.map_err(|e| {
            format!(
                "unable to get metrics for resource {resource}: unable to fetch metrics from resource metrics API: {e}"
            )
        })?;
        let samples: BTreeMap<String, Sample> =
            pods.iter().filter_map(|p| all.get(p).map(|s| (p.clone(), *s))).collect();
        if samples.is_empty() {
            return Err(format!(
                "unable to get metrics for resource {resource}: no metrics returned from resource metrics API"
            ));
        }
        Ok(samples)
    }

    /// `GetRawMetric`: a per-pod custom metric.
    pub async fn pods(
        &self,
        namespace: &str,
        selector: &str,
        metric: &str,
    ) -> Result<BTreeMap<String, Sample>, String> {
        let path = format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/{}?labelSelector={}",
            encode(metric),
            encode(selector)
        );
        let list =
            self.get(&path).await.map_err(|e| format!("unable to fetch metrics from custom metrics API: {e}"))?;
        let samples = custom_samples(&list);
        if samples.is_empty() {
            return Err("no metrics returned from custom metrics API".into());
        }
        Ok(samples)
    }

    /// `GetObjectMetric`: one object's custom metric.
    pub async fn object(&self, namespace: &str, plural_group: &str, name: &str, metric: &str) -> Result<i64, String> {
        let path = format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/{plural_group}/{}/{}",
            encode(name),
            encode(metric)
        );
        let list =
            self.get(&path).await.map_err(|e| format!("unable to fetch metrics from custom metrics API: {e}"))?;
        custom_samples(&list)
            .into_values()
            .next()
            .map(|s| s.value)
            .ok_or_else(|| "no metrics returned from custom metrics API".into())
    }
}

/// A Go duration as `metav1.Duration` writes it (`15s`, `1.003s`, `1m30s`, `500ms`).
fn go_duration(s: &str) -> Option<SignedDuration> {
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let value: f64 = rest[..n].parse().ok()?;
        let unit_len = rest[n..].find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len() - n);
        let scale = match &rest[n..n + unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[n + unit_len..];
    }
    SignedDuration::try_from_secs_f64(total).ok()
}

/// Percent-encode a query value or path segment.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_metrics_are_summed_per_pod_in_milli_units() {
        let list = json!({"items": [
            {"metadata": {"name": "a"}, "timestamp": "2026-01-01T00:00:00Z", "window": "15s",
             "containers": [{"name": "app", "usage": {"cpu": "250m", "memory": "10Mi"}},
                            {"name": "side", "usage": {"cpu": "50m", "memory": "1Mi"}}]},
            {"metadata": {"name": "b"}, "containers": [{"name": "app", "usage": {"memory": "1Mi"}}]},
        ]});
        let s = resource_samples(&list, "cpu", None);
        assert_eq!(s["a"].value, 300);
        assert_eq!(s["a"].window, SignedDuration::from_secs(15));
        assert!(!s.contains_key("b"), "a pod without the resource is left out");
        assert_eq!(resource_samples(&list, "cpu", Some("side"))["a"].value, 50);
        assert_eq!(resource_samples(&list, "memory", None)["b"].value, 1024 * 1024 * 1000);
    }

    #[test]
    fn requests_are_summed_and_missing_ones_named() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-1"},
            "spec": {"containers": [
                {"name": "app", "image": "x", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "side", "image": "x", "resources": {"requests": {"cpu": "50m", "memory": "1Gi"}}},
            ]},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}]},
        }))
        .unwrap();
        let p = pod_info(&pod, "cpu", None);
        assert_eq!(p.request, Ok(150));
        assert_eq!(p.ready.map(|r| r.0), Some(true));
        assert_eq!(pod_info(&pod, "cpu", Some("side")).request, Ok(50));
        assert_eq!(
            pod_info(&pod, "memory", None).request,
            Err("missing request for memory in container app of Pod web-1".into())
        );
        assert!(pod_info(&pod, "cpu", Some("nope")).request.is_err());
    }

    #[test]
    fn custom_metric_values() {
        let list = json!({"items": [{"describedObject": {"kind": "Pod", "name": "a"}, "metricName": "qps",
                                     "timestamp": "2026-01-01T00:00:00Z", "value": "1500m"}]});
        assert_eq!(custom_samples(&list)["a"].value, 1500);
        assert_eq!(go_duration("1m30s"), Some(SignedDuration::from_secs(90)));
        assert_eq!(go_duration("1.5s"), Some(SignedDuration::from_millis(1500)));
        assert_eq!(go_duration("x"), None);
        assert_eq!(encode("app=web,tier in (a)"), "app%3Dweb%2Ctier%20in%20%28a%29");
    }
}
