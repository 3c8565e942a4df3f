//! The pod's `/etc/resolv.conf` and `/etc/hosts`, as the kubelet writes them
//! (`pkg/kubelet/network/dns` and `managedHostsFileContent`): pure functions of the pod, the
//! kubelet's `--cluster-dns` / `--cluster-domain` and the host's resolv.conf, plus the thin
//! shell that writes them under the pod's directory and bind-mounts them into every
//! container of the pod.
//!
//! DNS policies:
//! - `ClusterFirst` (the default): `nameserver <cluster-dns>`,
//!   `search <ns>.svc.<domain> svc.<domain> <domain>` + the host's search domains,
//!   `options ndots:5`. On a `hostNetwork` pod it falls back to `Default`, and so does a
//!   kubelet without `--cluster-dns`.
//! - `ClusterFirstWithHostNet`: `ClusterFirst`, also for `hostNetwork` pods.
//! - `Default`: the host's resolv.conf (nameservers, search, options).
//! - `None`: only what `dnsConfig` says.
//!
//! `dnsConfig` is then merged: nameservers and searches appended without duplicates,
//! options by name (the pod's value wins). Kubernetes' limits apply: at most 3 nameservers,
//! 32 search domains and 2048 characters of search list.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

/// Kubernetes' limits (`validation.MaxDNSNameservers`, `MaxDNSSearchPaths`, `MaxDNSSearchListChars`).
pub const MAX_NAMESERVERS: usize = 3;
pub const MAX_SEARCHES: usize = 32;
pub const MAX_SEARCH_CHARS: usize = 2048;

/// The kubelet's DNS settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `--cluster-dns`.
    pub cluster_dns: Vec<IpAddr>,
    /// `--cluster-domain` (empty: no cluster search domains).
    pub cluster_domain: String,
    /// The contents of `--resolv-conf` (the host's resolver configuration).
    pub host_resolv_conf: String,
    /// The contents of the host's `/etc/hosts` (for `hostNetwork` pods).
    pub host_hosts: String,
}

/// A resolver configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parse the lines of a resolv.conf that matter (the last `search`/`domain` line wins,
    /// as in glibc; `options` accumulate).
    pub fn parse(text: &str) -> ResolvConf {
        let mut r = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => r.nameservers.extend(words.next().map(str::to_string)),
                Some("search") | Some("domain") => {
                    r.searches =
                        words.map(|s| s.trim_end_matches('.')).filter(|s| !s.is_empty()).map(String::from).collect()
                }
                Some("options") => r.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        r
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for n in &self.nameservers {
            out.push_str(&format!("nameserver {n}\n"));
        }
        if !self.searches.is_empty() {
            out.push_str(&format!("search {}\n", self.searches.join(" ")));
        }
        if !self.options.is_empty() {
            out.push_str(&format!("options {}\n", self.options.join(" ")));
        }
        out
    }
}

/// Which resolver configuration a pod gets (Kubernetes' `podDNSType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDnsType {
    Cluster,
    Host,
    None,
}

/// The pod's DNS type: its `dnsPolicy`, `hostNetwork`, and whether the kubelet has a cluster DNS.
pub fn dns_type(pod: &Pod, s: &Settings) -> PodDnsType {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network == Some(true);
    let t = match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "None" => PodDnsType::None,
        "ClusterFirstWithHostNet" => PodDnsType::Cluster,
        "Default" => PodDnsType::Host,
        // ClusterFirst (and anything unknown, which validation rejects)
        _ if host_network => PodDnsType::Host,
        _ => PodDnsType::Cluster,
    };
    if t == PodDnsType::Cluster && s.cluster_dns.is_empty() {
        // "ClusterFirst policy specified but no cluster DNS IP configured: falling back to Default"
        return PodDnsType::Host;
    }
    t
}

fn push_unique(v: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for i in items {
        if !v.contains(&i) {
            v.push(i);
        }
    }
}

