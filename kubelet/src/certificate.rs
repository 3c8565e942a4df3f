//! The kubelet's certificates from the cluster's signers, and their rotation (Kubernetes'
//! certificate manager):
//!
//! - the client certificate (`--rotate-certificates`): `system:node:<name>` in
//!   `system:nodes` from the `kubernetes.io/kube-apiserver-client-kubelet` signer; the node
//!   asks for its renewal itself, which `csrapproving` approves (`selfnodeclient`);
//! - the serving certificate (`--rotate-server-certificates`): the same subject with the
//!   node's name and address as alternative names from `kubernetes.io/kubelet-serving`, so
//!   that the apiserver can verify the kubelet it calls (`--kubelet-certificate-authority`).
//!   Kubernetes approves no such request by itself; a person does (`kubectl certificate
//!   approve`), or the controller-manager's opt-in `kubelet-serving-csr-approving`. Until
//!   the first one is issued the kubelet's port completes no handshake, as upstream.
//!
//! A certificate is renewed at a random point between 70% and 90% of its lifetime
//! ([`rotation_deadline`], pure); the new one replaces the old in a shared
//! [`common::identity::Identity`] (new connections use it at once) and is written where a
//! restarted kubelet finds it (the kubeconfig, or `kubelet-server-current.pem` in
//! `--cert-dir`). A failed request is retried with backoff; the old certificate is used
//! meanwhile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use common::identity::Identity;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{AuthInfo, Kubeconfig, NamedAuthInfo, NamedContext};

/// The signer of kubelets' client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of kubelets' serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// How long to wait for a certificate (Kubernetes' kubelet waits an hour too).
const WAIT: Duration = Duration::from_secs(3600);

/// What to ask a signer for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub signer: &'static str,
    pub common_name: String,
    pub organizations: Vec<String>,
    /// DNS names and IP addresses (serving certificates).
    pub names: Vec<String>,
    pub usages: Vec<&'static str>,
}

impl Wanted {
    /// A kubelet client certificate for `node`.
    pub fn client(node: &str) -> Wanted {
        Wanted {
            signer: CLIENT_SIGNER,
            common_name: format!("system:node:{node}"),
            organizations: vec!["system:nodes".into()],
            names: vec![],
            usages: vec!["digital signature", "client auth"],
        }
    }

    /// A kubelet serving certificate for `node`, valid for `names`.
    pub fn serving(node: &str, names: &[String]) -> Wanted {
        Wanted {
            signer: SERVING_SIGNER,
            common_name: format!("system:node:{node}"),
            organizations: vec!["system:nodes".into()],
            names: names.to_vec(),
            usages: vec!["digital signature", "server auth"],
        }
    }
}

