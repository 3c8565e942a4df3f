//! The connection: kubeconfig loading with kubectl's overrides (`--kubeconfig`, `--context`,
//! `--cluster`, `--user`, `--server`, `-n`), raw JSON requests over the `kube` client, and
//! resource resolution (static table first, discovery cached for the rest of the run).

use std::path::PathBuf;

use futures::AsyncBufRead;
use http::{Method, Request};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::error::{from_kube, KubectlError, Result};
use crate::resources::{self, ApiRes};

/// The flags every command takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalOpts {
    /// Path to the kubeconfig file to use for CLI requests.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The name of the kubeconfig cluster to use.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The name of the kubeconfig user to use.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// If present, the namespace scope for this CLI request.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The address and port of the Kubernetes API server.
    #[arg(short = 's', long, global = true)]
    pub server: Option<String>,
    /// Number for the log level verbosity (accepted for compatibility).
    #[arg(short = 'v', long = "v", global = true)]
    pub verbosity: Option<u8>,
}

/// The kubeconfig as kubectl finds it: `--kubeconfig`, else `$KUBECONFIG` (merged), else
/// `~/.kube/config`. `None` when there is none (or it is empty).
pub fn load_kubeconfig(path: Option<&PathBuf>) -> Result<Option<Kubeconfig>> {
    match path {
        Some(p) => {
            if !p.exists() {
                return Err(KubectlError::msg(format!("stat {}: no such file or directory", p.display())));
            }
            Kubeconfig::read_from(p).map(Some).map_err(|e| KubectlError::msg(format!("{}: {e}", p.display())))
        }
        None => Ok(Kubeconfig::read().ok()),
    }
}

/// A connected command context.
pub struct Ctx {
    pub client: kube::Client,
    pub server: String,
    /// The namespace of the request (flag, else the context's, else `default`).
    pub namespace: String,
    /// Whether `-n/--namespace` was given.
    pub namespace_flag: bool,
    discovered: OnceCell<Vec<ApiRes>>,
}

/// The command running (`label`, `set`, …): requests say `kubectl-<command>` first in their
/// User-Agent, which is the name the server records a write under in managedFields when
/// the request names no fieldManager (as the official kubectl's `kubectl-label` …).
static COMMAND: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Name the command this process runs (once, from main).
pub fn set_command(name: &str) {
    let _ = COMMAND.set(name.to_string());
}

fn user_agent() -> String {
    let who = COMMAND.get().map(|c| format!("kubectl-{c}")).unwrap_or_else(|| "kubectl".into());
    format!("{who}/v{} ({}/{}) minik8s", env!("CARGO_PKG_VERSION"), std::env::consts::OS, std::env::consts::ARCH)
}

/// How often a request the server asked to retry is sent again (client-go's `maxRetries`).
const MAX_RETRIES: u32 = 10;

/// The delay a throttled or unavailable server asked for, if it asked.
fn retry_after(s: &kube::core::Status) -> Option<std::time::Duration> {
    let secs = s.details.as_ref().map_or(0, |d| d.retry_after_seconds);
    (s.code == 429 || s.code >= 500)
        .then_some(secs)
        .filter(|s| *s > 0)
        .map(|s| std::time::Duration::from_secs(s as u64))
}