/// The pod's resolv.conf.
pub fn resolv_conf(pod: &Pod, s: &Settings) -> ResolvConf {
    let host = ResolvConf::parse(&s.host_resolv_conf);
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut r = match dns_type(pod, s) {
        PodDnsType::None => ResolvConf::default(),
        PodDnsType::Host => host,
        PodDnsType::Cluster => {
            let domain = s.cluster_domain.trim_end_matches('.');
            let mut searches = Vec::new();
            if !domain.is_empty() {
                searches = vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.to_string()];
            }
            push_unique(&mut searches, host.searches);
            ResolvConf {
                nameservers: s.cluster_dns.iter().map(IpAddr::to_string).collect(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
    };
    if let Some(c) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        push_unique(&mut r.nameservers, c.nameservers.clone().unwrap_or_default());
        push_unique(
            &mut r.searches,
            c.searches.iter().flatten().map(|s| s.trim_end_matches('.').to_string()).filter(|s| !s.is_empty()),
        );
        // Options by name; the pod's value replaces the inherited one in place.
        for o in c.options.iter().flatten() {
            let Some(name) = o.name.as_deref().filter(|n| !n.is_empty()) else { continue };
            let text = match o.value.as_deref().filter(|v| !v.is_empty()) {
                Some(v) => format!("{name}:{v}"),
                None => name.to_string(),
            };
            match r.options.iter_mut().find(|e| e.split(':').next() == Some(name)) {
                Some(e) => *e = text,
                None => r.options.push(text),
            }
        }
    }
    // Kubernetes' limits: drop what does not fit.
    r.nameservers.truncate(MAX_NAMESERVERS);
    r.searches.truncate(MAX_SEARCHES);
    while !r.searches.is_empty() && r.searches.join(" ").len() > MAX_SEARCH_CHARS {
        r.searches.pop();
    }
    r
}

/// The pod's host name as the kubelet sets it (spec.hostname, else the pod name; at most
/// 63 characters, without a trailing `-` or `.`).
pub fn hostname(pod: &Pod) -> String {
    let h = pod.spec.as_ref().and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty());
    let h = h.or_else(|| pod.metadata.name.clone()).unwrap_or_default();
    let h: String = h.chars().take(63).collect();
    h.trim_end_matches(['-', '.']).to_string()
}

/// The pod's /etc/hosts: Kubernetes' managed file (localhost lines, the pod IP with its
/// host name, and the FQDN `<hostname>.<subdomain>.<ns>.svc.<domain>` when the pod has a
/// subdomain), or the host's file for `hostNetwork` pods; then `hostAliases`.
pub fn hosts_file(pod: &Pod, pod_ip: &str, s: &Settings) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut out = if spec.host_network == Some(true) {
        let mut h = s.host_hosts.clone();
        if !h.is_empty() && !h.ends_with('\n') {
            h.push('\n');
        }
        h
    } else {
        let mut h = String::from(
            "# Kubernetes-managed hosts file.\n\
             127.0.0.1\tlocalhost\n\
             ::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\n\
             fe00::0\tip6-mcastprefix\n\
             fe00::1\tip6-allnodes\n\
             fe00::2\tip6-allrouters\n",
        );
        let name = hostname(pod);
        let domain = s.cluster_domain.trim_end_matches('.');
        if !pod_ip.is_empty() && !name.is_empty() {
            match spec.subdomain.as_deref().filter(|d| !d.is_empty()) {
                Some(sub) if !domain.is_empty() => {
                    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                    h.push_str(&format!("{pod_ip}\t{name}.{sub}.{ns}.svc.{domain}\t{name}\n"));
                }
                _ => h.push_str(&format!("{pod_ip}\t{name}\n")),
            }
        }
        h
    };
    let aliases = spec.host_aliases.unwrap_or_default();
    if !aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            let names = a.hostnames.unwrap_or_default();
            if names.is_empty() {
                continue;
            }
            out.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
        }
    }
    out
}

