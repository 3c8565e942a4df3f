//! Who may call a kubelet's port, decided as the kubelet decides it: the kubelet's own
//! port, and the kubelet API the module controller serves for its virtual nodes.
//!
//! Every request on `--port` (HTTPS) is first **authenticated**: a client certificate that
//! chains to `--client-ca-file` (CN the user, O the groups); else a bearer token, which the
//! apiserver reviews (`TokenReview`, with `--authentication-token-webhook`); else, with
//! `--anonymous-auth` (Kubernetes' default), `system:anonymous` in
//! `system:unauthenticated`. A request that is none of these gets 401 `Unauthorized`.
//!
//! Then it is **authorized**: with `--authorization-mode AlwaysAllow` (the flag's default)
//! everything is allowed; with `Webhook` the apiserver is asked a `SubjectAccessReview` for
//! the node object (the kubelet's node; for a virtual node, the node of the pod asked about): verb from the method (GET → get, POST → create, …), resource `nodes`,
//! name the node, subresource from the path — `stats` (`/stats/…`), `metrics`
//! (`/metrics…`), `log` (`/logs/…`), `checkpoint`, and `proxy` for everything else
//! (container logs, exec, attach, port-forward, healthz). A denial is 403
//! `Forbidden (user=…, verb=…, resource=nodes, subresource=…)`.
//!
//! Reviews are cached as the kubelet caches them: a token's answer for 2 minutes, an
//! allowed access for 5 minutes, a denied one for 30 seconds.
//!
//! [`decide`] and [`attributes`] are the pure decisions; [`Auth`] is the shell that asks
//! the apiserver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};

/// How long a token's review is reused (`--authentication-token-webhook-cache-ttl`).
pub const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long an allowed access is reused (`--authorization-webhook-cache-authorized-ttl`).
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied access is reused (`--authorization-webhook-cache-unauthorized-ttl`).
pub const DENIED_TTL: Duration = Duration::from_secs(30);

pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// A caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> User {
        User { name: ANONYMOUS.into(), uid: String::new(), groups: vec![UNAUTHENTICATED.into()] }
    }
}

/// The user of a verified client certificate (a request extension, per connection).
#[derive(Clone, Debug)]
pub struct CertificateUser(pub User);

/// The user of a client certificate (DER): CN and O; none without a CN.
pub fn user_of_certificate(der: &[u8]) -> Option<CertificateUser> {
    let info = crate::pki::inspect(der).ok()?;
    (!info.common_name.is_empty())
        .then(|| CertificateUser(User { name: info.common_name, uid: String::new(), groups: info.organizations }))
}

/// `--authorization-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    #[value(name = "AlwaysAllow")]
    AlwaysAllow,
    #[value(name = "Webhook")]
    Webhook,
}

/// What the kubelet was told about its callers.
#[derive(Clone, Debug)]
pub struct Settings {
    pub anonymous: bool,
    pub token_webhook: bool,
    pub mode: Mode,
}

/// The kubelet's flags about its callers (shared by every binary that serves a kubelet API).
#[derive(clap::Args, Clone, Debug)]
pub struct AuthArgs {
    /// Callers presenting a client certificate signed by this CA are authenticated by it (CN
    /// the user, O the groups).
    #[arg(long = "client-ca-file")]
    pub client_ca_file: Option<std::path::PathBuf>,
    /// Requests without credentials are served as system:anonymous (subject to authorization).
    #[arg(long = "anonymous-auth", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub anonymous_auth: bool,
    /// Bearer tokens are authenticated by asking the apiserver (TokenReview).
    #[arg(long = "authentication-token-webhook", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub authentication_token_webhook: bool,
    /// AlwaysAllow, or Webhook: every request is authorized by the apiserver
    /// (SubjectAccessReview on the node's nodes/proxy, nodes/stats, nodes/log … subresources).
    #[arg(long = "authorization-mode", value_enum, default_value = "AlwaysAllow")]
    pub authorization_mode: Mode,
}

impl AuthArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            anonymous: self.anonymous_auth,
            token_webhook: self.authentication_token_webhook,
            mode: self.authorization_mode,
        }
    }
}

