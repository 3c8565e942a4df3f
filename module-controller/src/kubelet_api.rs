//! The kubelet API of the virtual nodes, served by the controller as a virtual kubelet serves
//! it. Every vnode publishes this server as its kubelet (`InternalIP` = `--node-ip`,
//! `daemonEndpoints.kubeletEndpoint.port` = `--port`), so the apiserver sends `kubectl logs`
//! of a module pod here, over TLS and with its kubelet-client certificate, as it would to a
//! kubelet. The controller answers `/containerLogs/{ns}/{pod}/{container}` by asking the
//! arklet of the pod's base (found in [`Arklets`]) and passing its answer through as a
//! stream; the base's arklet need not be reachable from the apiserver, nor speak TLS.
//!
//! Callers are authenticated and authorized as a kubelet's are ([`common::kubelet_auth`],
//! the same flags), against the node the pod is bound to.

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use common::kubelet_auth::{self, Auth};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::controller::Arklets;

/// How long an arklet may take to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

struct Server {
    kube: kube::Client,
    auth: Arc<Auth>,
    arklets: Arklets,
    http: Client<HttpConnector, Body>,
}

fn text(code: StatusCode, message: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
}

/// Where a pod's module logs are: the arklet of the base behind `node`, if the controller
/// knows one. `Err` is the answer to give instead.
fn arklet_of(arklets: &Arklets, pod: &Pod) -> Result<String, (StatusCode, String)> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()) else {
        return Err((StatusCode::BAD_REQUEST, format!("pod {name:?} is not scheduled to a node yet")));
    };
    let known = arklets.read().unwrap_or_else(|e| e.into_inner()).get(node).cloned();
    known.ok_or_else(|| {
        (
            StatusCode::NOT_FOUND,
            format!("node {node:?} of pod {name:?} is not a base this module controller serves, or its base has no arklet HTTP API"),
        )
    })
}

/// `GET /containerLogs/{ns}/{pod}/{container}`: the pod's node decides who may ask; the
/// base's arklet answers, with the query (`tailLines`, `follow` …) passed on.
async fn container_logs(
    State(s): State<Arc<Server>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    // Who asks comes first: an unauthenticated caller learns nothing, not even whether
    // the pod exists.
    let (certificate, authorization) = kubelet_auth::credentials(&req);
    let user = match s.auth.authenticate(certificate.as_ref(), authorization.as_deref()).await {
        Ok(user) => user,
        Err(answer) => return answer,
    };
    let found = match Api::<Pod>::namespaced(s.kube.clone(), &ns).get_opt(&pod).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, namespace = %ns, pod = %pod, "looking up a pod for its logs failed");
            return text(StatusCode::SERVICE_UNAVAILABLE, format!("cannot look up pod {ns}/{pod}: {e}"));
        }
    };
    // A pod that does not exist is about no node: only a caller allowed on every node learns so.
    let node = found.as_ref().and_then(|p| p.spec.as_ref()).and_then(|s| s.node_name.clone()).unwrap_or_default();
    if let Err(answer) = s.auth.authorize(&user, &node, req.method(), req.uri().path()).await {
        return answer;
    }
    let Some(found) = found else {
        return text(StatusCode::NOT_FOUND, format!("pod {pod:?} does not exist\n"));
    };
    let arklet = match arklet_of(&s.arklets, &found) {
        Ok(a) => a,
        Err((code, message)) => return text(code, message),
    };
    let uri = match query {
        Some(q) => format!("http://{arklet}/containerLogs/{ns}/{pod}/{container}?{q}"),
        None => format!("http://{arklet}/containerLogs/{ns}/{pod}/{container}"),
    };
    let upstream = match http::Request::get(&uri).body(Body::empty()) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad logs request: {e}")),
    };
    match s.http.request(upstream).await {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let mut out = Response::new(Body::new(body));
            *out.status_mut() = parts.status;
            if let Some(t) = parts.headers.get(header::CONTENT_TYPE) {
                out.headers_mut().insert(header::CONTENT_TYPE, t.clone());
            }
            out
        }
        Err(e) => {
            tracing::warn!(error = %e, arklet = %arklet, "asking a base's arklet for logs failed");
            text(StatusCode::SERVICE_UNAVAILABLE, format!("the base's arklet at {arklet} does not answer: {e}"))
        }
    }
}

/// The kubelet API's routes.
pub fn router(kube: kube::Client, auth: Arc<Auth>, arklets: Arklets) -> Router {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_nodelay(true);
    let http = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
    let server = Arc::new(Server { kube, auth, arklets, http });
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .with_state(server)
}

/// The TLS configuration of `--port`: `--tls-cert-file`/`--tls-private-key-file` when
/// given, else a self-signed certificate for `names` made at start (which an apiserver that
/// verifies kubelets refuses: give a certificate of the cluster's CA then). Client
/// certificates are checked against `client_ca`.
pub fn tls_config(
    files: Option<(&FsPath, &FsPath)>,
    names: &[String],
    client_ca: Option<&FsPath>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    if let Some((cert, key)) = files {
        return Ok(common::tls::server_config(&common::tls::TlsFiles { cert, key, client_ca })?);
    }
    let host = names.first().map(String::as_str).unwrap_or("localhost");
    let (chain, key) = common::pki::self_signed_serving(host, names, common::pki::now())?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain.as_bytes())
        .collect::<Result<_, _>>()
        .context("a self-signed certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).context("a self-signed certificate's key")?;
    let roots = client_ca.map(|p| common::tls::read_roots("--client-ca-file", p)).transpose()?;
    tracing::info!(names = ?names, "serving the kubelet API with a self-signed certificate");
    Ok(common::tls::build(chain, key, roots)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(node: Option<&str>) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta { name: Some("biz".into()), ..Default::default() },
            spec: Some(PodSpec { node_name: node.map(str::to_string), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_s_logs_are_at_the_arklet_of_its_node() {
        let arklets = Arklets::default();
        arklets.write().unwrap().insert("vnode.b1.dev".into(), "10.0.0.7:1238".into());
        assert_eq!(arklet_of(&arklets, &pod(Some("vnode.b1.dev"))).unwrap(), "10.0.0.7:1238");
        assert_eq!(arklet_of(&arklets, &pod(Some("worker-1"))).unwrap_err().0, StatusCode::NOT_FOUND);
        assert_eq!(arklet_of(&arklets, &pod(None)).unwrap_err().0, StatusCode::BAD_REQUEST);
    }
}
