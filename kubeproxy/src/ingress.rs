//! The nginx Ingress controller: [`render`] turns Ingress objects (host, `Prefix`/`Exact`
//! paths, default backend, IngressClass) into an nginx configuration whose upstreams are
//! the backend Services' cluster IPs; [`run`] writes it and reloads nginx only when the
//! rendered text changed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::Notify;

pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
pub const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// ingress-nginx's annotation: the backend sees the matched path prefix replaced by this.
pub const REWRITE_TARGET_ANNOTATION: &str = "nginx.ingress.kubernetes.io/rewrite-target";

/// Settings of the controller.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub dir: PathBuf,
    pub class: String,
    /// Also serve Ingresses without any class (`--watch-ingress-without-class`).
    pub without_class: bool,
    pub http_port: u16,
    pub node_ip: Option<std::net::Ipv4Addr>,
}

/// Whether this controller serves `ing`: its class is ours, or it has none and ours is the
/// default (or `without_class` says to serve class-less Ingresses).
pub fn serves(ing: &Ingress, class: &str, without_class: bool, classes: &[IngressClass]) -> bool {
    let named = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| ing.metadata.annotations.as_ref().and_then(|a| a.get(CLASS_ANNOTATION).cloned()));
    match named {
        Some(c) => c == class,
        None if without_class => true,
        None => classes.iter().any(|c| {
            c.metadata.name.as_deref() == Some(class)
                && c.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION)).map(String::as_str)
                    == Some("true")
        }),
    }
}

/// `http://<clusterIP>:<port>` of a backend, if its Service exists and has a cluster IP.
fn upstream(b: &IngressBackend, ns: &str, services: &BTreeMap<(String, String), &Service>) -> Option<String> {
    let sb = b.service.as_ref()?;
    let svc = services.get(&(ns.to_string(), sb.name.clone()))?;
    let spec = svc.spec.as_ref()?;
    let ip = spec.cluster_ip.as_deref().filter(|ip| *ip != "None" && !ip.is_empty())?;
    let port = sb.port.as_ref()?;
    let number = match (port.number, port.name.as_deref()) {
        (Some(n), _) => n,
        (None, Some(name)) => spec.ports.iter().flatten().find(|p| p.name.as_deref() == Some(name))?.port,
        _ => return None,
    };
    Some(format!("http://{ip}:{number}"))
}

/// The `rewrite` directive for a path with a `rewrite-target` annotation: the matched prefix
/// (or exact path) is replaced by the target, the rest of the URI kept. Only literal paths and
/// targets (no regex, no nginx variables) are accepted; anything else is not rewritten.
pub fn rewrite(path: &str, exact: bool, target: &str) -> Option<String> {
    let literal = |s: &str, extra: &str| {
        s.starts_with('/') && s.chars().all(|c| c.is_ascii_alphanumeric() || "/-_.~".contains(c) || extra.contains(c))
    };
    if !literal(path, "") || !literal(target, "%:@!*'(),+=") {
        return None;
    }
    let p = path.trim_end_matches('/').replace('.', "\\.");
    Some(if exact {
        format!("rewrite ^{p}$ {target} break;")
    } else if target.ends_with('/') {
        format!("rewrite ^{p}/?(.*)$ {target}$1 break;")
    } else {
        format!("rewrite ^{p}(.*)$ {target}$1 break;")
    })
}

fn location(out: &mut String, matcher: &str, target: Option<&str>, rewrite: Option<&str>) {
    let _ = writeln!(out, "        location {matcher} {{");
    match target {
        Some(t) => {
            if let Some(r) = rewrite {
                let _ = writeln!(out, "            {r}");
            }
            let _ = writeln!(out, "            proxy_pass {t};");
        }
        None => {
            let _ = writeln!(out, "            return 503;");
        }
    }
    let _ = writeln!(out, "        }}");
}