/// How a request is to be authenticated.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Its client certificate's user.
    Certificate(&'a User),
    /// Its bearer token, reviewed by the apiserver.
    Review(&'a str),
    Anonymous,
    /// 401.
    Unauthorized,
}

/// How to authenticate a request with this certificate user and `Authorization` header.
/// A token the kubelet cannot review (no webhook) is not anonymous: it is refused.
pub fn decide<'a>(settings: &Settings, certificate: Option<&'a User>, authorization: Option<&'a str>) -> Step<'a> {
    if let Some(user) = certificate {
        return Step::Certificate(user);
    }
    match authorization {
        Some(value) => match value.strip_prefix("Bearer ").map(str::trim).filter(|t| !t.is_empty()) {
            Some(token) if settings.token_webhook => Step::Review(token),
            _ => Step::Unauthorized,
        },
        None if settings.anonymous => Step::Anonymous,
        None => Step::Unauthorized,
    }
}

/// The access a request asks for: (verb, subresource) of the node object.
pub fn attributes(method: &Method, path: &str) -> (&'static str, &'static str) {
    let verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    let under = |prefix: &str| path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'));
    let subresource = if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/checkpoint") {
        "checkpoint"
    } else {
        "proxy"
    };
    (verb, subresource)
}

/// The 403 body, as the kubelet words it.
pub fn forbidden_message(user: &str, verb: &str, subresource: &str) -> String {
    format!("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")
}

type Cache<K, V> = Mutex<HashMap<K, (V, Instant)>>;

/// The shell: asks the apiserver, caches its answers.
pub struct Auth {
    settings: Settings,
    client: kube::Client,
    tokens: Cache<[u8; 32], Option<User>>,
    accesses: Cache<(User, String, &'static str, &'static str), bool>,
}

impl Auth {
    pub fn new(settings: Settings, client: kube::Client) -> Arc<Auth> {
        Arc::new(Auth { settings, client, tokens: Mutex::default(), accesses: Mutex::default() })
    }

    fn cached<K: std::hash::Hash + Eq, V: Clone>(cache: &Cache<K, V>, key: &K) -> Option<V> {
        let map = cache.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).filter(|(_, until)| Instant::now() < *until).map(|(v, _)| v.clone())
    }

    fn remember<K: std::hash::Hash + Eq, V>(cache: &Cache<K, V>, key: K, value: V, ttl: Duration) {
        let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: expired answers go when the map grows.
        if map.len() >= 4096 {
            let now = Instant::now();
            map.retain(|_, (_, until)| now < *until);
        }
        map.insert(key, (value, Instant::now() + ttl));
    }

    /// The user of a bearer token, asked of the apiserver (`None`: not authenticated).
    async fn review(&self, token: &str) -> anyhow::Result<Option<User>> {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(user) = Self::cached(&self.tokens, &key) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), ..Default::default() },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answer = api.create(&Default::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        let user = status.authenticated.unwrap_or(false).then(|| {
            let info = status.user.unwrap_or_default();
            User {
                name: info.username.unwrap_or_default(),
                uid: info.uid.unwrap_or_default(),
                groups: info.groups.unwrap_or_default(),
            }
        });
        Self::remember(&self.tokens, key, user.clone(), TOKEN_TTL);
        Ok(user)
    }

    /// Whether the apiserver allows `user` this access to `node`.
    async fn allowed(
        &self,
        user: &User,
        node: &str,
        verb: &'static str,
        subresource: &'static str,
    ) -> anyhow::Result<bool> {
        let key = (user.clone(), node.to_string(), verb, subresource);
        if let Some(allowed) = Self::cached(&self.accesses, &key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(subresource.into()),
                    name: Some(node.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let answer = api.create(&Default::default(), &review).await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        Self::remember(&self.accesses, key, allowed, if allowed { ALLOWED_TTL } else { DENIED_TTL });
        Ok(allowed)
    }

    /// Authenticate and authorize a request to `node`'s kubelet API (its certificate user,
    /// `Authorization` header, method and path): `Ok` to serve it, else the answer.
    pub async fn check(
        &self,
        node: &str,
        certificate: Option<&User>,
        authorization: Option<&str>,
        method: &Method,
        path: &str,
    ) -> Result<(), Response> {
        let user = self.authenticate(certificate, authorization).await?;
        self.authorize(&user, node, method, path).await
    }

    /// Who the caller is (its certificate user, or its bearer token reviewed), or the
    /// `401 Unauthorized` answer.
    pub async fn authenticate(
        &self,
        certificate: Option<&User>,
        authorization: Option<&str>,
    ) -> Result<User, Response> {
        let unauthorized = || text(StatusCode::UNAUTHORIZED, "Unauthorized".into());
        match decide(&self.settings, certificate, authorization) {
            Step::Certificate(user) => Ok(user.clone()),
            Step::Anonymous => Ok(User::anonymous()),
            Step::Unauthorized => Err(unauthorized()),
            Step::Review(token) => match self.review(token).await {
                Ok(Some(user)) => Ok(user),
                Ok(None) => Err(unauthorized()),
                Err(e) => {
                    tracing::warn!(error = %e, "reviewing a caller's token failed");
                    Err(unauthorized())
                }
            },
        }
    }

    /// Whether `user` may make this request (method, path) of `node`'s kubelet API: `Ok`,
    /// or the `403 Forbidden` (or, when the apiserver cannot be asked, 500) answer.
    pub async fn authorize(&self, user: &User, node: &str, method: &Method, path: &str) -> Result<(), Response> {
        if self.settings.mode == Mode::AlwaysAllow {
            return Ok(());
        }
        let (verb, subresource) = attributes(method, path);
        match self.allowed(user, node, verb, subresource).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(text(StatusCode::FORBIDDEN, forbidden_message(&user.name, verb, subresource))),
            Err(e) => {
                tracing::warn!(error = %e, user = %user.name, "asking the apiserver for an access review failed");
                Err(text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Authorization error (user={}, verb={verb}, resource=nodes, subresource={subresource})",
                        user.name
                    ),
                ))
            }
        }
    }
}

