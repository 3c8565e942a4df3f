//! RBAC end to end: an apiserver with `--authorization-mode=Node,RBAC` and a token file of
//! an admin (`system:masters`) and a user `jane`, the controller-manager's
//! `clusterrole-aggregation` controller, and the official kubectl as each of them (through
//! a TLS front: kubectl sends tokens only over TLS). The admin binds jane to `view` in one
//! namespace; jane reads there, is refused elsewhere and on writes with Kubernetes' exact
//! message, sees her rules with `auth can-i --list`, cannot grant more than she holds; the
//! admin asks as jane through impersonation; a new aggregated role reaches `view`; the kube
//! crate gets the same 403 Status.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::controller_manager::ControllerManager;
use e2e::tls::TlsFront;
use e2e::{eventually, kubectl_bin, official_kubectls, ApiServer, KubectlOutput};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

const TOKENS: &str = "admin-token,admin,uid-admin,\"system:masters\"\njane-token,jane,uid-jane\n";

struct Cluster {
    server: ApiServer,
    dir: tempfile::TempDir,
    _cm: ControllerManager,
}

impl Cluster {
    fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, TOKENS)?;
        let server =
            ApiServer::start_with(&["--token-auth-file", &tokens.to_string_lossy(), "--authorization-mode=Node,RBAC"])?;
        let front = TlsFront::start(server.port)?;
        front.write_kubeconfig(&dir.path().join("admin"), "admin-token")?;
        front.write_kubeconfig(&dir.path().join("jane"), "jane-token")?;
        // The controller-manager authenticates as the admin (kube-rs sends tokens over HTTP).
        let plain = dir.path().join("cm");
        std::fs::write(
            &plain,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\"}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n\
                 users: [{{name: u, user: {{token: admin-token}}}}]\ncurrent-context: c\n",
                server.url()
            ),
        )?;
        let cm = ControllerManager::start(
            &server,
            &["--kubeconfig", &plain.to_string_lossy(), "--controllers", "clusterrole-aggregation"],
        )?;
        Ok(Cluster { server, dir, _cm: cm })
    }

    fn kubeconfig(&self, who: &str) -> PathBuf {
        self.dir.path().join(who)
    }

    fn kubectl_with(&self, bin: &Path, who: &str, args: &[&str]) -> Result<KubectlOutput> {
        let out = Command::new(bin)
            .arg("--kubeconfig")
            .arg(self.kubeconfig(who))
            .arg("--cache-dir")
            .arg(self.dir.path().join(format!("cache-{who}")))
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .context("running kubectl")?;
        Ok(out.into())
    }

    fn kubectl(&self, who: &str, args: &[&str]) -> Result<KubectlOutput> {
        self.kubectl_with(&kubectl_bin(), who, args)
    }

    fn admin(&self, args: &[&str]) -> Result<KubectlOutput> {
        let out = self.kubectl("admin", args)?;
        ensure!(out.ok, "admin {args:?}: {out:?}");
        Ok(out)
    }

    fn jane(&self, args: &[&str]) -> Result<KubectlOutput> {
        self.kubectl("jane", args)
    }

    /// Until `jane` may `args` (`kubectl auth can-i`): bindings reach the authorizer
    /// through its watch, and aggregated rules through the controller.
    async fn until_jane_can(&self, args: &[&str]) -> Result<()> {
        let mut full = vec!["auth", "can-i"];
        full.extend_from_slice(args);
        eventually(Duration::from_secs(30), || {
            let yes = self.jane(&full).is_ok_and(|out| out.stdout.trim() == "yes");
            async move { yes }
        })
        .await
        .with_context(|| format!("jane never got {args:?}"))
    }
}

fn kubectl_available() -> bool {
    let ok = kubectl_bin().exists();
    if !ok && std::env::var("CI").as_deref() == Ok("true") {
        panic!("the official kubectl ({}) is missing", kubectl_bin().display());
    }
    ok
}

fn forbidden(out: &KubectlOutput, message: &str) -> Result<()> {
    ensure!(!out.ok, "expected a refusal: {out:?}");
    let want = format!("Error from server (Forbidden): {message}");
    ensure!(out.stderr.lines().any(|l| l == want), "want {want:?}, got {:?}", out.stderr);
    Ok(())
}

