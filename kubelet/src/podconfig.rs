//! Pure translation of a pod's spec into what Docker needs: environment (with `valueFrom`
//! and `envFrom` resolved against ConfigMaps and Secrets fetched beforehand), the files of
//! projected volumes, and the container create body (command, mounts, resources, security
//! context, namespaces shared with the pause container).

use std::collections::{BTreeMap, HashMap};

use apimachinery::quantity;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EphemeralContainer, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::devicemanager::ContainerDevices;
use crate::labels::{self, Kind, PodRef};
use crate::runtime::{ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig};

/// A spec the kubelet cannot turn into a container: the pod waits with
/// `CreateContainerConfigError` and this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The ConfigMaps and Secrets of the pod's namespace that the spec references (None: not found).
#[derive(Debug, Default, Clone)]
pub struct Lookups {
    pub config_maps: HashMap<String, Option<ConfigMap>>,
    pub secrets: HashMap<String, Option<Secret>>,
    /// The Services of the pod's namespace and of `default`; [`crate::envvars::visible`]
    /// picks those the pod sees.
    pub services: Vec<Service>,
    /// ServiceAccount tokens of the projected volumes, by (audience, expirationSeconds).
    pub tokens: HashMap<(String, i64), String>,
}

impl Lookups {
    fn config_map(&self, name: &str) -> Option<&ConfigMap> {
        self.config_maps.get(name).and_then(Option::as_ref)
    }
    fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.get(name).and_then(Option::as_ref)
    }
}

