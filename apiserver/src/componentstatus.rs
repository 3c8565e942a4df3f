//! `v1` ComponentStatus (`kubectl get componentstatuses`, `cs`): the health of the control
//! plane's parts as this apiserver sees them, computed on request as kube-apiserver does —
//! the scheduler's and the controller-manager's `/healthz` on this machine (their default
//! ports, 10259 and 10257; ours serve them over plain HTTP) and the storage (`etcd-0` with
//! the etcd backend, `storage` with the embedded one). Read-only: get and list; every answer
//! carries Kubernetes' deprecation warning. Building the objects and the table is pure.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};
use crate::registry::generic::Registry;

/// The warning kube-apiserver sends with every ComponentStatus answer.
pub const DEPRECATION: &str = "v1 ComponentStatus is deprecated in v1.19+";
/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The components probed by `/healthz`: (name, URL).
const PROBED: &[(&str, &str)] =
    &[("scheduler", "http://127.0.0.1:10259/healthz"), ("controller-manager", "http://127.0.0.1:10257/healthz")];

/// One ComponentStatus: healthy with `message`, or unhealthy with `error`.
pub fn component(name: &str, health: Result<String, String>) -> Value {
    let condition = match health {
        Ok(message) => json!({"type": "Healthy", "status": "True", "message": message}),
        Err(error) => json!({"type": "Healthy", "status": "False", "error": error}),
    };
    json!({"kind": "ComponentStatus", "apiVersion": "v1", "metadata": {"name": name}, "conditions": [condition]})
}

pub fn list(items: Vec<Value>) -> Value {
    json!({"kind": "ComponentStatusList", "apiVersion": "v1", "metadata": {}, "items": items})
}

/// The result of one `/healthz` probe, as kube-apiserver words it: the body when the answer
/// is 200 `ok`, otherwise what went wrong.
pub fn probe_result(url: &str, answer: Result<(u16, String), String>) -> Result<String, String> {
    match answer {
        Ok((200, body)) if body.trim() == "ok" => Ok(body.trim().to_string()),
        Ok((200, body)) => Err(format!("unhealthy answer from {url}: {}", body.trim())),
        Ok((code, body)) => Err(format!("unhealthy http status code: {code}, message: {}", body.trim())),
        Err(e) => Err(format!("Get \"{url}\": {e}")),
    }
}

async fn get(url: &str) -> Result<(u16, String), String> {
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let call = async {
        let resp = client.get(uri).await.map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            msg
        })?;
        let code = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((code, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(PROBE_TIMEOUT, call).await.unwrap_or_else(|_| Err("context deadline exceeded".into()))
}

/// Every component's status, probed at once.
pub async fn all(reg: &Registry, etcd: bool) -> Vec<Value> {
    let probes = PROBED.iter().map(|(name, url)| async move { component(name, probe_result(url, get(url).await)) });
    let mut items = futures::future::join_all(probes).await;
    let storage = match reg.store.current_revision().await {
        Ok(_) => Ok("ok".to_string()),
        Err(e) => Err(e.to_string()),
    };
    items.push(component(if etcd { "etcd-0" } else { "storage" }, storage));
    items
}

/// `GET /api/v1/componentstatuses[/<name>]`.
pub async fn serve(reg: &Registry, etcd: bool, name: Option<&str>) -> ApiResult<Value> {
    let items = all(reg, etcd).await;
    match name {
        None => Ok(list(items)),
        Some(n) => items
            .into_iter()
            .find(|c| c.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
            .ok_or_else(|| ApiError::not_found("", "componentstatuses", n)),
    }
}

/// The discovery entry of the resource in `/api/v1`.
pub fn discovery_entry() -> Value {
    json!({"name": "componentstatuses", "singularName": "componentstatus", "namespaced": false,
           "kind": "ComponentStatus", "verbs": ["get", "list"], "shortNames": ["cs"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_say_what_kube_apiserver_says() {
        let url = "http://127.0.0.1:10259/healthz";
        assert_eq!(probe_result(url, Ok((200, "ok".into()))), Ok("ok".into()));
        assert_eq!(
            probe_result(url, Ok((500, "[-]leader failed\n".into()))),
            Err("unhealthy http status code: 500, message: [-]leader failed".into())
        );
        let refused = probe_result(url, Err("connection refused".into()));
        assert_eq!(refused, Err("Get \"http://127.0.0.1:10259/healthz\": connection refused".into()));
        let bad = component("scheduler", refused);
        assert_eq!(bad["conditions"][0]["status"], "False");
        assert!(bad["conditions"][0]["error"].as_str().unwrap().contains("connection refused"));
        let good = component("etcd-0", Ok("ok".into()));
        assert_eq!(good["conditions"], json!([{"type": "Healthy", "status": "True", "message": "ok"}]));
        assert_eq!(list(vec![good])["kind"], "ComponentStatusList");
    }
}
