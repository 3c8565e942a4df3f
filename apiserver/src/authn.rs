//! Authentication: x509 client certificates (`--client-ca-file`), then static tokens
//! (`--token-auth-file`), then bootstrap tokens and ServiceAccount tokens, in Kubernetes'
//! order. [`decide`] says which credential a request carries (pure);
//! [`Authenticators`] finds a bearer token's user.
//!
//! x509: the secure port's TLS handshake verifies a presented client certificate against the
//! client CA (`tls.rs`); the verified certificate's subject names the user — CN the name, O
//! the groups, no uid — ([`user_of_certificate`]), and the listener puts it on every request
//! of that connection as a [`CertificateUser`]. A certificate without a CN authenticates
//! nobody (as upstream).
//!
//! Tokens: Kubernetes' token file format.
//!
//! The file is CSV, one user a line: `token,user,uid[,"group1,group2"]` (at least three
//! columns; an empty token is skipped; a repeated token keeps its last line), exactly as
//! kube-apiserver's `tokenfile` authenticator reads it.
//!
//! Requests without credentials ([`Anonymous`], `--anonymous-auth`): as kube-apiserver, they
//! are `system:anonymous` in `system:unauthenticated` and the authorizer decides (RBAC's
//! `system:public-info-viewer` lets them read health and version; anything else is 403).
//! With `--anonymous-auth=false` they are 401 everywhere, health included. Under
//! AlwaysAllow, which would let an anonymous request do anything, kube-apiserver turns
//! anonymous requests off; we keep them for the health and version endpoints only (what its
//! structured authentication configuration's anonymous `conditions` express), so probes
//! without credentials keep working. A request that presents a wrong credential is 401
//! everywhere, as Kubernetes does (a failed authenticator is not anonymous). 401 is
//! Kubernetes' `Status` (reason `Unauthorized`, message `Unauthorized`).
//!
//! Tokens are compared as SHA-256 digests in constant time against every entry, so neither
//! the position of a match nor a shared prefix shows in the timing.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// Who a request comes from: a token's user or a client certificate's subject. The
/// authentication layer puts it into the request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// The user of a connection's verified client certificate, set on each of its requests by
/// the TLS listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateUser(pub UserInfo);

/// The user a verified client certificate (DER) names: CN the user, O the groups (the x509
/// authenticator's rule). `None` without a CN, or for bytes that are no certificate.
pub fn user_of_certificate(der: &[u8]) -> Option<UserInfo> {
    let info = common::pki::inspect(der).ok()?;
    (!info.common_name.is_empty()).then(|| UserInfo {
        name: info.common_name,
        uid: String::new(),
        groups: info.organizations,
    })
}

/// The users of a token file, by the digest of their token.
#[derive(Debug, Default)]
pub struct TokenAuthenticator {
    entries: Vec<([u8; 32], UserInfo)>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read token file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("token file {path}: {source}")]
    Csv { path: String, source: csv::Error },
    #[error("token file '{path}' must have at least 3 columns (token, user name, user uid), found {found}")]
    TooFewColumns { path: String, found: usize },
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl TokenAuthenticator {
    /// Read a token file.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text =
            std::fs::read(path).map_err(|source| TokenFileError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse a token file's contents (`path` only names it in errors).
    pub fn parse(text: &[u8], path: &str) -> Result<Self, TokenFileError> {
        let mut reader =
            csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::None).from_reader(text);
        let mut auth = TokenAuthenticator::default();
        for record in reader.records() {
            let record = record.map_err(|source| TokenFileError::Csv { path: path.to_string(), source })?;
            // Go's encoding/csv with TrimLeadingSpace: leading blanks of a field are dropped.
            let field = |i: usize| record.get(i).map(|f| f.trim_start_matches([' ', '\t']).to_string());
            if record.len() < 3 {
                return Err(TokenFileError::TooFewColumns { path: path.to_string(), found: record.len() });
            }
            let token = field(0).unwrap_or_default();
            if token.is_empty() {
                tracing::warn!(path, "empty token in token file; line skipped");
                continue;
            }
            let user = UserInfo {
                name: field(1).unwrap_or_default(),
                uid: field(2).unwrap_or_default(),
                groups: field(3).map(|g| g.split(',').map(str::to_string).collect()).unwrap_or_default(),
            };
            let key = digest(token.as_bytes());
            match auth.entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => {
                    tracing::warn!(path, user = user.name, "duplicate token in token file; the last line wins");
                    entry.1 = user;
                }
                None => auth.entries.push((key, user)),
            }
        }
        Ok(auth)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The user a token belongs to. Every entry is compared, in constant time.
    pub fn lookup(&self, token: &str) -> Option<&UserInfo> {
        let key = digest(token.as_bytes());
        let mut found = None;
        for (k, user) in &self.entries {
            if bool::from(k.ct_eq(&key)) {
                found = Some(user);
            }
        }
        found
    }
}