#[tokio::test]
async fn rbac_with_the_official_kubectl_and_the_kube_crate() -> Result<()> {
    if !kubectl_available() {
        eprintln!("skipping: no kubectl");
        return Ok(());
    }
    let c = Cluster::start()?;
    c.admin(&["create", "namespace", "team"])?;
    c.admin(&["create", "rolebinding", "jane-view", "--clusterrole=view", "--user=jane", "-n", "team"])?;
    c.until_jane_can(&["get", "pods", "-n", "team"]).await?;

    // Reads in team; refusals elsewhere and on writes, in Kubernetes' words.
    let out = c.jane(&["get", "pods", "-n", "team"])?;
    ensure!(out.ok && out.stderr.contains("No resources found in team namespace."), "{out:?}");
    forbidden(
        &c.jane(&["get", "pods", "-n", "default"])?,
        r#"pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "default""#,
    )?;
    let out = c.jane(&["create", "configmap", "cfg", "-n", "team", "--from-literal=a=b"])?;
    ensure!(
        !out.ok
            && out.stderr.contains(
                r#"configmaps is forbidden: User "jane" cannot create resource "configmaps" in API group "" in the namespace "team""#
            ),
        "{out:?}"
    );
    forbidden(
        &c.jane(&["delete", "pod", "web", "-n", "team"])?,
        r#"pods "web" is forbidden: User "jane" cannot delete resource "pods" in API group "" in the namespace "team""#,
    )?;
    forbidden(
        &c.jane(&["get", "nodes"])?,
        r#"nodes is forbidden: User "jane" cannot list resource "nodes" in API group "" at the cluster scope"#,
    )?;
    forbidden(
        &c.jane(&["get", "secret", "token", "-n", "team"])?,
        r#"secrets "token" is forbidden: User "jane" cannot get resource "secrets" in API group "" in the namespace "team""#,
    )?;
    forbidden(&c.jane(&["get", "--raw", "/metrics"])?, r#"forbidden: User "jane" cannot get path "/metrics""#)?;

    // What jane may do, as kubectl lists it from a SelfSubjectRulesReview.
    let out = c.jane(&["auth", "can-i", "--list", "-n", "team"])?;
    ensure!(out.ok, "{out:?}");
    let rows: Vec<Vec<&str>> = out.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    for want in [
        vec!["pods", "[]", "[]", "[get", "list", "watch]"],
        vec!["deployments.apps", "[]", "[]", "[get", "list", "watch]"],
        vec!["selfsubjectaccessreviews.authorization.k8s.io", "[]", "[]", "[create]"],
        vec!["[/api/*]", "[]", "[get]"],
    ] {
        ensure!(rows.contains(&want), "no {want:?} in\n{}", out.stdout);
    }
    ensure!(!rows.iter().any(|r| r[0] == "secrets"), "view grants no secrets:\n{}", out.stdout);
    let out = c.jane(&["auth", "can-i", "--list", "-n", "default"])?;
    ensure!(!out.stdout.lines().any(|l| l.starts_with("pods ")), "{}", out.stdout);

    // The admin asks as jane: kubectl sends Impersonate-User.
    let out = c.kubectl("admin", &["auth", "can-i", "create", "pods", "--as=jane", "-n", "team"])?;
    ensure!(!out.ok && out.stdout.trim() == "no", "{out:?}");
    let out = c.admin(&["auth", "can-i", "list", "pods", "--as=jane", "-n", "team"])?;
    ensure!(out.stdout.trim() == "yes", "{out:?}");
    let out = c.admin(&["get", "pods", "-n", "team", "--as=jane"])?;
    ensure!(out.stderr.contains("No resources found"), "{out:?}");
    forbidden(
        &c.kubectl("admin", &["get", "pods", "-n", "default", "--as=jane"])?,
        r#"pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "default""#,
    )?;
    // jane may not impersonate.
    forbidden(
        &c.jane(&["get", "pods", "-n", "team", "--as=admin"])?,
        r#"users "admin" is forbidden: User "jane" cannot impersonate resource "users" in API group "" at the cluster scope"#,
    )?;

    // Escalation: with the right to manage roles in team, jane still cannot grant what she
    // does not hold.
    c.admin(&[
        "create",
        "role",
        "rbac-manager",
        "-n",
        "team",
        "--verb=get,list,create,update,delete",
        "--resource=roles,rolebindings",
    ])?;
    c.admin(&["create", "rolebinding", "jane-rbac", "--role=rbac-manager", "--user=jane", "-n", "team"])?;
    c.until_jane_can(&["create", "roles", "-n", "team"]).await?;
    let out = c.jane(&["create", "role", "pod-maker", "-n", "team", "--verb=create,get", "--resource=pods"])?;
    ensure!(!out.ok, "{out:?}");
    ensure!(
        out.stderr.contains(
            "Error from server (Forbidden): roles.rbac.authorization.k8s.io \"pod-maker\" is forbidden: user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"create\"]}"
        ),
        "{}",
        out.stderr
    );
    let out = c.jane(&["create", "role", "pod-reader", "-n", "team", "--verb=get,list", "--resource=pods"])?;
    ensure!(out.ok, "granting what she holds is fine: {out:?}");
    let out = c.jane(&["create", "rolebinding", "to-admin", "--clusterrole=admin", "--user=jane", "-n", "team"])?;
    ensure!(!out.ok && out.stderr.contains("is attempting to grant RBAC permissions not currently held"), "{out:?}");

    // Aggregation: a role labelled for view reaches view, and so jane.
    let extra = c.dir.path().join("extra.yaml");
    std::fs::write(
        &extra,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: secret-viewer\n  labels:\n    \
         rbac.authorization.k8s.io/aggregate-to-view: \"true\"\nrules:\n- apiGroups: [\"\"]\n  resources: [secrets]\n  \
         verbs: [get, list]\n",
    )?;
    c.admin(&["apply", "-f", &extra.to_string_lossy()])?;
    c.until_jane_can(&["list", "secrets", "-n", "team"]).await?;
    let view = c.admin(&["get", "clusterrole", "view", "-o", "jsonpath={.rules[*].resources}"])?;
    ensure!(view.stdout.contains("secrets") && view.stdout.contains("pods"), "{view:?}");
    let out = c.jane(&["get", "secrets", "-n", "team"])?;
    ensure!(out.ok, "{out:?}");

    // The kube crate (jane's token, plain HTTP) gets the same Status.
    let mut config = kube::Config::new(c.server.url().parse()?);
    config.auth_info.token = Some("jane-token".to_string().into());
    let client = kube::Client::try_from(config)?;
    let team: Api<Pod> = Api::namespaced(client.clone(), "team");
    ensure!(team.list(&ListParams::default()).await?.items.is_empty());
    let default: Api<Pod> = Api::namespaced(client, "default");
    match default.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => {
            ensure!(s.code == 403 && s.reason == "Forbidden", "{s:?}");
            ensure!(
                s.message
                    == r#"pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "default""#,
                "{s:?}"
            );
        }
        other => anyhow::bail!("expected a 403: {other:?}"),
    }

    // An older official kubectl reads the same refusal.
    for (version, bin) in official_kubectls(&["1.27"]) {
        forbidden(
            &c.kubectl_with(&bin, "jane", &["get", "deployments", "-n", "default"])?,
            r#"deployments.apps is forbidden: User "jane" cannot list resource "deployments" in API group "apps" in the namespace "default""#,
        )
        .with_context(|| format!("kubectl {version}"))?;
        let out = c.kubectl_with(&bin, "jane", &["get", "pods", "-n", "team"])?;
        ensure!(out.ok, "kubectl {version}: {out:?}");
    }
    Ok(())
}