/// The nginx configuration for the Ingresses this controller serves.
pub fn render(ingresses: &[Ingress], services: &[Service], classes: &[IngressClass], cfg: &ControllerConfig) -> String {
    let dir = cfg.dir.display();
    let svc_map: BTreeMap<(String, String), &Service> = services
        .iter()
        .filter_map(|s| Some(((s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone()?), s)))
        .collect();
    let mut ings: Vec<&Ingress> =
        ingresses.iter().filter(|i| serves(i, &cfg.class, cfg.without_class, classes)).collect();
    // Oldest first (by namespace/name for determinism): the first Ingress wins a host+path.
    ings.sort_by_key(|i| (i.metadata.namespace.clone(), i.metadata.name.clone()));

    // host → matcher → (upstream, rewrite)
    let mut hosts: BTreeMap<String, BTreeMap<String, (Option<String>, Option<String>)>> = BTreeMap::new();
    let mut default_backend: Option<Option<String>> = None;
    for ing in &ings {
        let ns = ing.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let Some(spec) = ing.spec.as_ref() else { continue };
        let rewrite_target = ing.metadata.annotations.as_ref().and_then(|a| a.get(REWRITE_TARGET_ANNOTATION));
        if let (None, Some(b)) = (&default_backend, spec.default_backend.as_ref()) {
            default_backend = Some(upstream(b, &ns, &svc_map));
        }
        for rule in spec.rules.iter().flatten() {
            let host = rule.host.clone().unwrap_or_else(|| "_".into());
            let locs = hosts.entry(host).or_default();
            for p in rule.http.as_ref().map(|h| h.paths.as_slice()).unwrap_or_default() {
                let path = p.path.clone().unwrap_or_else(|| "/".into());
                let target = upstream(&p.backend, &ns, &svc_map);
                let exact = p.path_type == "Exact";
                let trimmed = path.trim_end_matches('/');
                let rw = rewrite_target.and_then(|t| rewrite(&path, exact, t));
                let matchers: Vec<String> = if exact {
                    vec![format!("= {path}")]
                } else if trimmed.is_empty() {
                    vec!["/".to_string()]
                } else {
                    // Prefix matches whole path elements: /web and /web/…, not /webx.
                    vec![format!("= {trimmed}"), format!("{trimmed}/")]
                };
                for m in matchers {
                    locs.entry(m).or_insert_with(|| (target.clone(), rw.clone()));
                }
            }
        }
    }

    let mut out = String::new();
    let _ = write!(
        out,
        "# Rendered by kubeproxy's ingress controller; do not edit.\n\
worker_processes 1;\n\
pid {dir}/nginx.pid;\n\
error_log {dir}/error.log;\n\
events {{\n    worker_connections 1024;\n}}\n\
http {{\n\
    access_log {dir}/access.log;\n\
    client_body_temp_path {dir}/client_body;\n\
    proxy_temp_path {dir}/proxy;\n\
    fastcgi_temp_path {dir}/fastcgi;\n\
    uwsgi_temp_path {dir}/uwsgi;\n\
    scgi_temp_path {dir}/scgi;\n\
    proxy_set_header Host $host;\n\
    proxy_set_header X-Real-IP $remote_addr;\n\
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
    proxy_http_version 1.1;\n"
    );
    let port = cfg.http_port;
    // The catch-all server: rules without a host, then the default backend, else 404.
    let catch_all = hosts.remove("_").unwrap_or_default();
    let _ = writeln!(out, "    server {{\n        listen {port} default_server;\n        server_name _;");
    for (m, (t, rw)) in &catch_all {
        location(&mut out, m, t.as_deref(), rw.as_deref());
    }
    if !catch_all.contains_key("/") {
        match &default_backend {
            Some(t) => location(&mut out, "/", t.as_deref(), None),
            None => {
                let _ = writeln!(out, "        location / {{\n            return 404;\n        }}");
            }
        }
    }
    let _ = writeln!(out, "    }}");
    for (host, locs) in &hosts {
        let _ = writeln!(out, "    server {{\n        listen {port};\n        server_name {host};");
        for (m, (t, rw)) in locs {
            location(&mut out, m, t.as_deref(), rw.as_deref());
        }
        if !locs.contains_key("/") {
            match &default_backend {
                Some(t) => location(&mut out, "/", t.as_deref(), None),
                None => {
                    let _ = writeln!(out, "        location / {{\n            return 404;\n        }}");
                }
            }
        }
        let _ = writeln!(out, "    }}");
    }
    out.push_str("}\n");
    with_generation(out, &cfg.dir)
}

/// The status server nginx serves on a Unix socket of `dir`: `GET /config` answers the
/// configuration's generation (a hash of everything else in it), so the controller can
/// tell when nginx serves a configuration it wrote — `nginx -s reload` returns before the
/// new workers run.
fn with_generation(mut conf: String, dir: &Path) -> String {
    let generation = generation_of(&conf);
    conf.truncate(conf.len() - 2); // the closing "}\n" of the http block
    let _ = write!(
        conf,
        "    server {{\n        listen unix:{}/status.sock;\n        location = /config {{\n            \
         return 200 \"{generation}\";\n        }}\n    }}\n}}\n",
        dir.display()
    );
    conf
}