/// The token of an `Authorization` header, as kube-apiserver's bearer-token reader takes
/// it: `None` when the header is not a bearer credential at all, `Some("")` for an empty one.
pub fn bearer_token(header: &str) -> Option<&str> {
    let mut parts = header.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// Paths anyone may read without credentials (`system:public-info-viewer`).
pub fn is_public_path(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz", "/version"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')))
}

/// Who a request without credentials is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Anonymous {
    /// Nobody: 401 (`--anonymous-auth=false`).
    Off,
    /// `system:anonymous` on the health and version endpoints only, 401 elsewhere (the
    /// AlwaysAllow authorizer, which cannot tell them apart).
    #[default]
    PublicPaths,
    /// `system:anonymous` everywhere; the authorizer decides (`--anonymous-auth`, the
    /// default, with RBAC and the other deciding authorizers).
    Everywhere,
}

impl Anonymous {
    /// What `--anonymous-auth` means, with or without the AlwaysAllow authorizer.
    pub fn from_flag(enabled: bool, always_allow: bool) -> Anonymous {
        match (enabled, always_allow) {
            (false, _) => Anonymous::Off,
            (true, true) => Anonymous::PublicPaths,
            (true, false) => Anonymous::Everywhere,
        }
    }

    fn admits(self, path: &str) -> bool {
        match self {
            Anonymous::Off => false,
            Anonymous::PublicPaths => is_public_path(path),
            Anonymous::Everywhere => true,
        }
    }
}

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision<'a> {
    /// A verified client certificate's user.
    User(&'a UserInfo),
    /// A bearer token for the token authenticators.
    Token(&'a str),
    /// No credentials, where anonymous requests are admitted.
    Anonymous,
    /// 401.
    Unauthorized,
}

/// Which credential a request authenticates with (pure): a verified client certificate's
/// user first, then a bearer token, else anonymous where `anonymous` admits it. A credential
/// that is present but unreadable is 401 even on public paths (a failed credential is not
/// anonymous).
pub fn decide<'a>(
    certificate: Option<&'a UserInfo>,
    path: &str,
    authorization: Option<&'a HeaderValue>,
    anonymous: Anonymous,
) -> Decision<'a> {
    if let Some(user) = certificate {
        return Decision::User(user);
    }
    let token = match authorization {
        None => None,
        // A header that is not text cannot hold a valid token.
        Some(v) => match v.to_str() {
            Ok(s) => bearer_token(s),
            Err(_) => return Decision::Unauthorized,
        },
    };
    match token {
        Some("") => Decision::Unauthorized,
        Some(t) => Decision::Token(t),
        None if anonymous.admits(path) => Decision::Anonymous,
        None => Decision::Unauthorized,
    }
}

/// A bearer token's user and the audiences it was accepted for.
pub type TokenFuture<'a> = Pin<Box<dyn Future<Output = Option<(UserInfo, Vec<String>)>> + Send + 'a>>;

/// A token authenticator that needs to look things up (ServiceAccount tokens read their
/// account and pod).
pub trait TokenUser: Send + Sync {
    /// The token's user, checked against `audiences` (the apiserver's own when `None`).
    fn user<'a>(&'a self, token: &'a str, audiences: Option<&'a [String]>) -> TokenFuture<'a>;
}

/// The token authenticators, asked in Kubernetes' order: the token file, then those that
/// look tokens up (bootstrap tokens, ServiceAccount tokens). The request path and
/// TokenReview share them.
#[derive(Clone, Default)]
pub struct Authenticators {
    pub tokens: Option<Arc<TokenAuthenticator>>,
    pub lookups: Vec<Arc<dyn TokenUser>>,
    /// Who a request without credentials is.
    pub anonymous: Anonymous,
}