#[test]
fn anonymous_requests_reach_only_the_public_paths() -> Result<()> {
    let forbidden_pods = r#"pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "default""#;
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, TOKENS)?;
    let tokens = tokens.to_string_lossy().into_owned();
    // Without a token file nobody is authenticated; with one, requests without credentials
    // are system:anonymous as well (--anonymous-auth defaults to true): under RBAC only the
    // health and version endpoints (system:public-info-viewer) are open, and discovery
    // (system:discovery) is for authenticated users.
    for args in [&["--authorization-mode", "RBAC"][..], &["--authorization-mode", "RBAC", "--token-auth-file", &tokens]]
    {
        let server = ApiServer::start_with(args)?;
        for path in ["/version", "/healthz", "/readyz"] {
            let r = e2e::raw(server.port, "GET", path, None, b"")?;
            ensure!(r.status == 200, "{args:?} {path}: {} {}", r.status, r.text());
        }
        let r = e2e::raw(server.port, "GET", "/api/v1/namespaces/default/pods", None, b"")?;
        ensure!(r.status == 403, "{args:?}: {} {}", r.status, r.text());
        ensure!(r.json()["message"] == forbidden_pods, "{}", r.text());
        let r = e2e::raw(server.port, "GET", "/apis", None, b"")?;
        ensure!(r.status == 403, "{args:?} discovery: {} {}", r.status, r.text());
        ensure!(r.json()["message"] == r#"forbidden: User "system:anonymous" cannot get path "/apis""#, "{}", r.text());
    }
    // --anonymous-auth=false: no credentials is 401 everywhere, health included.
    let server =
        ApiServer::start_with(&["--authorization-mode=RBAC", "--token-auth-file", &tokens, "--anonymous-auth=false"])?;
    for path in ["/healthz", "/api/v1/namespaces/default/pods"] {
        let r = e2e::raw(server.port, "GET", path, None, b"")?;
        ensure!(r.status == 401 && r.json()["reason"] == "Unauthorized", "{path}: {} {}", r.status, r.text());
    }
    Ok(())
}

/// A certificate signing request of `signer` for `cn` in `orgs`, as YAML.
fn csr_yaml(name: &str, signer: &str, cn: &str, orgs: &[&str]) -> Result<String> {
    use base64::Engine;
    let (request, _) = common::pki::new_csr(cn, orgs).map_err(|e| anyhow::anyhow!("{e}"))?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(request);
    Ok(format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\n\
         spec: {{signerName: {signer}, usages: [client auth], request: {b64}}}\n"
    ))
}