impl Ctx {
    pub async fn connect(g: &GlobalOpts) -> Result<Ctx> {
        let kc = load_kubeconfig(g.kubeconfig.as_ref())?;
        let opts = KubeConfigOptions { context: g.context.clone(), cluster: g.cluster.clone(), user: g.user.clone() };
        let mut config = match kc {
            Some(kc) => match kube::Config::from_custom_kubeconfig(kc, &opts).await {
                Ok(c) => c,
                Err(e) if g.context.is_some() => {
                    return Err(KubectlError::msg(format!("context was not found for specified context: {e}")))
                }
                // A kubeconfig naming no usable context means kubectl's defaults; one whose
                // certificates or key cannot be read is an error (as kubectl says it).
                Err(
                    e @ (kube::config::KubeconfigError::LoadCertificateAuthority(_)
                    | kube::config::KubeconfigError::LoadClientCertificate(_)
                    | kube::config::KubeconfigError::LoadClientKey(_)
                    | kube::config::KubeconfigError::ParseCertificates(_)),
                ) => return Err(KubectlError::msg(format!("error loading config file: {e}"))),
                Err(_) => default_config(),
            },
            None => default_config(),
        };
        if let Some(s) = &g.server {
            let with_scheme = if s.contains("://") { s.clone() } else { format!("http://{s}") };
            config.cluster_url =
                with_scheme.parse().map_err(|e| KubectlError::msg(format!("invalid --server {s:?}: {e}")))?;
        }
        let server = config.cluster_url.to_string();
        let namespace = g.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
        config.read_timeout = None;
        // kubectl retries only what the server asks to be retried (see `call`); the kube
        // crate's own policy would retry every 429 for minutes (a drain's disruption budget).
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| from_kube(e, &server))?;
        Ok(Ctx { client, server, namespace, namespace_flag: g.namespace.is_some(), discovered: OnceCell::new() })
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        accept: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Request<Vec<u8>>> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::ACCEPT, accept)
            .header(http::header::USER_AGENT, user_agent());
        let bytes = match body {
            Some((ct, bytes)) => {
                b = b.header(http::header::CONTENT_TYPE, ct);
                bytes
            }
            None => Vec::new(),
        };
        b.body(bytes).map_err(|e| KubectlError::msg(format!("bad request {path}: {e}")))
    }

    /// Send a request; the body of a 2xx answer as text.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        accept: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<String> {
        // As client-go: a 429 or 5xx that says when to come back (Retry-After, also in the
        // Status' details) is sent again after that long, at most MAX_RETRIES times.
        let mut attempt = 0;
        loop {
            let req = self.request(method.clone(), path, accept, body.as_ref().map(|(ct, b)| (*ct, b.clone())))?;
            let result = self.client.request_text(req).await;
            let wait = match &result {
                Err(kube::Error::Api(s)) if attempt < MAX_RETRIES => retry_after(s),
                _ => None,
            };
            match wait {
                Some(d) => {
                    attempt += 1;
                    tokio::time::sleep(d).await;
                }
                None => return result.map_err(|e| from_kube(e, &self.server)),
            }
        }
    }

    /// Send a request and decode the JSON answer.
    pub async fn json(&self, method: Method, path: &str, body: Option<(&str, Vec<u8>)>) -> Result<Value> {
        let text = self.call(method, path, "application/json", body).await?;
        serde_json::from_str(&text).map_err(|e| KubectlError::msg(format!("decoding the answer of {path}: {e}")))
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        self.json(Method::GET, path, None).await
    }

    /// A streaming GET (watch, logs -f).
    pub async fn stream(&self, path: &str) -> Result<impl AsyncBufRead + use<>> {
        self.stream_accept(path, "application/json").await
    }

    /// A streamed GET with its own `Accept` (watches as Tables).
    pub async fn stream_accept(&self, path: &str, accept: &str) -> Result<impl AsyncBufRead + use<>> {
        let req = self.request(Method::GET, path, accept, None)?;
        self.client.request_stream(req).await.map_err(|e| from_kube(e, &self.server))
    }

    /// Every resource the server serves (one discovery per run).
    pub async fn discovery(&self) -> Result<&[ApiRes]> {
        self.discovered.get_or_try_init(|| discover(self)).await.map(Vec::as_slice)
    }

    /// What a user-typed resource name means: the static table first, then discovery.
    pub async fn resolve(&self, arg: &str) -> Result<ApiRes> {
        if let Some(r) = resources::resolve(arg, &resources::well_known()) {
            if let Some(other) = resources::shadowed_short_name(arg) {
                eprintln!("Warning: short name \"{arg}\" could also match lower priority resource {other}");
            }
            return Ok(r);
        }
        if let Some(r) = resources::resolve(arg, self.discovery().await?) {
            return Ok(r);
        }
        if let Some(r) = self.resolve_non_preferred(arg).await {
            return Ok(r);
        }
        Err(KubectlError::msg(format!(
            "the server doesn't have a resource type \"{}\"",
            arg.split('.').next().unwrap_or(arg)
        )))
    }

    /// `<resource>.<version>.<group>` of a version that is not its group's preferred one
    /// (discovery lists only those): that group version is asked.
    async fn resolve_non_preferred(&self, arg: &str) -> Option<ApiRes> {
        let (_, rest) = arg.split_once('.')?;
        let (version, group) = rest.split_once('.')?;
        let list = self.group_version(&format!("{group}/{version}")).await?;
        resources::resolve(arg, &list)
    }

    /// The resource of a manifest's apiVersion and kind.
    pub async fn resolve_kind(&self, api_version: &str, kind: &str) -> Result<Option<ApiRes>> {
        if let Some(r) = resources::by_kind(api_version, kind, &resources::well_known()) {
            return Ok(Some(r));
        }
        if let Some(r) = resources::by_kind(api_version, kind, self.discovery().await?) {
            return Ok(Some(r));
        }
        // A served version that is not the group's preferred one (discovery lists only
        // those): ask that group version itself.
        Ok(match self.group_version(api_version).await {
            Some(list) => resources::by_kind(api_version, kind, &list),
            None => None,
        })
    }

    /// The resources of one group version (`/api/v1`, `/apis/<group>/<version>`), if served.
    async fn group_version(&self, api_version: &str) -> Option<Vec<ApiRes>> {
        let path =
            if api_version.contains('/') { format!("/apis/{api_version}") } else { format!("/api/{api_version}") };
        self.get(&path).await.ok().map(|doc| resources::parse_resource_list(&doc))
    }
}

fn default_config() -> kube::Config {
    kube::Config::new(http::Uri::from_static("http://localhost:8080"))
}

async fn discover(ctx: &Ctx) -> Result<Vec<ApiRes>> {
    let core = ctx.get("/api/v1");
    let groups = ctx.get("/apis");
    let (core, groups) = futures::join!(core, groups);
    let mut out = resources::parse_resource_list(&core?);
    let gvs = resources::preferred_versions(&groups?);
    let docs = futures::future::join_all(gvs.iter().map(|gv| ctx.get_owned(format!("/apis/{gv}")))).await;
    for d in docs.into_iter().flatten() {
        out.extend(resources::parse_resource_list(&d));
    }
    Ok(out)
}

impl Ctx {
    async fn get_owned(&self, path: String) -> Result<Value> {
        self.get(&path).await
    }
}

/// Percent-encode a query parameter value.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `path?k=v&…` with the non-empty parameters encoded.
pub fn with_query(path: &str, params: &[(&str, String)]) -> String {
    let q: Vec<String> = params.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={}", enc(v))).collect();
    if q.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_encoding() {
        assert_eq!(
            with_query("/p", &[("labelSelector", "app in (a,b)".into()), ("x", String::new())]),
            "/p?labelSelector=app%20in%20%28a%2Cb%29"
        );
        assert_eq!(with_query("/p", &[]), "/p");
    }
}