/// Names of the ConfigMaps and Secrets the pod references (env, envFrom, volumes).
pub fn referenced_objects(pod: &Pod) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    let Some(spec) = pod.spec.as_ref() else { return (cms, secrets) };
    for c in spec.init_containers.iter().flatten().chain(spec.containers.iter()) {
        for e in c.env.iter().flatten() {
            if let Some(vf) = &e.value_from {
                if let Some(r) = &vf.config_map_key_ref {
                    cms.push(r.name.clone());
                }
                if let Some(r) = &vf.secret_key_ref {
                    secrets.push(r.name.clone());
                }
            }
        }
        for ef in c.env_from.iter().flatten() {
            if let Some(r) = &ef.config_map_ref {
                cms.push(r.name.clone());
            }
            if let Some(r) = &ef.secret_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            cms.push(c.name.clone());
        }
        if let Some(s) = &v.secret {
            secrets.extend(s.secret_name.clone());
        }
        if let Some(p) = &v.projected {
            for s in p.sources.iter().flatten() {
                if let Some(c) = &s.config_map {
                    cms.push(c.name.clone());
                }
                if let Some(s) = &s.secret {
                    secrets.push(s.name.clone());
                }
            }
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// The value of a downward-API field path.
pub fn field_value(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Result<String, ConfigError> {
    let m = &pod.metadata;
    let spec = pod.spec.clone().unwrap_or_default();
    let map_key = |prefix: &str, map: &Option<BTreeMap<String, String>>| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    let render = |map: &Option<BTreeMap<String, String>>| {
        map.iter().flatten().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join("\n")
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => render(&m.labels),
        "metadata.annotations" => render(&m.annotations),
        "spec.nodeName" => spec.node_name.unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        _ => {
            if let Some(v) = map_key("metadata.labels['", &m.labels) {
                v
            } else if let Some(v) = map_key("metadata.annotations['", &m.annotations) {
                v
            } else {
                return Err(ConfigError(format!("unsupported fieldPath {path:?}")));
            }
        }
    })
}

fn quantity_value(container: &Container, resource: &str, divisor: Option<&Quantity>) -> String {
    let res = container.resources.clone().unwrap_or_default();
    let (which, name) = resource.split_once('.').unwrap_or(("limits", resource));
    let q = if which == "requests" { res.requests } else { res.limits };
    let Some(q) = q.and_then(|m| m.get(name).cloned()) else { return "0".into() };
    let v = if name == "cpu" { quantity::milli_value(&q.0) as f64 / 1000.0 } else { quantity::value(&q.0) as f64 };
    let d = divisor.map(|d| {
        if name == "cpu" {
            quantity::milli_value(&d.0) as f64 / 1000.0
        } else {
            quantity::value(&d.0) as f64
        }
    });
    let d = d.filter(|d| *d > 0.0).unwrap_or(1.0);
    format!("{}", (v / d).ceil() as i64)
}

/// The container's environment as `NAME=value`, in Kubernetes' order: the Services'
/// variables, then envFrom, then env (later wins), with `$(VAR)` references expanded.
pub fn environment(
    pod: &Pod,
    c: &Container,
    pod_ip: &str,
    host_ip: &str,
    l: &Lookups,
) -> Result<Vec<String>, ConfigError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(e) = env.iter_mut().find(|(n, _)| *n == k) {
            e.1 = v;
        } else {
            env.push((k, v));
        }
    };
    let service_links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    for (k, v) in crate::envvars::from_services(&crate::envvars::visible(&l.services, &ns, service_links)) {
        set(&mut env, k, v);
    }
    for ef in c.env_from.iter().flatten() {
        let prefix = ef.prefix.clone().unwrap_or_default();
        if let Some(r) = &ef.config_map_ref {
            match l.config_map(&r.name) {
                Some(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        set(&mut env, format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(ConfigError(format!("configmap \"{}\" not found", r.name))),
            }
        }
        if let Some(r) = &ef.secret_ref {
            match l.secret(&r.name) {
                Some(s) => {
                    for (k, v) in s.data.iter().flatten() {
                        set(&mut env, format!("{prefix}{k}"), String::from_utf8_lossy(&v.0).into_owned());
                    }
                    for (k, v) in s.string_data.iter().flatten() {
                        set(&mut env, format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(ConfigError(format!("secret \"{}\" not found", r.name))),
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            None => expand(e.value.as_deref().unwrap_or_default(), &env),
            Some(vf) => {
                if let Some(f) = &vf.field_ref {
                    field_value(pod, &f.field_path, pod_ip, host_ip)?
                } else if let Some(r) = &vf.resource_field_ref {
                    let target = r.container_name.as_deref().filter(|n| !n.is_empty());
                    let spec = pod.spec.clone().unwrap_or_default();
                    let tc = target.and_then(|n| spec.containers.iter().find(|x| x.name == n)).unwrap_or(c);
                    quantity_value(tc, &r.resource, r.divisor.as_ref())
                } else if let Some(r) = &vf.config_map_key_ref {
                    match l.config_map(&r.name) {
                        Some(cm) => match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                            Some(v) => v.clone(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Err(ConfigError(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                )))
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Err(ConfigError(format!("configmap \"{}\" not found", r.name))),
                    }
                } else if let Some(r) = &vf.secret_key_ref {
                    match l.secret(&r.name) {
                        Some(s) => match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None => match s.string_data.as_ref().and_then(|d| d.get(&r.key)) {
                                Some(v) => v.clone(),
                                None if r.optional == Some(true) => continue,
                                None => {
                                    return Err(ConfigError(format!(
                                        "couldn't find key {} in Secret {ns}/{}",
                                        r.key, r.name
                                    )))
                                }
                            },
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Err(ConfigError(format!("secret \"{}\" not found", r.name))),
                    }
                } else {
                    String::new()
                }
            }
        };
        set(&mut env, e.name.clone(), value);
    }
    Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}

/// Expand `$(VAR)` from `env`; `$$` escapes; unknown references stay as written.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(j) => {
                    let name = &inner[..j];
                    match env.iter().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[j + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn env_pairs(env: &[String]) -> Vec<(String, String)> {
    env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Everything the create body depends on besides the pod and container specs.
pub struct ContainerContext<'a> {
    pub node: &'a str,
    pub kind: Kind,
    pub restart_count: i32,
    pub sandbox_id: &'a str,
    pub env: Vec<String>,
    /// Volume name → host path.
    pub volume_paths: &'a HashMap<String, String>,
    pub host_network: bool,
    /// Docker's `--pid`: `container:<id>` to share a target container's process namespace
    /// (an ephemeral container's `targetContainerName`).
    pub pid_mode: Option<String>,
    /// Docker's `--runtime`: the handler of the pod's RuntimeClass.
    pub runtime: Option<String>,
}

/// An ephemeral container as the container it runs as (the same fields, less the target).
pub fn ephemeral_as_container(e: &EphemeralContainer) -> Container {
    serde_json::to_value(e).ok().and_then(|v| serde_json::from_value(v).ok()).unwrap_or_else(|| Container {
        name: e.name.clone(),
        image: e.image.clone(),
        ..Default::default()
    })
}

/// The Docker create body of an init, app or ephemeral container.
pub fn container_body(pod: &Pod, c: &Container, cx: &ContainerContext) -> Result<ContainerCreateBody, ConfigError> {
    let pr = pod_ref(pod);
    let env_pairs = env_pairs(&cx.env);
    let mut binds = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(host) = cx.volume_paths.get(&m.name) else {
            return Err(ConfigError(format!(
                "cannot find volume \"{}\" to mount into container \"{}\"",
                m.name, c.name
            )));
        };
        let mut host = host.clone();
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if sub.split('/').any(|p| p == "..") || sub.starts_with('/') {
                return Err(ConfigError(format!("invalid subPath {sub:?}")));
            }
            host = format!("{host}/{sub}");
        }
        // A claim mounted `readOnly` in the pod's volume is read-only in every container.
        let claim_ro = pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).is_some_and(|vs| {
            vs.iter().any(|v| {
                v.name == m.name && v.persistent_volume_claim.as_ref().is_some_and(|c| c.read_only == Some(true))
            })
        });
        let ro = if m.read_only == Some(true) || claim_ro { ":ro" } else { "" };
        binds.push(format!("{host}:{}{ro}", m.mount_path));
    }
    let res = c.resources.clone().unwrap_or_default();
    let limit = |n: &str| res.limits.as_ref().and_then(|l| l.get(n)).map(|q| q.0.clone());
    let request = |n: &str| res.requests.as_ref().and_then(|l| l.get(n)).map(|q| q.0.clone());
    let cpu_shares = request("cpu").or_else(|| limit("cpu")).map(|q| (quantity::milli_value(&q) * 1024 / 1000).max(2));
    let nano_cpus = limit("cpu").map(|q| quantity::milli_value(&q) * 1_000_000).filter(|n| *n > 0);
    let memory = limit("memory").map(|q| quantity::value(&q)).filter(|m| *m > 0);
    let sc = c.security_context.clone().unwrap_or_default();
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.clone()).unwrap_or_default();
    let user = sc.run_as_user.or(psc.run_as_user).map(|u| match sc.run_as_group.or(psc.run_as_group) {
        Some(g) => format!("{u}:{g}"),
        None => u.to_string(),
    });
    let caps = sc.capabilities.clone().unwrap_or_default();
    let sandbox = format!("container:{}", cx.sandbox_id);
    let host_config = HostConfig {
        binds: Some(binds),
        network_mode: Some(if cx.host_network { "host".into() } else { sandbox.clone() }),
        ipc_mode: Some(sandbox),
        pid_mode: cx.pid_mode.clone(),
        memory,
        memory_swap: memory,
        nano_cpus,
        cpu_shares,
        privileged: sc.privileged,
        cap_add: caps.add.filter(|a| !a.is_empty()),
        cap_drop: caps.drop.filter(|a| !a.is_empty()),
        readonly_rootfs: sc.read_only_root_filesystem,
        oom_score_adj: Some(if memory.is_some() { 900 } else { 1000 }.min(1000)),
        runtime: cx.runtime.clone(),
        ..Default::default()
    };
    let expand_all =
        |v: &Option<Vec<String>>| v.as_ref().map(|v| v.iter().map(|s| expand(s, &env_pairs)).collect::<Vec<_>>());
    Ok(ContainerCreateBody {
        image: c.image.clone(),
        entrypoint: expand_all(&c.command),
        cmd: expand_all(&c.args),
        env: Some(cx.env.clone()),
        working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
        user,
        tty: c.tty,
        open_stdin: c.stdin,
        stdin_once: c.stdin_once,
        labels: Some(labels::container_labels(cx.node, &pr, &c.name, cx.kind, cx.restart_count)),
        stop_signal: Some("SIGTERM".into()),
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// Docker's device requests for CDI device names: NVIDIA GPUs (`nvidia.com/gpu=<id>`) as one
/// request for the `nvidia` driver with the `gpu` capability (what `docker run --gpus
/// device=<id>` sends, carried out by the NVIDIA container toolkit); any other name as a
/// request for Docker's `cdi` driver (Docker 25 and later with CDI enabled).
pub fn device_requests(cdi: &[String]) -> Vec<DeviceRequest> {
    let mut gpus = Vec::new();
    let mut out = Vec::new();
    for name in cdi {
        match name.strip_prefix("nvidia.com/gpu=") {
            Some(id) => gpus.push(id.to_string()),
            None => out.push(DeviceRequest {
                driver: Some("cdi".into()),
                device_ids: Some(vec![name.clone()]),
                ..Default::default()
            }),
        }
    }
    if !gpus.is_empty() {
        out.insert(
            0,
            DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(gpus),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            },
        );
    }
    out
}

/// Add what a container's device plugins asked for to its create body: environment
/// variables, bind mounts, device nodes, runtime annotations (as labels: Docker's API here
/// has no annotations) and CDI devices.
pub fn add_devices(body: &mut ContainerCreateBody, d: &ContainerDevices) {
    let env = body.env.get_or_insert_with(Vec::new);
    env.extend(d.envs.iter().map(|(k, v)| format!("{k}={v}")));
    let labels = body.labels.get_or_insert_with(HashMap::new);
    labels.extend(d.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    let h = body.host_config.get_or_insert_with(HostConfig::default);
    let binds = h.binds.get_or_insert_with(Vec::new);
    binds.extend(
        d.mounts
            .iter()
            .map(|m| format!("{}:{}{}", m.host_path, m.container_path, if m.read_only { ":ro" } else { "" })),
    );
    if !d.devices.is_empty() {
        h.devices.get_or_insert_with(Vec::new).extend(d.devices.iter().map(|s| DeviceMapping {
            path_on_host: Some(s.host_path.clone()),
            path_in_container: Some(s.container_path.clone()),
            cgroup_permissions: Some(if s.permissions.is_empty() { "rwm".into() } else { s.permissions.clone() }),
        }));
    }
    let requests = device_requests(&d.cdi);
    if !requests.is_empty() {
        h.device_requests.get_or_insert_with(Vec::new).extend(requests);
    }
}

/// The pause container: owns the pod's network namespace (`none`: the kubelet plugs it in)
/// and its IPC namespace.
pub fn sandbox_body(pod: &Pod, node: &str, image: &str, pod_ip: &str, host_network: bool) -> ContainerCreateBody {
    let pr = pod_ref(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let mut l = labels::container_labels(node, &pr, labels::SANDBOX_NAME, Kind::Sandbox, 0);
    l.insert(labels::POD_IP.into(), pod_ip.into());
    l.insert(labels::GRACE_PERIOD.into(), spec.termination_grace_period_seconds.unwrap_or(30).to_string());
    let hostname = spec.hostname.clone().or_else(|| pod.metadata.name.clone()).map(|h| h.chars().take(63).collect());
    ContainerCreateBody {
        image: Some(image.to_string()),
        hostname: if host_network { None } else { hostname },
        labels: Some(l),
        host_config: Some(HostConfig {
            network_mode: Some(if host_network { "host".into() } else { "none".into() }),
            ipc_mode: Some("shareable".into()),
            cpu_shares: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn device_plugin_answers_become_docker_settings() {
        use deviceplugin::v1beta1::{DeviceSpec, Mount};
        let d = ContainerDevices {
            envs: [("WIDGET_DEVICES".to_string(), "widget-1".to_string())].into(),
            mounts: vec![Mount {
                container_path: "/devices/widget-1".into(),
                host_path: "/s/widget-1".into(),
                read_only: true,
            }],
            devices: vec![DeviceSpec {
                container_path: "/dev/widget-1".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: [("example.com/widget".to_string(), "widget-1".to_string())].into(),
            cdi: vec!["nvidia.com/gpu=GPU-e953baca-0a92-4ed5-9e3f-7362da89242f".into(), "vendor.com/fpga=f0".into()],
            ..Default::default()
        };
        let mut body = ContainerCreateBody { env: Some(vec!["A=1".into()]), ..Default::default() };
        add_devices(&mut body, &d);
        assert_eq!(body.env.unwrap(), ["A=1", "WIDGET_DEVICES=widget-1"]);
        assert_eq!(body.labels.unwrap()["example.com/widget"], "widget-1");
        let h = body.host_config.unwrap();
        assert_eq!(h.binds.unwrap(), ["/s/widget-1:/devices/widget-1:ro"]);
        let dev = &h.devices.unwrap()[0];
        assert_eq!(dev.path_on_host.as_deref(), Some("/dev/null"));
        assert_eq!(dev.path_in_container.as_deref(), Some("/dev/widget-1"));
        assert_eq!(dev.cgroup_permissions.as_deref(), Some("rw"));
        let reqs = h.device_requests.unwrap();
        // `docker run --gpus device=<uuid>`'s request, then the other CDI device.
        assert_eq!(reqs[0].driver.as_deref(), Some("nvidia"));
        assert_eq!(reqs[0].device_ids.as_deref(), Some(&["GPU-e953baca-0a92-4ed5-9e3f-7362da89242f".to_string()][..]));
        assert_eq!(reqs[0].capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(reqs[1].driver.as_deref(), Some("cdi"));
        assert_eq!(reqs[1].device_ids.as_deref(), Some(&["vendor.com/fpga=f0".to_string()][..]));
        assert!(device_requests(&[]).is_empty());
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn sample() -> Pod {
        pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1", "containers": [{
                "name": "c", "image": "busybox", "command": ["sh", "-c"], "args": ["echo $(GREETING)"],
                "workingDir": "/tmp",
                "env": [
                    {"name": "GREETING", "value": "hi"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
                    {"name": "S", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
                    {"name": "REF", "value": "$(GREETING)-there"}
                ],
                "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
                "volumeMounts": [{"name": "www", "mountPath": "/www"}, {"name": "cfg", "mountPath": "/cfg", "readOnly": true}],
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "100m"}},
                "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["NET_ADMIN"]}}
            }]}
        }))
    }

    fn lookups() -> Lookups {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"k": "v"}})).unwrap();
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": "sec"}, "data": {"pw": "c2VjcmV0"}})).unwrap();
        Lookups {
            config_maps: HashMap::from([("cm".to_string(), Some(cm))]),
            secrets: HashMap::from([("sec".to_string(), Some(s))]),
            services: vec![serde_json::from_value(json!({
                "metadata": {"name": "kubernetes", "namespace": "default"},
                "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]},
            }))
            .unwrap()],
            tokens: HashMap::new(),
        }
    }

    #[test]
    fn services_come_first_and_the_container_s_own_variables_win() {
        let mut p = sample();
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.env
            .get_or_insert_with(Vec::new)
            .push(serde_json::from_value(json!({"name": "KUBERNETES_SERVICE_PORT", "value": "1"})).unwrap());
        c.env
            .get_or_insert_with(Vec::new)
            .push(serde_json::from_value(json!({"name": "API", "value": "$(KUBERNETES_SERVICE_HOST)"})).unwrap());
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        let env = environment(&p, &c, "", "", &lookups()).unwrap();
        for want in [
            "KUBERNETES_SERVICE_HOST=10.96.0.1",
            "KUBERNETES_SERVICE_PORT=1",
            "API=10.96.0.1",
            "KUBERNETES_PORT=tcp://10.96.0.1:443",
        ] {
            assert!(env.contains(&want.to_string()), "{want} missing from {env:?}");
        }
    }

    #[test]
    fn env_resolves_every_source() {
        let p = sample();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let env = environment(&p, c, "10.0.0.5", "192.168.1.1", &lookups()).unwrap();
        for want in ["CM_k=v", "GREETING=hi", "POD=p", "APP=x", "IP=10.0.0.5", "K=v", "S=secret", "REF=hi-there"] {
            assert!(env.contains(&want.to_string()), "{want} missing from {env:?}");
        }
    }

    #[test]
    fn missing_config_map_is_a_config_error() {
        let p = sample();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let err = environment(&p, c, "", "", &Lookups::default()).unwrap_err();
        assert_eq!(err.0, "configmap \"cm\" not found");
    }

    #[test]
    fn referenced_objects_are_found() {
        assert_eq!(referenced_objects(&sample()), (vec!["cm".to_string()], vec!["sec".to_string()]));
    }

    #[test]
    fn create_body_maps_the_spec() {
        let p = sample();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let paths =
            HashMap::from([("www".to_string(), "/r/www".to_string()), ("cfg".to_string(), "/r/cfg".to_string())]);
        let env = environment(&p, c, "", "", &lookups()).unwrap();
        let cx = ContainerContext {
            node: "n1",
            kind: Kind::App,
            restart_count: 2,
            sandbox_id: "abc",
            env,
            volume_paths: &paths,
            host_network: false,
            pid_mode: None,
            runtime: None,
        };
        let b = container_body(&p, c, &cx).unwrap();
        assert_eq!(b.entrypoint, Some(vec!["sh".to_string(), "-c".to_string()]));
        assert_eq!(b.cmd, Some(vec!["echo hi".to_string()]));
        assert_eq!(b.working_dir.as_deref(), Some("/tmp"));
        assert_eq!(b.user.as_deref(), Some("1000"));
        let h = b.host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("container:abc"));
        assert_eq!(h.binds.unwrap(), vec!["/r/www:/www".to_string(), "/r/cfg:/cfg:ro".to_string()]);
        assert_eq!(h.memory, Some(64 * 1024 * 1024));
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.cpu_shares, Some(102));
        assert_eq!(h.cap_add, Some(vec!["NET_ADMIN".to_string()]));
        let l = b.labels.unwrap();
        assert_eq!(l[labels::RESTART_COUNT], "2");
        assert_eq!(l[labels::NODE], "n1");
    }

    #[test]
    fn missing_volume_is_a_config_error() {
        let p = sample();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let cx = ContainerContext {
            node: "n1",
            kind: Kind::App,
            restart_count: 0,
            sandbox_id: "abc",
            env: vec![],
            volume_paths: &HashMap::new(),
            host_network: false,
            pid_mode: None,
            runtime: None,
        };
        assert!(container_body(&p, c, &cx).is_err());
    }

    #[test]
    fn expansion() {
        let env = vec![("A".to_string(), "1".to_string())];
        assert_eq!(expand("$(A)-$(B)-$$(A)", &env), "1-$(B)-$(A)");
    }
}
