//! `minik8s-supervisor certs`: the cluster's PKI on disk, kubeadm-style (`kubeadm init phase
//! certs` / `kubeconfig`, `kubeadm certs renew`). What to write is decided by
//! [`common::pki::plan`]; this module only reads the directory and writes the files:
//! the directory 0700, every file 0600 (keys, and kubeconfigs that embed them), each
//! written to a temporary name and renamed, so a reader never sees half a file.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use common::pki::{self, Mode, Spec};

/// The spec of a PKI directory, kept beside its files for `renew`.
const SPEC_FILE: &str = "pki.json";

#[derive(clap::Subcommand, Debug)]
pub enum Certs {
    /// Create the cluster CA, the apiserver's serving and kubelet-client certificates, and a
    /// kubeconfig per identity (admin.conf, scheduler.conf, controller-manager.conf, cloud-controller-manager.conf,
    /// kube-proxy.conf, kubelet-<node>.conf). Idempotent: a valid CA and every certificate
    /// that still matches are kept.
    Init(InitArgs),
    /// Issue every certificate and kubeconfig again from the same CA (restart the
    /// components to load them).
    Renew {
        /// The PKI directory.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Write a kubeconfig for a user of your own, signed by the cluster CA (CN = the user,
    /// O = the group): what an authorizer then grants that user is up to it.
    Kubeconfig {
        /// The PKI directory.
        #[arg(long)]
        dir: PathBuf,
        /// The user name (the certificate's CN).
        #[arg(long)]
        user: String,
        /// A group of the user (the certificate's O).
        #[arg(long)]
        group: Option<String>,
        /// The apiserver URL (default: the one of `init`).
        #[arg(long)]
        server: Option<String>,
        /// Where to write the kubeconfig (mode 0600).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a new random certificate key (64 hex digits, kubeadm's `--certificate-key`).
    NewKey,
    /// Print the certificates every control-plane machine shares (the CAs, the ServiceAccount
    /// key) sealed with a certificate key, for a Secret a joining machine reads.
    Seal {
        /// The PKI directory.
        #[arg(long)]
        dir: PathBuf,
        /// The certificate key (64 hex digits; `certs new-key` makes one).
        #[arg(long)]
        key: String,
    },
    /// Write the certificates of a sealed text (read from standard input) into a PKI
    /// directory, where `init` then issues this machine's leaves from them.
    Unseal {
        /// The PKI directory (created 0700).
        #[arg(long)]
        dir: PathBuf,
        /// The certificate key the join command carries.
        #[arg(long)]
        key: String,
    },
    /// Print the CA's public key hash (`sha256:<hex>`, kubeadm's `--discovery-token-ca-cert-hash`),
    /// by which a joining node recognizes the cluster's CA.
    CaHash {
        /// The PKI directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// The PKI directory (created 0700).
    #[arg(long)]
    dir: PathBuf,
    /// A node to issue a kubelet identity for (`system:node:<name>`); repeatable. Also a
    /// name of the apiserver's certificate.
    #[arg(long = "node")]
    nodes: Vec<String>,
    /// An extra DNS name or IP address of the apiserver's serving certificate; repeatable,
    /// or comma-separated.
    #[arg(long = "san", value_delimiter = ',')]
    sans: Vec<String>,
    /// The apiserver URL the kubeconfigs point at; its host is a name of the certificate.
    #[arg(long, default_value = "https://127.0.0.1:6443")]
    server: String,
    /// The Service CIDR: its first address (the `kubernetes` Service) is a name of the
    /// certificate.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
}

pub fn run(cmd: Certs) -> anyhow::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    match cmd {
        Certs::Init(a) => {
            let spec = Spec {
                nodes: a.nodes,
                sans: a.sans.into_iter().filter(|s| !s.trim().is_empty()).collect(),
                service_cluster_ip_range: a.service_cluster_ip_range,
                server: a.server,
            };
            apply(&a.dir, &spec, Mode::Init, now)
        }
        Certs::Renew { dir } => {
            let path = dir.join(SPEC_FILE);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {} (run `certs init` first)", path.display()))?;
            let spec: Spec = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            apply(&dir, &spec, Mode::Renew, now)
        }
        Certs::Kubeconfig { dir, user, group, server, out } => {
            let ca = pki::Ca { cert_pem: read(&dir, pki::CA_CERT)?, key_pem: read(&dir, pki::CA_KEY)? };
            let server = match server {
                Some(s) => s,
                None => {
                    let text = read(&dir, SPEC_FILE)?;
                    serde_json::from_str::<Spec>(&text).context("parsing pki.json")?.server
                }
            };
            let groups: Vec<String> = group.into_iter().collect();
            let kc = pki::user_kubeconfig(&ca, &server, &user, &groups, now)?;
            common::write_private(&out, kc.as_bytes())?;
            println!(
                "[kubeconfig] wrote {} for user {user:?}{}",
                out.display(),
                match groups.first() {
                    Some(g) => format!(" in group {g:?}"),
                    None => String::new(),
                }
            );
            Ok(())
        }
        Certs::NewKey => {
            println!("{}", common::certbundle::new_key());
            Ok(())
        }
        Certs::Seal { dir, key } => {
            let files = pki::SHARED_FILES
                .iter()
                .map(|name| Ok((name.to_string(), read(&dir, name)?)))
                .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
            println!("{}", common::certbundle::seal(&files, &key)?);
            Ok(())
        }
        Certs::Unseal { dir, key } => {
            let mut sealed = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut sealed).context("reading standard input")?;
            let files = common::certbundle::open(&sealed, &key)?;
            make_private_dir(&dir)?;
            for (name, text) in &files {
                common::write_private(&dir.join(name), text.as_bytes())?;
                println!("[certs] wrote {}", dir.join(name).display());
            }
            Ok(())
        }
        Certs::CaHash { dir } => {
            let pem = read(&dir, pki::CA_CERT)?;
            let der = pki::pem_to_der(&pem).context("ca.crt is not a PEM certificate")?;
            println!("{}", pki::ca_cert_hash(&der).map_err(anyhow::Error::msg)?);
            Ok(())
        }
    }
}

fn read(dir: &Path, name: &str) -> anyhow::Result<String> {
    let path = dir.join(name);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// `dir`, created if missing, readable by the owner only.
fn make_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("restricting {}", dir.display()))
}