fn generation_of(conf: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(conf.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The generation a rendered configuration announces (what [`with_generation`] put in).
pub fn announced_generation(conf: &str) -> Option<&str> {
    let start = conf.rfind("return 200 \"")? + "return 200 \"".len();
    let len = conf[start..].find('"')?;
    Some(&conf[start..start + len])
}

/// The generation the running nginx of `dir` serves (None while it answers nothing).
async fn served_generation(dir: &Path) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(dir.join("status.sock")).await.ok()?;
    s.write_all(b"GET /config HTTP/1.0\r\nHost: localhost\r\n\r\n").await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.trim().to_string())
}

/// Wait (at most 10 s) until nginx serves the configuration `conf`.
async fn wait_loaded(dir: &Path, conf: &str) -> bool {
    let Some(want) = announced_generation(conf) else { return false };
    for _ in 0..100 {
        if served_generation(dir).await.as_deref() == Some(want) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}

/// Write `conf` if it differs from what is in `path`; true when it changed.
pub fn write_if_changed(path: &Path, conf: &str) -> anyhow::Result<bool> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(conf) {
        return Ok(false);
    }
    std::fs::write(path, conf)?;
    Ok(true)
}

/// Whether the nginx whose pid file is in `dir` runs (a live process named nginx).
pub fn nginx_alive(dir: &Path) -> bool {
    let Some(pid) = std::fs::read_to_string(dir.join("nginx.pid")).ok().and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return false;
    };
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("nginx"))
        .unwrap_or(false)
}