/// Whether a container mounts something of its own at `path`.
fn mounts(pod: &Pod, path: &str) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .any(|m| m.mount_path.trim_end_matches('/') == path)
}

/// The Docker binds of the pod's files (`host:container`), given where they were written.
pub fn binds(pod: &Pod, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (file, target) in [("etc-hosts", "/etc/hosts"), ("resolv.conf", "/etc/resolv.conf")] {
        if !mounts(pod, target) {
            out.push(format!("{}:{target}", dir.join(file).display()));
        }
    }
    out
}

/// Write the pod's `etc-hosts` and `resolv.conf` into `dir` (only when they changed) and
/// return the binds that mount them.
pub fn write_files(pod: &Pod, pod_ip: &str, s: &Settings, dir: &Path) -> std::io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    for (file, text) in [("etc-hosts", hosts_file(pod, pod_ip, s)), ("resolv.conf", resolv_conf(pod, s).render())] {
        let p: PathBuf = dir.join(file);
        if std::fs::read_to_string(&p).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&p, text)?;
        }
    }
    Ok(binds(pod, dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        serde_json::from_value(json!({"metadata": {"name": "web-1", "namespace": "shop"}, "spec": spec})).unwrap()
    }

    fn settings() -> Settings {
        Settings {
            cluster_dns: vec!["10.96.0.10".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            host_resolv_conf: "# host\nnameserver 10.255.255.53\nnameserver 8.8.8.8\nsearch corp.example. lab\noptions edns0 timeout:2\n".into(),
            host_hosts: "127.0.0.1 localhost\n192.0.2.2 vm".into(),
        }
    }

    #[test]
    fn cluster_first_uses_the_cluster_dns_and_search_path() {
        let r = resolv_conf(&pod(json!({})), &settings());
        assert_eq!(
            r.render(),
            "nameserver 10.96.0.10\n\
             search shop.svc.cluster.local svc.cluster.local cluster.local corp.example lab\n\
             options ndots:5\n"
        );
        let explicit = resolv_conf(&pod(json!({"dnsPolicy": "ClusterFirst"})), &settings());
        assert_eq!(explicit, r);
    }

    #[test]
    fn cluster_first_on_host_network_falls_back_to_the_host() {
        let r = resolv_conf(&pod(json!({"hostNetwork": true})), &settings());
        assert_eq!(r.nameservers, ["10.255.255.53", "8.8.8.8"]);
        assert_eq!(r.searches, ["corp.example", "lab"]);
        assert_eq!(r.options, ["edns0", "timeout:2"]);
        // ...unless ClusterFirstWithHostNet.
        let r = resolv_conf(&pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"})), &settings());
        assert_eq!(r.nameservers, ["10.96.0.10"]);
        assert_eq!(r.searches[0], "shop.svc.cluster.local");
    }

    #[test]
    fn default_policy_and_no_cluster_dns_use_the_host_file() {
        let host = ResolvConf::parse(&settings().host_resolv_conf);
        assert_eq!(resolv_conf(&pod(json!({"dnsPolicy": "Default"})), &settings()), host);
        let no_dns = Settings { cluster_dns: vec![], ..settings() };
        assert_eq!(resolv_conf(&pod(json!({})), &no_dns), host);
    }

    #[test]
    fn none_takes_only_dns_config_and_dns_config_merges() {
        let r = resolv_conf(
            &pod(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.2.3.4"], "searches": ["a.b"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}})),
            &settings(),
        );
        assert_eq!(r.render(), "nameserver 1.2.3.4\nsearch a.b\noptions ndots:2 edns0\n");
        let r = resolv_conf(
            &pod(
                json!({"dnsConfig": {"nameservers": ["10.96.0.10", "1.1.1.1"], "searches": ["my.dns.search.suffix", "lab"],
                "options": [{"name": "ndots", "value": "1"}, {"name": "single-request-reopen"}]}}),
            ),
            &settings(),
        );
        assert_eq!(r.nameservers, ["10.96.0.10", "1.1.1.1"], "duplicates omitted");
        assert_eq!(
            r.searches,
            [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "lab",
                "my.dns.search.suffix"
            ]
        );
        assert_eq!(r.options, ["ndots:1", "single-request-reopen"], "the pod's value wins");
    }

    #[test]
    fn limits_are_applied() {
        let searches: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let r = resolv_conf(
            &pod(
                json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"],
                "searches": searches}}),
            ),
            &settings(),
        );
        assert_eq!(r.nameservers.len(), MAX_NAMESERVERS);
        assert_eq!(r.searches.len(), MAX_SEARCHES);
        let long: Vec<String> = (0..20).map(|i| format!("{i}{}", "x".repeat(200))).collect();
        let r = resolv_conf(&pod(json!({"dnsPolicy": "None", "dnsConfig": {"searches": long}})), &settings());
        assert!(r.searches.join(" ").len() <= MAX_SEARCH_CHARS && !r.searches.is_empty());
    }

    #[test]
    fn no_cluster_domain_means_only_host_searches() {
        let s = Settings { cluster_domain: String::new(), ..settings() };
        assert_eq!(resolv_conf(&pod(json!({})), &s).searches, ["corp.example", "lab"]);
    }

    #[test]
    fn hosts_file_is_kubernetes_managed() {
        let h = hosts_file(&pod(json!({})), "10.244.1.5", &settings());
        assert!(h.starts_with(
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        ));
        assert!(h.ends_with("fe00::2\tip6-allrouters\n10.244.1.5\tweb-1\n"), "{h}");
        let h = hosts_file(
            &pod(json!({"hostname": "db-0", "subdomain": "db",
                "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}]})),
            "10.244.1.6",
            &settings(),
        );
        assert!(h.contains("10.244.1.6\tdb-0.db.shop.svc.cluster.local\tdb-0\n"), "{h}");
        assert!(h.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"), "{h}");
    }

    #[test]
    fn host_network_pods_get_the_hosts_file_of_the_host() {
        let h = hosts_file(
            &pod(json!({"hostNetwork": true, "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo"]}]})),
            "192.0.2.2",
            &settings(),
        );
        assert_eq!(h, "127.0.0.1 localhost\n192.0.2.2 vm\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\n");
    }

    #[test]
    fn hostnames_are_truncated_like_kubernetes() {
        let mut p = pod(json!({}));
        p.metadata.name = Some(format!("{}-x", "a".repeat(62)));
        assert_eq!(hostname(&p), "a".repeat(62));
    }

    #[test]
    fn binds_skip_paths_a_container_mounts_itself() {
        let dir = Path::new("/r/pods/u");
        assert_eq!(
            binds(&pod(json!({})), dir),
            ["/r/pods/u/etc-hosts:/etc/hosts", "/r/pods/u/resolv.conf:/etc/resolv.conf"]
        );
        let mut p = pod(json!({"volumes": [{"name": "h", "emptyDir": {}}]}));
        p.spec.as_mut().unwrap().containers[0].volume_mounts =
            Some(vec![serde_json::from_value(json!({"name": "h", "mountPath": "/etc/hosts"})).unwrap()]);
        assert_eq!(binds(&p, dir), ["/r/pods/u/resolv.conf:/etc/resolv.conf"]);
    }

    #[test]
    fn files_are_written_and_rendered() {
        let d = tempfile::tempdir().unwrap();
        let b = write_files(&pod(json!({})), "10.244.1.5", &settings(), d.path()).unwrap();
        assert_eq!(b.len(), 2);
        let r = std::fs::read_to_string(d.path().join("resolv.conf")).unwrap();
        assert!(r.starts_with("nameserver 10.96.0.10\n"));
        assert!(std::fs::read_to_string(d.path().join("etc-hosts")).unwrap().contains("10.244.1.5\tweb-1"));
    }
}
