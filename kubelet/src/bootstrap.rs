//! TLS bootstrapping: a node that joins with a bootstrap token gets its own client
//! certificate. With `--bootstrap-kubeconfig`, when `--kubeconfig` is missing (or its
//! certificate has expired), the kubelet makes a key, asks for a certificate for
//! `system:node:<name>` in `system:nodes` with a CertificateSigningRequest of the
//! `kubernetes.io/kube-apiserver-client-kubelet` signer (as the bootstrap identity), waits
//! until it is issued (the controller-manager's `csrapproving` approves it when the
//! bootstrap token may ask, `csrsigning` signs it), and writes `--kubeconfig`: the bootstrap
//! kubeconfig's server and CA with the new certificate and key. From then on the kubelet
//! is `system:node:<name>`, which the Node authorizer limits to its own node.
//!
//! [`needs_certificate`] is the decision (pure); [`bootstrap`] is the shell.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{AuthInfo, Kubeconfig, NamedAuthInfo, NamedContext};

/// The signer of kubelets' client certificates.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// How long to wait for the certificate (Kubernetes' kubelet waits an hour too).
const WAIT: Duration = Duration::from_secs(3600);

/// Whether a kubeconfig (its text, if the file exists) needs a new client certificate:
/// missing, unreadable, or holding a certificate that expires before `now` (Unix seconds).
/// A kubeconfig with another kind of credential (a token) is used as it is.
pub fn needs_certificate(kubeconfig: Option<&str>, now: i64) -> bool {
    let Some(text) = kubeconfig else { return true };
    let Ok(kc) = Kubeconfig::from_yaml(text) else { return true };
    let Some(user) = kc.auth_infos.first().and_then(|a| a.auth_info.as_ref()) else { return true };
    let Some(data) = user.client_certificate_data.as_deref() else {
        return user.token.is_none() && user.client_certificate.is_none();
    };
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default();
    let der = common::pki::pem_to_der(&String::from_utf8_lossy(&pem));
    !der.and_then(|d| common::pki::inspect(&d).ok()).is_some_and(|info| info.not_after > now)
}

/// `bootstrap` with its user replaced by a client certificate (PEM) and key.
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

/// Make sure `kubeconfig` holds a valid client certificate of `node`, asking for one with
/// the identity of `bootstrap_kubeconfig` when it does not.
pub async fn bootstrap(kubeconfig: &Path, bootstrap_kubeconfig: &Path, node: &str, server: Option<&str>) -> Result<()> {
    let current = std::fs::read_to_string(kubeconfig).ok();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64)?;
    if !needs_certificate(current.as_deref(), now) {
        return Ok(());
    }
    let boot = Kubeconfig::read_from(bootstrap_kubeconfig)
        .with_context(|| format!("reading --bootstrap-kubeconfig {}", bootstrap_kubeconfig.display()))?;
    let client = common::client(Some(bootstrap_kubeconfig), server).await?;
    let (request, key) = common::pki::new_csr(&format!("system:node:{node}"), &["system:nodes"])?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta { generate_name: Some("node-csr-".into()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let created = api.create(&PostParams::default(), &csr).await.context("creating the certificate signing request")?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, node, "asked for a client certificate; waiting for it to be approved and issued");
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
    let out = with_certificate(boot, &cert, &key);
    let text = serde_json::to_string_pretty(&out)?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    common::write_private(kubeconfig, text.as_bytes())?;
    tracing::info!(csr = %name, kubeconfig = %kubeconfig.display(), "got a client certificate");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_expired_certificate_is_asked_for_and_a_token_is_kept() {
        let now = common::pki::now();
        let ca = common::pki::Ca::generate(now).unwrap();
        let (cert, key) = ca.issue(&common::pki::Leaf::client("k", "system:node:n1", &["system:nodes"]), now).unwrap();
        let boot = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443', certificate-authority-data: Zm9v}}]\n\
             users: [{name: b, user: {token: abcdef.0123456789abcdef}}]\ncontexts: [{name: x, context: {cluster: c, user: b}}]\ncurrent-context: x\n",
        )
        .unwrap();
        let good = serde_json::to_string(&with_certificate(boot.clone(), &cert, &key)).unwrap();
        let t = now.unix_timestamp();
        assert!(!needs_certificate(Some(&good), t));
        assert!(needs_certificate(Some(&good), t + 400 * 24 * 3600), "expired");
        assert!(needs_certificate(None, t) && needs_certificate(Some("not yaml: ["), t));
        let token = serde_json::to_string(&boot).unwrap();
        assert!(!needs_certificate(Some(&token), t), "a token kubeconfig is used as it is");
        // The new kubeconfig keeps the server and CA, and names the certificate's user.
        let kc = Kubeconfig::from_yaml(&good).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Zm9v"));
        assert_eq!(kc.current_context.as_deref(), Some("default-context"));
        assert!(kc.auth_infos[0].auth_info.as_ref().unwrap().token.is_none());
    }
}
