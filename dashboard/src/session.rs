//! Who the person at the browser is: the credential they logged in with, and the kube
//! client that carries it.
//!
//! The dashboard has no identity of its own. A person logs in with a bearer token or with
//! a kubeconfig (its current context's user: a token, or an embedded client certificate
//! and key); the dashboard keeps that credential in memory, in a session named by a random
//! cookie, and sends every API request of that session with it, so the apiserver
//! authenticates and authorizes the person (RBAC applies to them, not to the dashboard).
//! The cluster (its URL and the CA that verifies it) comes from the dashboard's own flags:
//! a kubeconfig's `server` is never followed.
//!
//! A session ends when the person logs out, when it has been idle for `--token-ttl`, or
//! when the apiserver refuses its credential (an expired token, a revoked certificate).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::config::{AuthInfo, Kubeconfig};
use serde::{Deserialize, Serialize};

/// The cookie that names a session.
pub const COOKIE: &str = "minik8s_dashboard";

/// What a person logs in with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    Token(String),
    /// A client certificate and its key, each base64 of PEM (as a kubeconfig embeds them).
    Certificate {
        cert_data: String,
        key_data: String,
    },
}

/// The body of `POST /login`.
#[derive(Debug, Default, Deserialize)]
pub struct LoginRequest {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub kubeconfig: Option<String>,
}

/// Why a login cannot even be tried; the message is for the person.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LoginError(pub String);

fn refuse(msg: impl Into<String>) -> LoginError {
    LoginError(msg.into())
}

/// The credential a login request carries.
pub fn credential(req: &LoginRequest) -> Result<Credential, LoginError> {
    let token = req.token.as_deref().map(|t| {
        let t = t.trim();
        t.strip_prefix("Bearer ").unwrap_or(t).trim()
    });
    let token = token.filter(|t| !t.is_empty());
    let kubeconfig = req.kubeconfig.as_deref().filter(|k| !k.trim().is_empty());
    match (token, kubeconfig) {
        (Some(_), Some(_)) => Err(refuse("give a token or a kubeconfig, not both")),
        (Some(t), None) if t.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            Err(refuse("a token is one word: no spaces or line breaks inside it"))
        }
        (Some(t), None) => Ok(Credential::Token(t.to_string())),
        (None, Some(k)) => from_kubeconfig(k),
        (None, None) => Err(refuse("give a token or a kubeconfig")),
    }
}

/// The credential of a kubeconfig's current context's user.
pub fn from_kubeconfig(text: &str) -> Result<Credential, LoginError> {
    let config = Kubeconfig::from_yaml(text).map_err(|e| refuse(format!("this is not a kubeconfig: {e}")))?;
    let context_name = config
        .current_context
        .clone()
        .or_else(|| (config.contexts.len() == 1).then(|| config.contexts[0].name.clone()))
        .ok_or_else(|| refuse("the kubeconfig has no current-context"))?;
    let context = config
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| refuse(format!("the kubeconfig has no context {context_name:?}")))?;
    let user_name = context.user.clone().unwrap_or_default();
    let user = config
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .and_then(|u| u.auth_info.as_ref())
        .ok_or_else(|| refuse(format!("the kubeconfig has no user {user_name:?} (of context {context_name:?})")))?;
    of_auth_info(&user_name, user)
}

fn of_auth_info(name: &str, user: &AuthInfo) -> Result<Credential, LoginError> {
    use secrecy::ExposeSecret;
    let flatten = "the dashboard cannot read files or run programs on your machine: embed the \
                   credential (kubectl config view --raw --flatten --minify) or log in with a token";
    if let Some(t) = &user.token {
        return Ok(Credential::Token(t.expose_secret().trim().to_string()));
    }
    if let (Some(cert), Some(key)) = (&user.client_certificate_data, &user.client_key_data) {
        return Ok(Credential::Certificate { cert_data: cert.clone(), key_data: key.expose_secret().to_string() });
    }
    if user.token_file.is_some() || user.client_certificate.is_some() || user.client_key.is_some() {
        return Err(refuse(format!("the kubeconfig's user {name:?} names files for its credential; {flatten}")));
    }
    if user.exec.is_some() || user.auth_provider.is_some() {
        return Err(refuse(format!("the kubeconfig's user {name:?} gets its credential from a plugin; {flatten}")));
    }
    if user.username.is_some() {
        return Err(refuse(format!(
            "the kubeconfig's user {name:?} has a user name and password; the cluster does not accept basic authentication"
        )));
    }
    Err(refuse(format!("the kubeconfig's user {name:?} has no token and no client certificate")))
}

/// The cluster every session talks to (from the dashboard's flags).
#[derive(Clone, Debug)]
pub struct Cluster {
    pub url: http::Uri,
    /// DER certificates that verify the apiserver.
    pub roots: Vec<Vec<u8>>,
}

/// A kube client configuration: the cluster's address and CA, the person's credential.
pub fn config(cluster: &Cluster, credential: &Credential) -> kube::Config {
    let mut config = kube::Config::new(cluster.url.clone());
    config.root_cert = Some(cluster.roots.clone());
    // Watches and followed logs go on as long as the page reads them.
    config.read_timeout = None;
    match credential {
        Credential::Token(t) => config.auth_info.token = Some(t.clone().into()),
        Credential::Certificate { cert_data, key_data } => {
            config.auth_info.client_certificate_data = Some(cert_data.clone());
            config.auth_info.client_key_data = Some(key_data.clone().into());
        }
    }
    config
}