/// A plain-text answer, as the kubelet writes its refusals.
fn text(code: StatusCode, msg: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], msg).into_response()
}

/// The caller's credentials of a request: its verified certificate's user and its
/// `Authorization` header.
pub fn credentials(req: &Request) -> (Option<User>, Option<String>) {
    let certificate = req.extensions().get::<CertificateUser>().map(|c| c.0.clone());
    let authorization = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
    (certificate, authorization)
}

/// The middleware of a kubelet's port: every request is about the node `.1`.
pub async fn layer(State((auth, node)): State<(Arc<Auth>, Arc<str>)>, req: Request, next: Next) -> Response {
    let (certificate, authorization) = credentials(&req);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    match auth.check(&node, certificate.as_ref(), authorization.as_deref(), &method, &path).await {
        Ok(()) => next.run(req).await,
        Err(answer) => answer,
    }
}

/// Serve a kubelet API `app` over TLS on `addr`, each connection's verified client
/// certificate its requests' [`CertificateUser`]; the bound address is returned (port 0
/// picks one).
pub async fn serve(
    addr: std::net::SocketAddr,
    app: axum::Router,
    tls: Arc<rustls::ServerConfig>,
) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let user_of: crate::serve::PeerUser<_> = user_of_certificate;
    tokio::spawn(crate::serve::serve_tls(
        listener,
        app,
        tls,
        user_of,
        std::future::pending(),
        crate::serve::IDLE_TIMEOUT,
    ));
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(anonymous: bool, token_webhook: bool) -> Settings {
        Settings { anonymous, token_webhook, mode: Mode::Webhook }
    }

    #[test]
    fn certificates_then_tokens_then_anonymous() {
        let alice = User { name: "alice".into(), uid: String::new(), groups: vec![] };
        let open = settings(true, true);
        assert_eq!(decide(&open, Some(&alice), Some("Bearer t")), Step::Certificate(&alice));
        assert_eq!(decide(&open, None, Some("Bearer t")), Step::Review("t"));
        assert_eq!(decide(&open, None, None), Step::Anonymous);
        // A credential that cannot be checked is refused, never anonymous.
        assert_eq!(decide(&open, None, Some("Basic dTpw")), Step::Unauthorized);
        assert_eq!(decide(&open, None, Some("Bearer ")), Step::Unauthorized);
        assert_eq!(decide(&settings(true, false), None, Some("Bearer t")), Step::Unauthorized);
        assert_eq!(decide(&settings(false, true), None, None), Step::Unauthorized);
    }

    #[test]
    fn paths_map_to_node_subresources_as_the_kubelet_maps_them() {
        let get = |p| attributes(&Method::GET, p);
        assert_eq!(get("/stats/summary"), ("get", "stats"));
        assert_eq!(get("/stats"), ("get", "stats"));
        assert_eq!(get("/metrics"), ("get", "metrics"));
        assert_eq!(get("/metrics/cadvisor"), ("get", "metrics"));
        assert_eq!(get("/logs/syslog"), ("get", "log"));
        assert_eq!(get("/containerLogs/default/p/c"), ("get", "proxy"));
        assert_eq!(get("/healthz"), ("get", "proxy"));
        assert_eq!(get("/statsx"), ("get", "proxy"), "a prefix is not a parent path");
        assert_eq!(attributes(&Method::POST, "/exec/default/p/c"), ("create", "proxy"));
        assert_eq!(attributes(&Method::POST, "/checkpoint/default/p/c"), ("create", "checkpoint"));
        assert_eq!(attributes(&Method::DELETE, "/pods"), ("delete", "proxy"));
        assert_eq!(
            forbidden_message("system:anonymous", "get", "log"),
            "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource=log)"
        );
    }
}
