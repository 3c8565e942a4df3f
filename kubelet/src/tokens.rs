//! ServiceAccount tokens for projected `serviceAccountToken` volume sources (the kubelet's
//! token manager): each (pod, service account, audience, lifetime) gets a token from the
//! TokenRequest API, bound to the pod, and keeps it until 80% of its lifetime has passed or
//! it is a day old — then the next sync of the pod fetches a new one and rewrites the file,
//! so a container always reads a valid token. Deciding when is pure ([`needs_refresh`]).

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};

/// What a token is for.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Key {
    pub namespace: String,
    pub service_account: String,
    pub pod_uid: String,
    /// Empty: the apiserver's own audience.
    pub audience: String,
    pub expiration_seconds: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub token: String,
    /// Seconds since the epoch.
    pub issued: i64,
    pub expires: i64,
}

/// Kubernetes' kubelet refreshes after 80% of a token's lifetime, or after 24 h.
pub fn needs_refresh(t: &Token, now: i64) -> bool {
    let ttl = (t.expires - t.issued).max(0);
    now >= t.issued + ttl * 8 / 10 || now >= t.issued + 24 * 3600
}

#[derive(Default)]
pub struct Manager {
    cache: Mutex<HashMap<Key, Token>>,
}

impl Manager {
    /// The token for `key`, requested when there is none or it is due.
    pub async fn get(&self, client: &kube::Client, pod: &Pod, key: &Key) -> anyhow::Result<String> {
        let now = jiff::Timestamp::now().as_second();
        if let Some(t) = self.cache.lock().ok().and_then(|c| c.get(key).cloned()) {
            if !needs_refresh(&t, now) {
                return Ok(t.token);
            }
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(if key.audience.is_empty() { vec![] } else { vec![key.audience.clone()] }),
                expiration_seconds: Some(key.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &key.namespace);
        let answer =
            api.create_token_request(&key.service_account, &PostParams::default(), &request).await.with_context(
                || format!("requesting a token of service account {}/{}", key.namespace, key.service_account),
            )?;
        let status = answer.status.context("the TokenRequest answer has no status")?;
        let token = status.token.context("the TokenRequest answer has no token")?;
        let expires = status.expiration_timestamp.map_or(now, |t| t.0.as_second());
        let t = Token { token, issued: now, expires };
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key.clone(), t.clone());
        }
        Ok(t.token)
    }

    /// Forget the tokens of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|k, _| k.pod_uid != uid);
        }
    }
}

/// The token sources of a pod's projected volumes: (audience, expirationSeconds).
pub fn sources(pod: &Pod) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
        for s in v.projected.as_ref().and_then(|p| p.sources.as_ref()).into_iter().flatten() {
            if let Some(t) = &s.service_account_token {
                let key = (t.audience.clone().unwrap_or_default(), t.expiration_seconds.unwrap_or(3600));
                if !out.contains(&key) {
                    out.push(key);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_at_eighty_percent_or_after_a_day() {
        let t = Token { token: "t".into(), issued: 1_000, expires: 1_000 + 3607 };
        assert!(!needs_refresh(&t, 1_000 + 2_884));
        assert!(needs_refresh(&t, 1_000 + 2_885));
        let long = Token { token: "t".into(), issued: 0, expires: 365 * 24 * 3600 };
        assert!(!needs_refresh(&long, 24 * 3600 - 1));
        assert!(needs_refresh(&long, 24 * 3600));
    }

    #[test]
    fn token_sources_are_found_once_each() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": [], "volumes": [
            {"name": "a", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}},
            {"name": "b", "projected": {"sources": [
                {"serviceAccountToken": {"path": "vault", "audience": "vault", "expirationSeconds": 600}},
                {"serviceAccountToken": {"path": "again", "expirationSeconds": 3607}}]}},
            {"name": "c", "emptyDir": {}}]}}))
        .unwrap();
        assert_eq!(sources(&pod), vec![(String::new(), 3607), ("vault".to_string(), 600)]);
    }
}