/// Who the apiserver says the person is (a SelfSubjectReview's `status.userInfo`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct User {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A logged-in person.
pub struct Session {
    pub client: kube::Client,
    pub user: User,
    last_used: Mutex<Instant>,
}

/// The sessions of this dashboard process (they end with it: a restart logs everyone out).
pub struct Sessions {
    by_id: Mutex<HashMap<String, Arc<Session>>>,
    ttl: Duration,
}

impl Sessions {
    /// Sessions that end after `ttl` without a request (zero: never).
    pub fn new(ttl: Duration) -> Sessions {
        Sessions { by_id: Mutex::new(HashMap::new()), ttl }
    }

    /// A new session; its id (the cookie's value).
    pub fn open(&self, client: kube::Client, user: User) -> String {
        let id: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        let session = Arc::new(Session { client, user, last_used: Mutex::new(Instant::now()) });
        let mut map = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, s| !self.expired(s, now));
        map.insert(id.clone(), session);
        crate::metrics::sessions(map.len());
        id
    }

    fn expired(&self, s: &Session, now: Instant) -> bool {
        let last = *s.last_used.lock().unwrap_or_else(|e| e.into_inner());
        !self.ttl.is_zero() && now.duration_since(last) > self.ttl
    }

    /// The live session named `id`, marked used now.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        let mut map = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let s = map.get(id)?.clone();
        if self.expired(&s, now) {
            map.remove(id);
            crate::metrics::sessions(map.len());
            return None;
        }
        *s.last_used.lock().unwrap_or_else(|e| e.into_inner()) = now;
        Some(s)
    }

    pub fn close(&self, id: &str) {
        let mut map = self.by_id.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(id);
        crate::metrics::sessions(map.len());
    }
}

/// The session id in a `Cookie` header.
pub fn cookie_value(header: &str) -> Option<&str> {
    header.split(';').filter_map(|kv| kv.trim().split_once('=')).find(|(k, _)| *k == COOKIE).map(|(_, v)| v)
}

/// The `Set-Cookie` that names session `id` (empty `id`: ends it).
pub fn set_cookie(id: &str, secure: bool) -> String {
    let expire = if id.is_empty() { "; Max-Age=0" } else { "" };
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict{secure}{expire}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://elsewhere:6443'}}\n\
             users:\n- name: u\n  user: {user}\ncontexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\n\
             current-context: ctx\n"
        )
    }

    fn login(token: Option<&str>, kubeconfig: Option<&str>) -> Result<Credential, LoginError> {
        credential(&LoginRequest { token: token.map(Into::into), kubeconfig: kubeconfig.map(Into::into) })
    }

    #[test]
    fn tokens_and_kubeconfig_users() {
        assert_eq!(login(Some(" abc.def \n"), None), Ok(Credential::Token("abc.def".into())));
        assert_eq!(login(Some("Bearer abc"), None), Ok(Credential::Token("abc".into())));
        assert_eq!(login(Some("a b"), None).unwrap_err().0, "a token is one word: no spaces or line breaks inside it");
        assert_eq!(login(None, None).unwrap_err().0, "give a token or a kubeconfig");
        assert_eq!(login(Some("t"), Some("x")).unwrap_err().0, "give a token or a kubeconfig, not both");
        assert_eq!(login(None, Some(&kubeconfig("{token: s3cret}"))), Ok(Credential::Token("s3cret".into())));
        assert_eq!(
            login(None, Some(&kubeconfig("{client-certificate-data: Q0VSVA==, client-key-data: S0VZ}"))),
            Ok(Credential::Certificate { cert_data: "Q0VSVA==".into(), key_data: "S0VZ".into() })
        );
    }

    #[test]
    fn kubeconfigs_that_cannot_log_in_say_why() {
        let err = |user: &str| login(None, Some(&kubeconfig(user))).unwrap_err().0;
        assert!(err("{client-certificate: /a.crt, client-key: /a.key}").contains("names files"), "{}", err("{}"));
        assert!(err("{exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}").contains("plugin"));
        assert!(err("{username: a, password: b}").contains("basic authentication"));
        assert_eq!(err("{}"), "the kubeconfig's user \"u\" has no token and no client certificate");
        let e = login(None, Some("[not, a, kubeconfig]")).unwrap_err().0;
        assert!(e.starts_with("this is not a kubeconfig"), "{e}");
        let e = login(None, Some(&kubeconfig("{token: x}").replace("current-context: ctx", "current-context: nope")))
            .unwrap_err()
            .0;
        assert_eq!(e, "the kubeconfig has no context \"nope\"");
    }

    #[test]
    fn the_cluster_comes_from_the_dashboard_not_the_kubeconfig() {
        let cluster = Cluster { url: "https://127.0.0.1:6443".parse().unwrap(), roots: vec![vec![1, 2]] };
        let c = config(&cluster, &Credential::Token("t".into()));
        assert_eq!(c.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(c.root_cert, Some(vec![vec![1, 2]]));
        assert!(c.read_timeout.is_none());
    }

    #[test]
    fn cookies() {
        assert_eq!(cookie_value("a=b; minik8s_dashboard=abc; c=d"), Some("abc"));
        assert_eq!(cookie_value("a=b"), None);
        assert_eq!(set_cookie("x", true), "minik8s_dashboard=x; Path=/; HttpOnly; SameSite=Strict; Secure");
        assert_eq!(set_cookie("", false), "minik8s_dashboard=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    }
}
