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
//! [`needs_certificate`] is the decision (pure); [`bootstrap`] is the shell (the request
//! itself is [`crate::certificate::request`]'s).

use std::path::Path;

use anyhow::{Context, Result};
use kube::config::Kubeconfig;

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
    let (cert, key) = crate::certificate::request(&client, &crate::certificate::Wanted::client(node)).await?;
    let out = crate::certificate::with_certificate(boot, &cert, &key);
    let text = serde_json::to_string_pretty(&out)?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    common::write_private(kubeconfig, text.as_bytes())?;
    tracing::info!(kubeconfig = %kubeconfig.display(), "got a client certificate");
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
        let good = serde_json::to_string(&crate::certificate::with_certificate(boot.clone(), &cert, &key)).unwrap();
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