impl Authenticators {
    /// The user of a bearer token, with the audiences it is good for (the token file's
    /// tokens are good for any: `audiences` as asked).
    pub async fn token(&self, token: &str, audiences: Option<&[String]>) -> Option<(UserInfo, Vec<String>)> {
        if token.is_empty() {
            return None;
        }
        if let Some(user) = self.tokens.as_ref().and_then(|t| t.lookup(token)) {
            return Some((user.clone(), audiences.map(<[String]>::to_vec).unwrap_or_default()));
        }
        for lookup in &self.lookups {
            if let Some(found) = lookup.user(token, audiences).await {
                return Some(found);
            }
        }
        None
    }
}

/// Kubernetes' answer to a request it cannot authenticate.
pub fn unauthorized() -> Response {
    ApiError::new(401, "Unauthorized", "Unauthorized").into_response()
}

async fn authenticate(State(authenticators): State<Arc<Authenticators>>, mut req: Request, next: Next) -> Response {
    let user = {
        let certificate = req.extensions().get::<CertificateUser>().map(|c| &c.0);
        let authorization = req.headers().get(axum::http::header::AUTHORIZATION);
        match decide(certificate, req.uri().path(), authorization, authenticators.anonymous) {
            Decision::User(user) => Ok(Some(user.clone())),
            Decision::Token(token) => authenticators.token(token, None).await.map(|(user, _)| Some(user)).ok_or(()),
            Decision::Anonymous => Ok(None),
            Decision::Unauthorized => Err(()),
        }
    };
    let Ok(user) = user else {
        tracing::debug!(path = req.uri().path(), "unauthorized request");
        return unauthorized();
    };
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

/// Put authentication in front of every route of `router` (fallback included): client
/// certificates (on the TLS listener), then the token authenticators.
pub fn layer(router: Router, authenticators: Arc<Authenticators>) -> Router {
    router.layer(middleware::from_fn_with_state(authenticators, authenticate))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "s3cr3t,admin,uid-1,\"system:masters,devs\"\n\
                        \n\
                        node-token, kubelet ,uid-2\n\
                        ,nobody,uid-3\n";

    fn auth() -> TokenAuthenticator {
        TokenAuthenticator::parse(FILE.as_bytes(), "tokens.csv").unwrap()
    }

    #[test]
    fn parses_kubernetes_token_files() {
        let a = auth();
        assert_eq!(a.len(), 2, "the empty token's line is skipped, the blank line ignored");
        assert_eq!(
            a.lookup("s3cr3t"),
            Some(&UserInfo {
                name: "admin".into(),
                uid: "uid-1".into(),
                groups: vec!["system:masters".into(), "devs".into()]
            })
        );
        let kubelet = a.lookup("node-token").unwrap();
        assert_eq!(kubelet.name, "kubelet ", "leading blanks trimmed, trailing kept (Go's csv)");
        assert!(kubelet.groups.is_empty());
    }

    #[test]
    fn unknown_and_near_tokens_are_not_found() {
        let a = auth();
        for t in ["", "s3cr3", "s3cr3t ", "S3CR3T", "s3cr3tx", "admin", "uid-1"] {
            assert_eq!(a.lookup(t), None, "{t:?}");
        }
    }

    #[test]
    fn duplicate_tokens_keep_the_last_line() {
        let a = TokenAuthenticator::parse(b"t,first,1\nt,second,2\n", "f").unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a.lookup("t").unwrap().name, "second");
    }

    #[test]
    fn short_lines_and_bad_text_are_errors() {
        let e = TokenAuthenticator::parse(b"tok,user\n", "tokens.csv").unwrap_err();
        assert_eq!(
            e.to_string(),
            "token file 'tokens.csv' must have at least 3 columns (token, user name, user uid), found 2"
        );
        assert!(TokenAuthenticator::parse(b"tok,user,uid\n\xff,user,uid\n", "f").is_err(), "not UTF-8");
    }

    #[test]
    fn bearer_header_parsing() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("  bearer abc  "), Some("abc"));
        assert_eq!(bearer_token("Bearer abc extra"), Some("abc"));
        assert_eq!(bearer_token("Bearer  "), None, "trimmed first, as Go does");
        assert_eq!(bearer_token("Bearer  abc"), Some(""));
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Basic YWRtaW4="), None);
    }

    #[test]
    fn public_paths() {
        for p in ["/healthz", "/livez", "/readyz", "/version", "/healthz/ping", "/readyz/etcd"] {
            assert!(is_public_path(p), "{p}");
        }
        for p in ["/", "/api", "/api/v1/pods", "/healthzx", "/versions", "/metrics", "/openapi/v2"] {
            assert!(!is_public_path(p), "{p}");
        }
    }

    #[test]
    fn decisions() {
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        let (bearer, wrong, empty, basic) =
            (h("Bearer s3cr3t"), h("Bearer wrong"), h("Bearer  x"), h("Basic YWRtaW46cHc="));
        let decide = |path, header| decide(None, path, header, Anonymous::PublicPaths);
        assert_eq!(decide("/api/v1/pods", Some(&bearer)), Decision::Token("s3cr3t"));
        assert_eq!(decide("/api/v1/pods", None), Decision::Unauthorized);
        assert_eq!(decide("/api/v1/pods", Some(&empty)), Decision::Unauthorized);
        assert_eq!(decide("/api/v1/pods", Some(&basic)), Decision::Unauthorized);
        assert_eq!(decide("/readyz", None), Decision::Anonymous);
        assert_eq!(decide("/version", Some(&basic)), Decision::Anonymous);
        assert_eq!(decide("/healthz", Some(&wrong)), Decision::Token("wrong"), "checked, not anonymous");
        let binary = HeaderValue::from_bytes(b"Bearer \xff").unwrap();
        assert_eq!(decide("/api", Some(&binary)), Decision::Unauthorized);
    }

    #[test]
    fn anonymous_requests_follow_the_flag_and_the_authorizer() {
        let wrong = HeaderValue::from_static("Bearer wrong");
        let everywhere = Anonymous::from_flag(true, false);
        assert_eq!(everywhere, Anonymous::Everywhere, "the authorizer decides");
        assert_eq!(decide(None, "/api/v1/secrets", None, everywhere), Decision::Anonymous);
        assert_eq!(decide(None, "/api", Some(&wrong), everywhere), Decision::Token("wrong"), "still checked");
        let off = Anonymous::from_flag(false, false);
        assert_eq!(decide(None, "/healthz", None, off), Decision::Unauthorized, "--anonymous-auth=false: health too");
        let allow_all = Anonymous::from_flag(true, true);
        assert_eq!(allow_all, Anonymous::PublicPaths, "AlwaysAllow would let anonymous do anything");
        assert_eq!(decide(None, "/api", None, allow_all), Decision::Unauthorized);
        assert_eq!(decide(None, "/livez", None, allow_all), Decision::Anonymous);
        assert_eq!(Anonymous::from_flag(false, true), Anonymous::Off);
    }

    struct Fixed;
    impl TokenUser for Fixed {
        fn user<'a>(&'a self, token: &'a str, audiences: Option<&'a [String]>) -> TokenFuture<'a> {
            let user = UserInfo { name: format!("sa-{token}"), uid: String::new(), groups: vec![] };
            let aud = audiences.map(<[String]>::to_vec).unwrap_or_default();
            Box::pin(async move { (token == "jwt").then_some((user, aud)) })
        }
    }

    #[tokio::test]
    async fn the_token_file_comes_before_service_account_tokens() {
        let both =
            Authenticators { tokens: Some(Arc::new(auth())), lookups: vec![Arc::new(Fixed)], ..Default::default() };
        assert_eq!(both.token("s3cr3t", None).await.unwrap().0.name, "admin");
        assert_eq!(both.token("jwt", None).await.unwrap().0.name, "sa-jwt");
        assert_eq!(both.token("wrong", None).await, None);
        assert_eq!(both.token("", None).await, None);
        let aud = ["vault".to_string()];
        assert_eq!(both.token("s3cr3t", Some(&aud)).await.unwrap().1, aud, "a file token is good for any audience");
        let file_only = Authenticators { tokens: Some(Arc::new(auth())), lookups: vec![], ..Default::default() };
        assert_eq!(file_only.token("jwt", None).await, None);
        let empty = Authenticators {
            tokens: Some(Arc::new(TokenAuthenticator::parse(b"", "f").unwrap())),
            ..Default::default()
        };
        assert_eq!(empty.token("x", None).await, None, "an empty file lets nobody in");
    }

    #[tokio::test]
    async fn the_layer_answers_401_status_and_passes_users() {
        use axum::body::Body;
        use axum::routing::get;
        use tower::ServiceExt;

        let router = layer(
            Router::new().route("/api", get(|| async { "api" })).route("/healthz", get(|| async { "ok" })),
            Arc::new(Authenticators { tokens: Some(Arc::new(auth())), lookups: vec![], ..Default::default() }),
        );
        let call = |path: &str, token: Option<&str>| {
            let mut req = Request::builder().uri(path);
            if let Some(t) = token {
                req = req.header("Authorization", format!("Bearer {t}"));
            }
            router.clone().oneshot(req.body(Body::empty()).unwrap())
        };
        let resp = call("/api", None).await.unwrap();
        assert_eq!(resp.status(), 401);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            status,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                               "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
        );
        assert_eq!(call("/api", Some("wrong")).await.unwrap().status(), 401);
        assert_eq!(call("/nowhere", None).await.unwrap().status(), 401, "the fallback is guarded too");
        assert_eq!(call("/api", Some("s3cr3t")).await.unwrap().status(), 200);
        assert_eq!(call("/healthz", None).await.unwrap().status(), 200);
        assert_eq!(call("/healthz", Some("wrong")).await.unwrap().status(), 401, "a failed token is not anonymous");
    }

    fn certificate(cn: &str, group: Option<&str>) -> Vec<u8> {
        let now = time::OffsetDateTime::now_utc();
        let ca = common::pki::Ca::generate(now).unwrap();
        let groups: Vec<&str> = group.into_iter().collect();
        let leaf = common::pki::Leaf::client("x", cn, &groups);
        let (pem, _) = ca.issue(&leaf, now).unwrap();
        common::pki::pem_to_der(&pem).unwrap()
    }

    #[test]
    fn a_client_certificate_names_the_user_and_its_groups() {
        assert_eq!(
            user_of_certificate(&certificate("kubernetes-admin", Some("system:masters"))),
            Some(UserInfo {
                name: "kubernetes-admin".into(),
                uid: String::new(),
                groups: vec!["system:masters".into()]
            })
        );
        let node = user_of_certificate(&certificate("system:node:n1", Some("system:nodes"))).unwrap();
        assert_eq!((node.name.as_str(), node.groups.as_slice()), ("system:node:n1", &["system:nodes".to_string()][..]));
        assert_eq!(user_of_certificate(&certificate("jane", None)).unwrap().groups, Vec::<String>::new());
        assert_eq!(user_of_certificate(&certificate("", Some("g"))), None, "no CN: nobody");
        assert_eq!(user_of_certificate(b"garbage"), None);
    }

    #[test]
    fn the_certificate_comes_before_tokens() {
        let jane = UserInfo { name: "jane".into(), uid: String::new(), groups: vec![] };
        let wrong = HeaderValue::from_static("Bearer wrong");
        let p = Anonymous::PublicPaths;
        assert_eq!(decide(Some(&jane), "/api", Some(&wrong), p), Decision::User(&jane));
        assert_eq!(decide(Some(&jane), "/api", None, p), Decision::User(&jane));
        assert_eq!(decide(None, "/api", None, p), Decision::Unauthorized);
        assert_eq!(decide(None, "/healthz", None, p), Decision::Anonymous);
    }

    #[tokio::test]
    async fn the_layer_takes_the_certificate_user_of_the_connection() {
        use axum::body::Body;
        use axum::routing::get;
        use tower::ServiceExt;

        let router = layer(
            Router::new().route(
                "/api",
                get(|req: Request| async move {
                    req.extensions().get::<UserInfo>().map(|u| u.name.clone()).unwrap_or_default()
                }),
            ),
            Arc::new(Authenticators::default()),
        );
        let mut req = Request::builder().uri("/api").body(Body::empty()).unwrap();
        req.extensions_mut().insert(CertificateUser(UserInfo {
            name: "jane".into(),
            uid: String::new(),
            groups: vec![],
        }));
        let resp = router.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(&axum::body::to_bytes(resp.into_body(), 1024).await.unwrap()[..], b"jane");
        let resp = router.oneshot(Request::builder().uri("/api").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(resp.status(), 401);
    }
}