/// Stop the nginx of `dir` (fast shutdown: the master stops its workers) and wait until it
/// is gone (its pid file removed), at most 5 s.
pub async fn stop_nginx(dir: &Path) {
    let conf = dir.join("nginx.conf");
    let pid = dir.join("nginx.pid");
    if !nginx_alive(dir) {
        return;
    }
    let conf_s = conf.to_string_lossy().to_string();
    match tokio::process::Command::new("nginx").args(["-c", &conf_s, "-s", "stop"]).output().await {
        Ok(o) if o.status.success() => {}
        Ok(o) => tracing::warn!(stderr = %String::from_utf8_lossy(&o.stderr), "nginx -s stop failed"),
        Err(e) => tracing::warn!(error = %e, "cannot run nginx -s stop"),
    }
    for _ in 0..50 {
        if !pid.exists() {
            tracing::info!("stopped nginx");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tracing::warn!("nginx did not stop within 5s");
}

/// Run the controller: watch Ingresses, IngressClasses and Services; render; reload nginx.
pub async fn run(client: Client, cfg: ControllerConfig) -> anyhow::Result<()> {
    for sub in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"] {
        std::fs::create_dir_all(cfg.dir.join(sub))?;
    }
    let reloads = prometheus::IntCounter::new("kubeproxy_ingress_nginx_reloads_total", "nginx configuration reloads")?;
    let _ = prometheus::register(Box::new(reloads.clone()));
    let notify = Arc::new(Notify::new());
    let ingresses = crate::proxier::cache::<Ingress>(&client, notify.clone());
    let classes = crate::proxier::cache::<IngressClass>(&client, notify.clone());
    let services = crate::proxier::cache::<Service>(&client, notify.clone());
    ingresses.wait_until_ready().await?;
    classes.wait_until_ready().await?;
    services.wait_until_ready().await?;
    let conf_path = cfg.dir.join("nginx.conf");
    let mut nginx: Option<tokio::process::Child> = None;
    let mut status_done: std::collections::BTreeSet<(String, String)> = Default::default();
    // The generation of the configuration nginx was last seen serving.
    let mut loaded: Option<String> = None;
    loop {
        let ings: Vec<Ingress> = ingresses.state().iter().map(|x| (**x).clone()).collect();
        let cls: Vec<IngressClass> = classes.state().iter().map(|x| (**x).clone()).collect();
        let svcs: Vec<Service> = services.state().iter().map(|x| (**x).clone()).collect();
        let conf = render(&ings, &svcs, &cls, &cfg);
        let changed = write_if_changed(&conf_path, &conf)?;
        // Reap our child if it exited; an nginx left by an earlier kubeproxy (killed, so it
        // could not stop it) is adopted through its pid file instead of started twice.
        if let Some(c) = nginx.as_mut() {
            if c.try_wait().ok().flatten().is_some() {
                nginx = None;
            }
        }
        let running = nginx.is_some() || nginx_alive(&cfg.dir);
        let mut applied = false;
        if !running {
            let conf_s = conf_path.to_string_lossy().to_string();
            match tokio::process::Command::new("nginx")
                .args(["-c", &conf_s, "-g", "daemon off;"])
                .kill_on_drop(true)
                .spawn()
            {
                Ok(c) => {
                    tracing::info!(config = %conf_s, "started nginx");
                    nginx = Some(c);
                    applied = true;
                }
                Err(e) => tracing::error!(error = %e, "cannot start nginx"),
            }
        } else if changed {
            let conf_s = conf_path.to_string_lossy().to_string();
            let test = tokio::process::Command::new("nginx").args(["-t", "-q", "-c", &conf_s]).output().await?;
            if test.status.success() {
                let out = tokio::process::Command::new("nginx").args(["-c", &conf_s, "-s", "reload"]).output().await?;
                if out.status.success() {
                    reloads.inc();
                    tracing::info!("reloaded nginx: configuration changed");
                    applied = true;
                } else {
                    tracing::error!(stderr = %String::from_utf8_lossy(&out.stderr), "nginx reload failed");
                }
            } else {
                tracing::error!(stderr = %String::from_utf8_lossy(&test.stderr), "rendered nginx configuration is invalid; not reloading");
            }
        }
        // Only a configuration nginx really serves counts (after a start or reload, and
        // for an nginx adopted from an earlier kubeproxy).
        if applied || loaded.as_deref() != announced_generation(&conf) {
            loaded = wait_loaded(&cfg.dir, &conf).await.then(|| announced_generation(&conf).unwrap_or("").to_string());
            if loaded.is_none() {
                tracing::warn!("nginx does not serve the new configuration yet; Ingress status waits");
            }
        }
        // Publish this node's address in the status of the Ingresses nginx now serves —
        // what `kubectl get ingress` shows as ADDRESS, so users (and tests) can wait for it.
        if let (Some(ip), true) = (cfg.node_ip, loaded.is_some()) {
            for ing in ings.iter().filter(|i| serves(i, &cfg.class, cfg.without_class, &cls)) {
                let (Some(ns), Some(name)) = (ing.metadata.namespace.clone(), ing.metadata.name.clone()) else {
                    continue;
                };
                let has = ing
                    .status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|l| l.ingress.as_ref())
                    .is_some_and(|v| v.iter().any(|x| x.ip.as_deref() == Some(&ip.to_string())));
                if has || status_done.contains(&(ns.clone(), name.clone())) {
                    continue;
                }
                let api: Api<Ingress> = Api::namespaced(client.clone(), &ns);
                let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}});
                match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(ingress = %format!("{ns}/{name}"), error = %e, "cannot update Ingress status")
                    }
                }
                status_done.insert((ns, name));
            }
        }
        if loaded.is_some() {
            notify.notified().await;
        } else {
            // Look again soon: nginx may still be starting.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), notify.notified()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_service, svc};
    use serde_json::json;

    fn cfg() -> ControllerConfig {
        ControllerConfig {
            dir: "/run/kp".into(),
            class: "nginx".into(),
            without_class: false,
            http_port: 8080,
            node_ip: None,
        }
    }
    fn ing(v: serde_json::Value) -> Ingress {
        serde_json::from_value(v).unwrap()
    }
    fn myservice() -> Ingress {
        ing(json!({"metadata": {"name": "my", "namespace": "default"},
            "spec": {"ingressClassName": "nginx", "rules": [{"host": "myservice.com", "http": {"paths": [
                {"path": "/web", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "/other", "pathType": "Exact", "backend": {"service": {"name": "other", "port": {"name": "http"}}}}]}}]}}))
    }

    #[test]
    fn host_and_paths_render_to_locations_with_cluster_ip_upstreams() {
        let services = [simple_service("web", "10.96.0.10", 80), simple_service("other", "10.96.0.11", 8000)];
        let conf = render(&[myservice()], &services, &[], &cfg());
        assert!(conf.contains("server_name myservice.com;"));
        assert!(conf.contains("listen 8080;"));
        assert!(conf.contains("location = /web {\n            proxy_pass http://10.96.0.10:80;"));
        assert!(conf.contains("location /web/ {\n            proxy_pass http://10.96.0.10:80;"));
        assert!(conf.contains("location = /other {\n            proxy_pass http://10.96.0.11:8000;"), "{conf}");
        assert!(conf.contains("pid /run/kp/nginx.pid;"));
        // Unknown paths of that host: 404.
        assert!(conf.contains("location / {\n            return 404;"));
    }

    #[test]
    fn missing_service_gives_503_and_default_backend_is_used() {
        let i = ing(json!({"metadata": {"name": "d", "namespace": "default"},
            "spec": {"ingressClassName": "nginx", "defaultBackend": {"service": {"name": "web", "port": {"number": 80}}},
                     "rules": [{"host": "a.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": "gone", "port": {"number": 80}}}}]}}]}}));
        let conf = render(&[i], &[simple_service("web", "10.96.0.10", 80)], &[], &cfg());
        assert!(conf.contains("server_name a.com;\n        location / {\n            return 503;"), "{conf}");
        assert!(conf.contains("listen 8080 default_server;\n        server_name _;\n        location / {\n            proxy_pass http://10.96.0.10:80;"), "{conf}");
    }

    #[test]
    fn ingress_class_selection() {
        let mut other = myservice();
        other.spec.as_mut().unwrap().ingress_class_name = Some("traefik".into());
        assert!(!serves(&other, "nginx", false, &[]));
        let mut none = myservice();
        none.spec.as_mut().unwrap().ingress_class_name = None;
        assert!(!serves(&none, "nginx", false, &[]));
        let default: IngressClass = serde_json::from_value(json!({"metadata": {"name": "nginx",
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}}, "spec": {"controller": "k8s.io/ingress-nginx"}})).unwrap();
        assert!(serves(&none, "nginx", false, &[default]));
        let mut annotated = none.clone();
        annotated.metadata.annotations = Some([(CLASS_ANNOTATION.to_string(), "nginx".to_string())].into());
        assert!(serves(&annotated, "nginx", false, &[]));
        let conf = render(&[other.clone()], &[], &[], &cfg());
        assert!(!conf.contains("myservice.com"));
        // --watch-ingress-without-class: class-less ones too, never another class.
        assert!(serves(&none, "nginx", true, &[]));
        assert!(!serves(&other, "nginx", true, &[]));
    }

    #[test]
    fn rewrite_target_replaces_the_matched_prefix() {
        assert_eq!(rewrite("/web", false, "/").as_deref(), Some("rewrite ^/web/?(.*)$ /$1 break;"));
        assert_eq!(rewrite("/web/", false, "/app").as_deref(), Some("rewrite ^/web(.*)$ /app$1 break;"));
        assert_eq!(rewrite("/a.b", true, "/").as_deref(), Some("rewrite ^/a\\.b$ / break;"));
        // Regex paths, nginx variables and directive injection are not rewritten.
        assert_eq!(rewrite("/web(/|$)(.*)", false, "/$2"), None);
        assert_eq!(rewrite("/web", false, "/; return 200"), None);
        assert_eq!(rewrite("/web", false, "/x{"), None);
        let mut i = myservice();
        i.metadata.annotations = Some([(REWRITE_TARGET_ANNOTATION.to_string(), "/".to_string())].into());
        let conf = render(&[i], &[simple_service("web", "10.96.0.10", 80)], &[], &cfg());
        assert!(
            conf.contains("location /web/ {\n            rewrite ^/web/?(.*)$ /$1 break;\n            proxy_pass http://10.96.0.10:80;"),
            "{conf}"
        );
        assert!(conf.contains("location = /web {\n            rewrite ^/web/?(.*)$ /$1 break;"), "{conf}");
    }

    #[test]
    fn the_configuration_announces_its_generation_on_a_local_socket() {
        let a = render(&[], &[], &[], &cfg());
        assert!(a.contains("listen unix:/run/kp/status.sock;"), "{a}");
        let gen = announced_generation(&a).unwrap();
        assert_eq!(gen.len(), 16);
        assert!(a.ends_with("    }\n}\n"));
        let mut other = cfg();
        other.http_port = 8081;
        let b = render(&[], &[], &[], &other);
        assert_ne!(announced_generation(&b).unwrap(), gen, "another configuration, another generation");
        assert_eq!(announced_generation(&render(&[], &[], &[], &cfg())).unwrap(), gen, "deterministic");
    }

    #[test]
    fn rendering_is_deterministic_and_write_detects_changes() {
        let services = [
            simple_service("web", "10.96.0.10", 80),
            svc(json!({"metadata": {"name": "other", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.11", "ports": [{"name": "http", "port": 8000}]}})),
        ];
        let a = render(&[myservice()], &services, &[], &cfg());
        assert_eq!(a, render(&[myservice()], &services, &[], &cfg()));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nginx.conf");
        assert!(write_if_changed(&p, &a).unwrap());
        assert!(!write_if_changed(&p, &a).unwrap());
        assert!(write_if_changed(&p, "x").unwrap());
    }
}