#[tokio::test]
async fn approving_a_certificate_needs_the_signer_s_approve_permission() -> Result<()> {
    if !kubectl_available() {
        eprintln!("skipping: no kubectl");
        return Ok(());
    }
    let c = Cluster::start()?;
    let file = c.dir.path().join("csr.yaml");
    // jane may write requests and their approval, but holds no signer.
    c.admin(&[
        "create",
        "clusterrole",
        "csr-writer",
        "--verb=get,list,create,update",
        "--resource=certificatesigningrequests,certificatesigningrequests/approval",
    ])?;
    c.admin(&["create", "clusterrolebinding", "jane-csr", "--clusterrole=csr-writer", "--user=jane"])?;
    c.until_jane_can(&["update", "certificatesigningrequests", "--subresource=approval"]).await?;
    std::fs::write(&file, csr_yaml("jane-x", "example.com/x", "jane", &["devs"])?)?;
    let out = c.jane(&["create", "-f", &file.to_string_lossy()])?;
    ensure!(out.ok, "{out:?}");
    let out = c.jane(&["certificate", "approve", "jane-x"])?;
    forbidden(
        &out,
        r#"certificatesigningrequests.certificates.k8s.io "jane-x" is forbidden: user not permitted to approve requests with signerName "example.com/x""#,
    )?;
    // `approve` on the signer's domain (`example.com/*`) is enough.
    // (`signers` is no served resource, so the role comes from YAML, as upstream documents it.)
    let role = c.dir.path().join("approver.yaml");
    std::fs::write(
        &role,
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: example-approver}\n\
         rules: [{apiGroups: [certificates.k8s.io], resources: [signers], verbs: [approve], resourceNames: ['example.com/*']}]\n",
    )?;
    c.admin(&["apply", "-f", &role.to_string_lossy()])?;
    c.admin(&["create", "clusterrolebinding", "jane-approver", "--clusterrole=example-approver", "--user=jane"])?;
    let sar = c.dir.path().join("sar.yaml");
    std::fs::write(
        &sar,
        "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec: {user: jane, resourceAttributes: \
         {group: certificates.k8s.io, resource: signers, verb: approve, name: 'example.com/*'}}\n",
    )?;
    eventually(Duration::from_secs(30), || {
        let allowed = c
            .admin(&["create", "-f", &sar.to_string_lossy(), "-o", "jsonpath={.status.allowed}"])
            .is_ok_and(|out| out.stdout.trim() == "true");
        async move { allowed }
    })
    .await
    .context("the approver binding never reached the authorizer")?;
    let out = c.jane(&["certificate", "approve", "jane-x"])?;
    ensure!(out.ok && out.stdout.contains("approved"), "{out:?}");
    // Issuing needs `sign`: jane may update the status but holds no signer for it.
    c.admin(&[
        "create",
        "clusterrole",
        "csr-status",
        "--verb=get,update,patch",
        "--resource=certificatesigningrequests/status",
    ])?;
    c.admin(&["create", "clusterrolebinding", "jane-status", "--clusterrole=csr-status", "--user=jane"])?;
    c.until_jane_can(&["patch", "certificatesigningrequests", "--subresource=status"]).await?;
    let (cert, _) = {
        use base64::Engine;
        let now = time::OffsetDateTime::now_utc();
        let ca = common::pki::Ca::generate(now).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (cert, key) =
            ca.issue(&common::pki::Leaf::client("x", "jane", &["devs"]), now).map_err(|e| anyhow::anyhow!("{e}"))?;
        (base64::engine::general_purpose::STANDARD.encode(cert), key)
    };
    let patch = format!(r#"{{"status":{{"certificate":"{cert}"}}}}"#);
    let out = c.jane(&["patch", "csr", "jane-x", "--subresource=status", "--type=merge", "-p", &patch])?;
    forbidden(
        &out,
        r#"certificatesigningrequests.certificates.k8s.io "jane-x" is forbidden: user not permitted to sign requests with signerName "example.com/x""#,
    )?;
    // Nobody, the admin included, asks the apiserver-client signer for system:masters.
    std::fs::write(&file, csr_yaml("masters", "kubernetes.io/kube-apiserver-client", "eve", &["system:masters"])?)?;
    let out = c.kubectl("admin", &["create", "-f", &file.to_string_lossy()])?;
    let want = format!(
        r#"error when creating "{}": certificatesigningrequests.certificates.k8s.io "masters" is forbidden: use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"#,
        file.display()
    );
    forbidden(&out, &want)?;
    Ok(())
}