fn apply(dir: &Path, spec: &Spec, mode: Mode, now: time::OffsetDateTime) -> anyhow::Result<()> {
    make_private_dir(dir)?;
    let mut existing = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let wanted = [".crt", ".key", ".conf", ".pub"].iter().any(|x| name.ends_with(x));
        if wanted && entry.file_type()?.is_file() {
            existing.insert(name.clone(), std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    let files = pki::plan(&existing, spec, mode, now)?;
    // The CA first: a crash in between leaves leaves of an old CA, which the next init replaces.
    let mut names: Vec<&String> = files.keys().collect();
    names.sort_by_key(|n| (!n.starts_with("ca."), n.to_string()));
    for name in names {
        common::write_private(&dir.join(name), files[name].as_bytes())?;
        let verb = if existing.contains_key(name) { "renewed" } else { "generated" };
        println!("[certs] {verb} {}", dir.join(name).display());
    }
    if files.is_empty() {
        println!("[certs] every certificate in {} is current; nothing to do", dir.display());
    }
    common::write_private(&dir.join(SPEC_FILE), serde_json::to_string_pretty(spec)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn init_writes_private_files_and_again_changes_nothing_while_renew_keeps_the_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pki");
        let init = || {
            run(Certs::Init(InitArgs {
                dir: dir.clone(),
                nodes: vec!["n1".into()],
                sans: vec!["192.0.2.1".into()],
                server: "https://192.0.2.1:6443".into(),
                service_cluster_ip_range: "10.96.0.0/12".into(),
            }))
            .unwrap()
        };
        init();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let mut names = vec![];
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            assert_eq!(e.metadata().unwrap().mode() & 0o777, 0o600, "{:?}", e.file_name());
            names.push(e.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(
            names,
            [
                "admin.conf",
                "apiserver-etcd-client.crt",
                "apiserver-etcd-client.key",
                "apiserver-kubelet-client.crt",
                "apiserver-kubelet-client.key",
                "apiserver.crt",
                "apiserver.key",
                "ca.crt",
                "ca.key",
                "cloud-controller-manager.conf",
                "controller-manager.conf",
                "dashboard-serving.crt",
                "dashboard-serving.key",
                "etcd-ca.crt",
                "etcd-ca.key",
                "etcd-healthcheck-client.crt",
                "etcd-healthcheck-client.key",
                "etcd-peer.crt",
                "etcd-peer.key",
                "etcd-server.crt",
                "etcd-server.key",
                "kube-proxy.conf",
                "kube-state-metrics.conf",
                "kubelet-n1.conf",
                "module-controller-serving.crt",
                "module-controller-serving.key",
                "module-controller.conf",
                "pilot.conf",
                "pki.json",
                "prometheus.conf",
                "sa.key",
                "sa.pub",
                "scheduler.conf"
            ]
        );
        let snapshot = |n: &str| std::fs::read_to_string(dir.join(n)).unwrap();
        let (ca, admin, sa_key) = (snapshot("ca.crt"), snapshot("admin.conf"), snapshot("sa.key"));
        init();
        assert_eq!((snapshot("ca.crt"), snapshot("admin.conf")), (ca.clone(), admin.clone()), "init is idempotent");
        run(Certs::Renew { dir: dir.clone() }).unwrap();
        assert_eq!(snapshot("ca.crt"), ca, "renew keeps the CA");
        assert_eq!(snapshot("sa.key"), sa_key, "and the ServiceAccount key");
        assert_ne!(snapshot("admin.conf"), admin, "renew issues the identities again");
        let out = tmp.path().join("jane.conf");
        run(Certs::Kubeconfig { dir: dir.clone(), user: "jane".into(), group: None, server: None, out: out.clone() })
            .unwrap();
        assert!(snapshot("pki.json").contains("https://192.0.2.1:6443"));
        assert!(std::fs::read_to_string(&out).unwrap().contains("server: https://192.0.2.1:6443"));
        assert_eq!(std::fs::metadata(&out).unwrap().mode() & 0o777, 0o600);
    }
}
