//! The tenant proxy for end-to-end tests and benchmarks: `tenant-proxy` built once, its PKI
//! in a temporary directory, started in front of a test apiserver with the apiserver's admin
//! identity, and kubeconfigs for tenants' users.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{free_port, workspace_bin, ApiServer};

/// `tenant-proxy`, built once per test process (`MINIK8S_TENANT_PROXY_BIN` overrides it).
pub fn tenant_proxy_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("tenant-proxy", "MINIK8S_TENANT_PROXY_BIN")).clone()
}

pub struct TenantProxy {
    child: Option<Child>,
    pub port: u16,
    pub health_port: u16,
    pub dir: tempfile::TempDir,
    admin: PathBuf,
}

impl TenantProxy {
    /// Start in front of `api` (started with `start_tls`), acting as its admin.
    pub fn start(api: &ApiServer) -> Result<Self> {
        Self::start_bin(api, &tenant_proxy_bin())
    }

    pub fn start_bin(api: &ApiServer, bin: &Path) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let out = Command::new(bin).args(["pki", "--dir"]).arg(dir.path()).output().context("tenant-proxy pki")?;
        if !out.status.success() {
            bail!("tenant-proxy pki: {}", String::from_utf8_lossy(&out.stderr));
        }
        let (port, health_port) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("tenant-proxy.log"))?;
        let admin = api.identity("admin.conf");
        let child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["--bind-address", "127.0.0.1", "--secure-port", &port.to_string()])
            .args(["--healthz-bind-address", &format!("127.0.0.1:{health_port}")])
            .arg("--tls-cert-file")
            .arg(dir.path().join("tenant-proxy.crt"))
            .arg("--tls-private-key-file")
            .arg(dir.path().join("tenant-proxy.key"))
            .arg("--client-ca-file")
            .arg(dir.path().join("tenants-ca.crt"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning tenant-proxy")?;
        let mut p = TenantProxy { child: Some(child), port, health_port, dir, admin };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if crate::raw(health_port, "GET", "/readyz", None, b"").is_ok_and(|r| r.status == 200) {
                return Ok(p);
            }
            if let Some(c) = p.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    bail!("tenant-proxy exited ({status}): {}", p.log());
                }
            }
            if Instant::now() > deadline {
                bail!("tenant-proxy not ready in 30 s: {}", p.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tenant-proxy.log")).unwrap_or_default()
    }

    /// Create the `Tenant` object `name` upstream (as the cluster's admin).
    pub fn add_tenant(&self, name: &str) -> Result<()> {
        let manifest = format!("apiVersion: tenancy.minik8s.io/v1alpha1\nkind: Tenant\nmetadata:\n  name: {name}\n");
        let (ok, out) = crate::kubectl_at(&self.admin, &["apply", "-f", "-"], Some(&manifest));
        if !ok {
            bail!("adding tenant {name}: {out}");
        }
        Ok(())
    }

    /// A kubeconfig for `user` of `tenant` in `group` (empty: none), written in the proxy's
    /// directory.
    pub fn kubeconfig(&self, tenant: &str, user: &str, group: &str) -> Result<PathBuf> {
        let out = Command::new(tenant_proxy_bin())
            .args(["kubeconfig", "--dir"])
            .arg(self.dir.path())
            .args(["--tenant", tenant, "--user", user, "--group", group, "--server", &self.url()])
            .output()
            .context("tenant-proxy kubeconfig")?;
        if !out.status.success() {
            bail!("tenant-proxy kubeconfig: {}", String::from_utf8_lossy(&out.stderr));
        }
        let path = self.dir.path().join(format!("{tenant}-{user}.conf"));
        std::fs::write(&path, &out.stdout)?;
        Ok(path)
    }
}

impl Drop for TenantProxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