/// When to renew a certificate valid from `not_before` to `not_after` (Unix seconds):
/// between 70% and 90% of its lifetime, where `jitter` (0..1) says. `received`, when the
/// kubelet got the certificate itself, counts as the start instead of an earlier
/// `not_before`: signers backdate certificates (by five minutes), and a short-lived one
/// would otherwise be due again the moment it arrives.
pub fn rotation_deadline(not_before: i64, not_after: i64, received: Option<i64>, jitter: f64) -> i64 {
    let start = received.map_or(not_before, |r| r.max(not_before));
    let lifetime = (not_after - start).max(0) as f64;
    start + (lifetime * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// Ask `client`'s user's signer for a certificate and wait until it is issued: the
/// certificate and its new key (PEM). A denied or failed request is an error.
pub async fn request(client: &kube::Client, wanted: &Wanted) -> Result<(String, String)> {
    let orgs: Vec<&str> = wanted.organizations.iter().map(String::as_str).collect();
    let (request, key) = common::pki::new_csr_with_names(&wanted.common_name, &orgs, &wanted.names)?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta { generate_name: Some("csr-".into()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: wanted.signer.into(),
            usages: Some(wanted.usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let created = api.create(&PostParams::default(), &csr).await.context("creating the certificate signing request")?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, signer = wanted.signer, subject = %wanted.common_name,
        "asked for a certificate; waiting for it to be approved and issued");
    let deadline = tokio::time::Instant::now() + WAIT;
    let cert = loop {
        let csr = api.get(&name).await.with_context(|| format!("reading certificate signing request {name}"))?;
        let status = csr.status.unwrap_or_default();
        for c in status.conditions.iter().flatten() {
            if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
                bail!(
                    "certificate signing request {name} was {}: {}",
                    if c.type_ == "Denied" { "denied" } else { "not signed" },
                    c.message.clone().unwrap_or_default()
                );
            }
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            break String::from_utf8(cert.0).context("the issued certificate is not text")?;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("certificate signing request {name} was not issued within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    tracing::info!(csr = %name, signer = wanted.signer, "got a certificate");
    Ok((cert, key))
}

/// `kubeconfig` (its first cluster) with its user replaced by a client certificate (PEM) and
/// key.
pub fn with_certificate(mut bootstrap: Kubeconfig, cert_pem: &str, key_pem: &str) -> Kubeconfig {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = NamedAuthInfo {
        name: "default-auth".into(),
        auth_info: Some(AuthInfo {
            client_certificate_data: Some(b64(cert_pem)),
            client_key_data: Some(b64(key_pem).into()),
            ..Default::default()
        }),
        other: Default::default(),
    };
    let cluster = bootstrap.clusters.first().map(|c| c.name.clone()).unwrap_or_default();
    bootstrap.auth_infos = vec![user];
    bootstrap.contexts = vec![NamedContext {
        name: "default-context".into(),
        context: Some(kube::config::Context { cluster, user: Some("default-auth".into()), ..Default::default() }),
        other: Default::default(),
    }];
    bootstrap.current_context = Some("default-context".into());
    bootstrap.clusters.truncate(1);
    bootstrap
}

/// Where a new certificate is kept for the next start.
pub enum Store {
    /// In the kubeconfig (its user's client-certificate-data and client-key-data).
    Kubeconfig(PathBuf),
    /// Certificate and key in one PEM file (`kubelet-server-current.pem`).
    Pem(PathBuf),
}

impl Store {
    fn save(&self, cert: &str, key: &str) -> Result<()> {
        match self {
            Store::Kubeconfig(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                let text = serde_json::to_string_pretty(&with_certificate(kc, cert, key))?;
                common::write_private(path, text.as_bytes())
            }
            Store::Pem(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                }
                common::write_private(path, format!("{cert}{key}").as_bytes())
            }
        }
    }
}

/// The identity a PEM file holding a certificate (chain) and its key makes, if the
/// certificate has not expired at `now` (Unix seconds).
pub fn saved_identity(text: &str, now: i64) -> Option<Arc<Identity>> {
    // One text serves as both: each parse takes only its own kind of PEM section.
    Identity::from_pem(text, text).ok().filter(|id| id.certificate().is_some_and(|c| c.not_after > now))
}

/// The client certificate and key (PEM) a kubeconfig's user holds, inline or in files.
pub fn identity_of(user: &AuthInfo) -> Option<(String, String)> {
    use base64::Engine;
    use secrecy::ExposeSecret;
    let decode = |b64: &str| {
        base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok().and_then(|b| String::from_utf8(b).ok())
    };
    let cert = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => decode(data)?,
        (None, Some(path)) => std::fs::read_to_string(path).ok()?,
        _ => return None,
    };
    let key = match (&user.client_key_data, &user.client_key) {
        (Some(data), _) => decode(data.expose_secret())?,
        (None, Some(path)) => std::fs::read_to_string(path).ok()?,
        _ => return None,
    };
    Some((cert, key))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// Keep `identity` renewed from `wanted`'s signer for good, asking with `client`'s user;
/// each new certificate is also saved to `store`. An identity without a certificate asks at
/// once.
pub async fn rotate(client: kube::Client, identity: Arc<Identity>, wanted: Wanted, store: Store) {
    let mut backoff = Duration::from_secs(1);
    let mut received = None;
    loop {
        if let Some(info) = identity.certificate() {
            let deadline = rotation_deadline(info.not_before, info.not_after, received, rand::random::<f64>());
            let wait = (deadline - unix_now()).max(0) as u64;
            tracing::info!(
                signer = wanted.signer,
                expires = info.not_after,
                in_seconds = wait,
                "certificate rotation scheduled"
            );
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
        loop {
            let result = async {
                let (cert, key) = request(&client, &wanted).await?;
                identity.set(&cert, &key).context("the issued certificate")?;
                store.save(&cert, &key)
            }
            .await;
            match result {
                Ok(()) => {
                    backoff = Duration::from_secs(1);
                    received = Some(unix_now());
                    tracing::info!(signer = wanted.signer, "rotated the certificate");
                    break;
                }
                Err(e) => {
                    tracing::warn!(signer = wanted.signer, error = %format!("{e:#}"), retry_in = ?backoff,
                        "certificate rotation failed; the current certificate stays in use");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(300));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_falls_between_70_and_90_percent_of_the_lifetime() {
        assert_eq!(rotation_deadline(1000, 2000, None, 0.0), 1700);
        assert_eq!(rotation_deadline(1000, 2000, None, 1.0), 1900);
        assert_eq!(rotation_deadline(1000, 2000, None, 0.5), 1800);
        assert_eq!(rotation_deadline(1000, 2000, None, 7.0), 1900, "jitter is clamped");
        assert_eq!(rotation_deadline(2000, 1000, None, 0.5), 2000, "an inverted validity renews at once");
        // A one-minute certificate backdated by five: due 42 s after it arrived, not at once.
        assert_eq!(rotation_deadline(700, 1060, Some(1000), 0.0), 1042);
        assert_eq!(rotation_deadline(1000, 2000, Some(900), 0.0), 1700, "received before not_before");
    }

    #[test]
    fn the_serving_request_names_the_node() {
        let w = Wanted::serving("n1", &["n1".into(), "10.0.0.5".into()]);
        assert_eq!((w.signer, w.common_name.as_str()), (SERVING_SIGNER, "system:node:n1"));
        assert_eq!(w.usages, ["digital signature", "server auth"]);
        let c = Wanted::client("n1");
        assert_eq!((c.signer, c.usages.as_slice()), (CLIENT_SIGNER, &["digital signature", "client auth"][..]));
        // The request has the names as alternative names.
        let orgs: Vec<&str> = w.organizations.iter().map(String::as_str).collect();
        let (pem, _) = common::pki::new_csr_with_names(&w.common_name, &orgs, &w.names).unwrap();
        let info = common::pki::parse_csr(pem.as_bytes()).unwrap();
        assert_eq!((info.dns_names, info.ip_addresses), (vec!["n1".to_string()], vec!["10.0.0.5".to_string()]));
    }

    #[test]
    fn a_saved_pair_is_loaded_until_it_expires() {
        let now = common::pki::now();
        let ca = common::pki::Ca::generate(now).unwrap();
        let (cert, key) = ca.issue(&common::pki::Leaf::client("k", "system:node:n1", &[]), now).unwrap();
        let t = now.unix_timestamp();
        for text in [format!("{cert}{key}"), format!("{key}{cert}")] {
            let id = saved_identity(&text, t).unwrap();
            assert_eq!(id.certificate().unwrap().common_name, "system:node:n1");
        }
        assert!(saved_identity(&format!("{cert}{key}"), t + 400 * 24 * 3600).is_none(), "expired");
        assert!(saved_identity("junk", t).is_none());
        assert!(saved_identity(&cert, t).is_none(), "no key");
    }
}
