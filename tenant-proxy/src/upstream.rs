//! The connection to the apiserver: the kubeconfig's server, CA and client certificate (or
//! token) through kube's own TLS setup, on a plain hyper client — each request crosses one
//! connection task (kube's client adds a buffer worker and per-request layers the proxy's
//! hot path does not need) — with TCP_NODELAY, so a request's body is not held back by
//! Nagle's algorithm behind its headers.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use secrecy::ExposeSecret;

use crate::tenant::Caller;

pub type Response = http::Response<hyper::body::Incoming>;

/// An answer of the proxy's own (a `Status`).
type Answer = axum::response::Response;

pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// The server URL without a trailing `/` (it may carry a path prefix).
    base: String,
    authorization: Option<String>,
}

impl Upstream {
    pub fn new(config: &kube::Config) -> anyhow::Result<Upstream> {
        use kube::client::ConfigExt;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let https = config.rustls_https_connector_with_connector(http)?;
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(60)).build(https);
        let authorization = config.auth_info.token.as_ref().map(|t| format!("Bearer {}", t.expose_secret()));
        anyhow::ensure!(
            config.auth_info.exec.is_none() && config.auth_info.auth_provider.is_none(),
            "the proxy's kubeconfig must authenticate with a client certificate or a token"
        );
        Ok(Upstream { client, base: config.cluster_url.to_string().trim_end_matches('/').to_string(), authorization })
    }

    /// Send `req` (its URI a path and query) to the apiserver.
    pub async fn send(&self, req: http::Request<Vec<u8>>) -> Result<Response, String> {
        let (mut parts, body) = req.into_parts();
        let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        parts.uri = format!("{}{pq}", self.base).parse().map_err(|e| format!("invalid upstream URI: {e}"))?;
        if let Some(a) = &self.authorization {
            if let Ok(v) = http::HeaderValue::from_str(a) {
                parts.headers.insert(http::header::AUTHORIZATION, v);
            }
        }
        let req = http::Request::from_parts(parts, Full::new(Bytes::from(body)));
        self.client.request(req).await.map_err(|e| e.to_string())
    }
}

/// Send a request upstream as the caller: the tenant's administrators with the proxy's own
/// identity, everyone else impersonated under the tenant's names.
pub async fn send(
    upstream: &Upstream,
    caller: &Caller,
    method: http::Method,
    path_and_query: &str,
    headers: Vec<(http::header::HeaderName, String)>,
    body: Vec<u8>,
) -> Result<Response, Answer> {
    let mut builder = http::Request::builder().method(method).uri(path_and_query);
    for (k, v) in headers {
        builder = builder.header(k, v);
    }
    if !caller.is_admin() {
        let (user, groups) = caller.impersonation();
        builder = builder.header("Impersonate-User", user);
        for g in groups {
            builder = builder.header("Impersonate-Group", g);
        }
    }
    let req = builder
        .body(body)
        .map_err(|e| crate::answer::status(400, "BadRequest", &format!("invalid request: {e}"), None))?;
    upstream.send(req).await.map_err(|e| {
        tracing::warn!(error = %e, path = path_and_query, "the apiserver did not answer");
        crate::answer::status(
            503,
            "ServiceUnavailable",
            &format!("the apiserver did not answer the tenant proxy: {e}"),
            None,
        )
    })
}

/// Read a whole upstream body.
pub async fn read(resp: Response) -> Result<(http::response::Parts, Bytes), Answer> {
    let (parts, body) = resp.into_parts();
    match body.collect().await {
        Ok(b) => Ok((parts, b.to_bytes())),
        Err(e) => {
            Err(crate::answer::status(503, "ServiceUnavailable", &format!("reading the apiserver's answer: {e}"), None))
        }
    }
}
