//! `kubectl describe TYPE [NAME…]`: the sections people expect for pods, nodes, deployments,
//! replicasets and services (a generic form for other kinds), then the object's core/v1
//! Events found with `involvedObject.*` field selectors. Text built by pure functions and
//! aligned like Go's tabwriter.

use serde_json::{json, Value};

use super::describe_more;
use super::get::parse_args;
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::print::{age, tabwriter::tabwrite};
use crate::resources::ApiRes;

/// Show details of a specific resource or group of resources.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE [NAME_PREFIX…] or TYPE/NAME
    pub args: Vec<String>,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// If present, list the requested object(s) across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// If true, display events related to the described object.
    #[arg(long, default_value = "true", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub show_events: bool,
}

pub(crate) fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or_default()
}

pub(crate) fn or_unset(x: &str) -> &str {
    if x.is_empty() {
        "<unset>"
    } else {
        x
    }
}

/// kubectl's describe time format (RFC 1123 with numeric zone).
pub(crate) fn when(v: &Value, p: &str) -> String {
    match v.pointer(p).and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok()) {
        Some(t) => t.strftime("%a, %d %b %Y %H:%M:%S +0000").to_string(),
        None => "<unknown>".into(),
    }
}

/// The `name` of every object in a list (containers, volumes, object references).
pub(crate) fn names(list: Option<&Value>) -> Vec<&str> {
    list.and_then(Value::as_array).into_iter().flatten().filter_map(|v| v.get("name").and_then(Value::as_str)).collect()
}

pub(crate) fn or_none(x: &str) -> &str {
    if x.is_empty() {
        "<none>"
    } else {
        x
    }
}

/// `Key:\tk=v` with further entries on their own lines, as kubectl prints label maps.
pub(crate) fn map_lines(out: &mut String, indent: &str, key: &str, m: Option<&Value>, sep: &str) {
    let mut kv: Vec<String> = m
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != crate::merge::LAST_APPLIED)
        .map(|(k, v)| format!("{k}{sep}{}", v.as_str().map(String::from).unwrap_or_else(|| v.to_string())))
        .collect();
    kv.sort();
    if kv.is_empty() {
        out.push_str(&format!("{indent}{key}:\t<none>\n"));
        return;
    }
    for (i, x) in kv.iter().enumerate() {
        if i == 0 {
            out.push_str(&format!("{indent}{key}:\t{x}\n"));
        } else {
            out.push_str(&format!("{indent}\t{x}\n"));
        }
    }
}

pub(crate) fn meta_header(out: &mut String, o: &Value, namespaced: bool) {
    out.push_str(&format!("Name:\t{}\n", s(o, "/metadata/name")));
    if namespaced {
        out.push_str(&format!("Namespace:\t{}\n", s(o, "/metadata/namespace")));
    }
}

fn containers(out: &mut String, title: &str, list: Option<&Value>, statuses: Option<&Value>, ind: (&str, &str, &str)) {
    let (t, n, f) = ind;
    let sub = format!("{f}  ");
    let Some(list) = list.and_then(Value::as_array).filter(|l| !l.is_empty()) else { return };
    out.push_str(&format!("{t}{title}:\n"));
    for c in list {
        let name = s(c, "/name");
        out.push_str(&format!("{n}{name}:\n"));
        let st = statuses
            .and_then(Value::as_array)
            .and_then(|ss| ss.iter().find(|x| x.get("name").and_then(Value::as_str) == Some(name)));
        if let Some(st) = st {
            out.push_str(&format!("{f}Container ID:\t{}\n", s(st, "/containerID")));
        }
        out.push_str(&format!("{f}Image:\t{}\n", s(c, "/image")));
        if let Some(st) = st {
            out.push_str(&format!("{f}Image ID:\t{}\n", s(st, "/imageID")));
        }
        let ports: Vec<String> = c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.get("containerPort").map(|x| x.to_string()).unwrap_or_default(),
                    p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                )
            })
            .collect();
        out.push_str(&format!("{f}Port:\t{}\n", or_none(&ports.join(", "))));
        out.push_str(&format!(
            "{f}Host Port:\t{}\n",
            if ports.is_empty() {
                "<none>".to_string()
            } else {
                ports
                    .iter()
                    .map(|p| format!("0/{}", p.split('/').nth(1).unwrap_or("TCP")))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
        for (k, title) in [("command", "Command"), ("args", "Args")] {
            if let Some(a) = c.get(k).and_then(Value::as_array) {
                out.push_str(&format!("{f}{title}:\n"));
                for x in a {
                    out.push_str(&format!("{sub}{}\n", x.as_str().unwrap_or_default()));
                }
            }
        }
        if let Some(st) = st {
            let (state, detail) = match st.get("state").and_then(Value::as_object).and_then(|m| m.iter().next()) {
                Some((k, v)) => (k.clone(), v.clone()),
                None => ("waiting".into(), Value::Null),
            };
            let mut cap = state.clone();
            if let Some(f) = cap.get_mut(0..1) {
                f.make_ascii_uppercase();
            }
            out.push_str(&format!("{f}State:\t{cap}\n"));
            if let Some(r) = detail.get("reason").and_then(Value::as_str) {
                out.push_str(&format!("{sub}Reason:\t{r}\n"));
            }
            if let Some(t) = detail.get("startedAt").and_then(Value::as_str) {
                out.push_str(&format!("{sub}Started:\t{t}\n"));
            }
            out.push_str(&format!(
                "{f}Ready:\t{}\n",
                if st.get("ready").and_then(Value::as_bool).unwrap_or(false) { "True" } else { "False" }
            ));
            out.push_str(&format!(
                "{f}Restart Count:\t{}\n",
                st.get("restartCount").and_then(Value::as_i64).unwrap_or(0)
            ));
        }
        for (k, title) in [("limits", "Limits"), ("requests", "Requests")] {
            if let Some(m) = c.pointer(&format!("/resources/{k}")).and_then(Value::as_object) {
                out.push_str(&format!("{f}{title}:\n"));
                for (rk, rv) in m {
                    out.push_str(&format!(
                        "{sub}{rk}:\t{}\n",
                        rv.as_str().map(String::from).unwrap_or_else(|| rv.to_string())
                    ));
                }
            }
        }
        for (k, title) in [("livenessProbe", "Liveness"), ("readinessProbe", "Readiness"), ("startupProbe", "Startup")]
        {
            if let Some(p) = c.get(k) {
                out.push_str(&format!("{f}{title}:\t{}\n", probe(p)));
            }
        }
        let env: Vec<&Value> = c.get("env").and_then(Value::as_array).into_iter().flatten().collect();
        if env.is_empty() {
            out.push_str(&format!("{f}Environment:\t<none>\n"));
        } else {
            out.push_str(&format!("{f}Environment:\n"));
            for e in env {
                let v = match e.get("value").and_then(Value::as_str) {
                    Some(v) => v.to_string(),
                    None => "<set to a reference>".into(),
                };
                out.push_str(&format!("{sub}{}:\t{v}\n", s(e, "/name")));
            }
        }
        let mounts: Vec<&Value> = c.get("volumeMounts").and_then(Value::as_array).into_iter().flatten().collect();
        if mounts.is_empty() {
            out.push_str(&format!("{f}Mounts:\t<none>\n"));
        } else {
            out.push_str(&format!("{f}Mounts:\n"));
            for m in mounts {
                let ro = if m.get("readOnly").and_then(Value::as_bool).unwrap_or(false) { "ro" } else { "rw" };
                out.push_str(&format!("{sub}{} from {} ({ro})\n", s(m, "/mountPath"), s(m, "/name")));
            }
        }
    }
}

/// `http-get http://:8080/index.html delay=0s timeout=1s period=2s #success=1 #failure=3`
fn probe(p: &Value) -> String {
    let i = |k: &str, d: i64| p.get(k).and_then(Value::as_i64).unwrap_or(d);
    let how = if let Some(h) = p.get("httpGet") {
        let port =
            h.get("port").map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string())).unwrap_or_default();
        let scheme = s(h, "/scheme").to_lowercase();
        let scheme = if scheme.is_empty() { String::new() } else { format!("{scheme}:") };
        format!("http-get {scheme}//{}:{port}{}", s(h, "/host"), s(h, "/path"))
    } else if let Some(t) = p.get("tcpSocket") {
        format!(
            "tcp-socket :{}",
            t.get("port").map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string())).unwrap_or_default()
        )
    } else if let Some(e) = p.pointer("/exec/command").and_then(Value::as_array) {
        format!("exec [{}]", e.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
    } else {
        "unknown".into()
    };
    format!(
        "{how} delay={}s timeout={}s period={}s #success={} #failure={}",
        i("initialDelaySeconds", 0),
        i("timeoutSeconds", 0),
        i("periodSeconds", 0),
        i("successThreshold", 0),
        i("failureThreshold", 0)
    )
}

fn conditions(out: &mut String, o: &Value) {
    let conds: Vec<&Value> = o.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().collect();
    if conds.is_empty() {
        return;
    }
    out.push_str("Conditions:\n  Type\tStatus\n");
    for c in conds {
        out.push_str(&format!("  {}\t{}\n", s(c, "/type"), s(c, "/status")));
    }
}

/// The pod section. Pure.
pub fn describe_pod(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    out.push_str(&format!("Priority:\t{}\n", o.pointer("/spec/priority").and_then(Value::as_i64).unwrap_or(0)));
    out.push_str(&format!("Service Account:\t{}\n", or_none(s(o, "/spec/serviceAccountName"))));
    let node = s(o, "/spec/nodeName");
    let host = s(o, "/status/hostIP");
    out.push_str(&format!("Node:\t{}\n", if node.is_empty() { "<none>".into() } else { format!("{node}/{host}") }));
    if o.pointer("/status/startTime").is_some() {
        out.push_str(&format!("Start Time:\t{}\n", when(o, "/status/startTime")));
    }
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    let status = if o.pointer("/metadata/deletionTimestamp").is_some() { "Terminating" } else { s(o, "/status/phase") };
    out.push_str(&format!("Status:\t{status}\n"));
    out.push_str(&format!("IP:\t{}\n", s(o, "/status/podIP")));
    let ips: Vec<&str> = o
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.get("ip").and_then(Value::as_str))
        .collect();
    if ips.is_empty() {
        out.push_str("IPs:\t<none>\n");
    } else {
        out.push_str("IPs:\n");
        for ip in ips {
            out.push_str(&format!("  IP:\t{ip}\n"));
        }
    }
    if let Some(owner) = o.pointer("/metadata/ownerReferences/0") {
        out.push_str(&format!("Controlled By:\t{}/{}\n", s(owner, "/kind"), s(owner, "/name")));
    }
    containers(
        &mut out,
        "Init Containers",
        o.pointer("/spec/initContainers"),
        o.pointer("/status/initContainerStatuses"),
        ("", "  ", "    "),
    );
    containers(
        &mut out,
        "Containers",
        o.pointer("/spec/containers"),
        o.pointer("/status/containerStatuses"),
        ("", "  ", "    "),
    );
    conditions(&mut out, o);
    let vols: Vec<&Value> = o.pointer("/spec/volumes").and_then(Value::as_array).into_iter().flatten().collect();
    if vols.is_empty() {
        out.push_str("Volumes:\t<none>\n");
    } else {
        out.push_str("Volumes:\n");
        for v in vols {
            out.push_str(&format!("  {}:\n", s(v, "/name")));
            let (ty, desc) = if v.get("emptyDir").is_some() {
                (
                    "EmptyDir",
                    format!(
                        "EmptyDir (a temporary directory that shares a pod's lifetime)\n    Medium:\t{}\n    SizeLimit:\t{}",
                        s(v, "/emptyDir/medium"),
                        or_unset(s(v, "/emptyDir/sizeLimit"))
                    ),
                )
            } else if let Some(c) = v.get("configMap") {
                ("ConfigMap", format!("ConfigMap (a volume populated by a ConfigMap)\n    Name:\t{}", s(c, "/name")))
            } else if let Some(c) = v.get("secret") {
                ("Secret", format!("Secret (a volume populated by a Secret)\n    SecretName:\t{}", s(c, "/secretName")))
            } else if let Some(c) = v.get("persistentVolumeClaim") {
                (
                    "PVC",
                    format!(
                        "PersistentVolumeClaim (a reference to a PersistentVolumeClaim in the same namespace)\n    ClaimName:\t{}\n    ReadOnly:\t{}",
                        s(c, "/claimName"),
                        c.get("readOnly").and_then(Value::as_bool).unwrap_or(false)
                    ),
                )
            } else if let Some(c) = v.get("hostPath") {
                ("HostPath", format!("HostPath (bare host directory volume)\n    Path:\t{}", s(c, "/path")))
            } else {
                ("Other", "<unknown>".to_string())
            };
            let _ = ty;
            out.push_str(&format!("    Type:\t{desc}\n"));
        }
    }
    out.push_str(&format!("QoS Class:\t{}\n", or_none(s(o, "/status/qosClass"))));
    map_lines(&mut out, "", "Node-Selectors", o.pointer("/spec/nodeSelector"), "=");
    let mut tols: Vec<String> = o
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            let mut x = s(t, "/key").to_string();
            if let Some(v) = t.get("value").and_then(Value::as_str) {
                x.push_str(&format!("={v}"));
            }
            if let Some(e) = t.get("effect").and_then(Value::as_str) {
                x.push_str(&format!(":{e}"));
            }
            if x.is_empty() {
                x = format!("op={}", s(t, "/operator"));
            }
            x
        })
        .collect();
    tols.sort();
    if tols.is_empty() {
        out.push_str("Tolerations:\t<none>\n");
    } else {
        for (i, t) in tols.iter().enumerate() {
            out.push_str(&format!("{}\t{t}\n", if i == 0 { "Tolerations:" } else { "" }));
        }
    }
    out
}

pub(crate) fn template(out: &mut String, t: Option<&Value>) {
    let Some(t) = t else { return };
    out.push_str("Pod Template:\n");
    map_lines(out, "  ", "Labels", t.pointer("/metadata/labels"), "=");
    if t.pointer("/metadata/annotations").is_some() {
        map_lines(out, "  ", "Annotations", t.pointer("/metadata/annotations"), ": ");
    }
    containers(out, "Init Containers", t.pointer("/spec/initContainers"), None, ("  ", "   ", "    "));
    containers(out, "Containers", t.pointer("/spec/containers"), None, ("  ", "   ", "    "));
    out.push_str(&format!("  Volumes:\t{}\n", or_none(&names(t.pointer("/spec/volumes")).join(", "))));
    map_lines(out, "  ", "Node-Selectors", t.pointer("/spec/nodeSelector"), "=");
    out.push_str("  Tolerations:\t<none>\n");
}

pub(crate) fn selector_string(o: &Value) -> String {
    let m = o.pointer("/spec/selector/matchLabels").or_else(|| o.pointer("/spec/selector"));
    let s = crate::print::labels_string(m);
    s
}

/// The deployment section. Pure.
pub fn describe_deployment(o: &Value) -> String {
    let i = |p: &str| o.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let mut out = String::new();
    meta_header(&mut out, o, true);
    out.push_str(&format!("CreationTimestamp:\t{}\n", when(o, "/metadata/creationTimestamp")));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Selector:\t{}\n", selector_string(o)));
    out.push_str(&format!(
        "Replicas:\t{} desired | {} updated | {} total | {} available | {} unavailable\n",
        o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
        i("/status/updatedReplicas"),
        i("/status/replicas"),
        i("/status/availableReplicas"),
        i("/status/unavailableReplicas")
    ));
    let strategy = s(o, "/spec/strategy/type");
    out.push_str(&format!("StrategyType:\t{}\n", or_none(strategy)));
    out.push_str(&format!("MinReadySeconds:\t{}\n", i("/spec/minReadySeconds")));
    if strategy == "RollingUpdate" {
        let f = |k: &str| {
            o.pointer(&format!("/spec/strategy/rollingUpdate/{k}"))
                .map(|v| v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))
                .unwrap_or_else(|| "25%".into())
        };
        out.push_str(&format!(
            "RollingUpdateStrategy:\t{} max unavailable, {} max surge\n",
            f("maxUnavailable"),
            f("maxSurge")
        ));
    }
    template(&mut out, o.pointer("/spec/template"));
    let conds: Vec<&Value> = o.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().collect();
    if !conds.is_empty() {
        out.push_str("Conditions:\n  Type\tStatus\tReason\n  ----\t------\t------\n");
        for c in conds {
            out.push_str(&format!("  {}\t{}\t{}\n", s(c, "/type"), s(c, "/status"), s(c, "/reason")));
        }
    }
    out
}

/// The replicaset section. Pure.
pub fn describe_replicaset(o: &Value) -> String {
    let i = |p: &str| o.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let mut out = String::new();
    meta_header(&mut out, o, true);
    out.push_str(&format!("Selector:\t{}\n", selector_string(o)));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    if let Some(owner) = o.pointer("/metadata/ownerReferences/0") {
        out.push_str(&format!("Controlled By:\t{}/{}\n", s(owner, "/kind"), s(owner, "/name")));
    }
    out.push_str(&format!(
        "Replicas:\t{} current / {} desired\n",
        i("/status/replicas"),
        o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1)
    ));
    out.push_str(&format!(
        "Pods Status:\t{} Running / 0 Waiting / 0 Succeeded / 0 Failed\n",
        i("/status/readyReplicas")
    ));
    template(&mut out, o.pointer("/spec/template"));
    out
}

/// The service section. Pure.
pub fn describe_service(o: &Value, endpoints: Option<&Value>) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Selector:\t{}\n", crate::print::labels_string(o.pointer("/spec/selector"))));
    out.push_str(&format!("Type:\t{}\n", s(o, "/spec/type")));
    out.push_str(&format!("IP Family Policy:\t{}\n", or_none(s(o, "/spec/ipFamilyPolicy"))));
    let fams: Vec<&str> = o
        .pointer("/spec/ipFamilies")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    out.push_str(&format!("IP Families:\t{}\n", or_none(&fams.join(","))));
    out.push_str(&format!("IP:\t{}\n", or_none(s(o, "/spec/clusterIP"))));
    let ips: Vec<&str> = o
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    out.push_str(&format!("IPs:\t{}\n", or_none(&ips.join(","))));
    for p in o.pointer("/spec/ports").and_then(Value::as_array).into_iter().flatten() {
        let name = or_none(s(p, "/name")).to_string();
        let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        let port = p.get("port").map(|x| x.to_string()).unwrap_or_default();
        out.push_str(&format!("Port:\t{name}\t{port}/{proto}\n"));
        let tp = p
            .get("targetPort")
            .map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string()))
            .unwrap_or_else(|| port.clone());
        out.push_str(&format!("TargetPort:\t{tp}/{proto}\n"));
        if let Some(np) = p.get("nodePort") {
            out.push_str(&format!("NodePort:\t{name}\t{np}/{proto}\n"));
        }
        out.push_str(&format!("Endpoints:\t{}\n", or_none(&endpoints_for(endpoints, p))));
    }
    out.push_str(&format!("Session Affinity:\t{}\n", or_none(s(o, "/spec/sessionAffinity"))));
    if let Some(p) = o.pointer("/spec/externalTrafficPolicy").and_then(Value::as_str) {
        out.push_str(&format!("External Traffic Policy:\t{p}\n"));
    }
    out.push_str(&format!("Internal Traffic Policy:\t{}\n", or_none(s(o, "/spec/internalTrafficPolicy"))));
    out
}

/// `ip:port,…` of the endpoints serving a service port.
fn endpoints_for(endpoints: Option<&Value>, port: &Value) -> String {
    let pname = port.get("name").and_then(Value::as_str).unwrap_or_default();
    let mut out = Vec::new();
    for sub in endpoints.and_then(|e| e.get("subsets")).and_then(Value::as_array).into_iter().flatten() {
        let p = sub
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str).unwrap_or_default() == pname);
        let Some(p) = p else { continue };
        for a in sub.get("addresses").and_then(Value::as_array).into_iter().flatten() {
            out.push(format!("{}:{}", s(a, "/ip"), p.get("port").map(|x| x.to_string()).unwrap_or_default()));
        }
    }
    out.join(",")
}

/// The namespace section. Pure.
pub fn describe_namespace(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, false);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Status:\t{}\n\nNo resource quota.\n\nNo LimitRange resource.\n", s(o, "/status/phase")));
    out
}

/// A pod's requests and limits (Kubernetes' `PodRequestsAndLimits`): per resource, the sum
/// over its containers or the largest init container's, whichever is more.
fn pod_requests_and_limits(pod: &Value) -> [std::collections::BTreeMap<String, f64>; 2] {
    let mut out: [std::collections::BTreeMap<String, f64>; 2] = Default::default();
    for (i, key) in ["requests", "limits"].iter().enumerate() {
        let of = |c: &Value| -> Vec<(String, f64)> {
            c.pointer(&format!("/resources/{key}"))
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(r, q)| {
                    let text = q.as_str().map(str::to_string).unwrap_or_else(|| q.to_string());
                    Some((r.clone(), apimachinery::quantity::parse(&text)?))
                })
                .collect()
        };
        for c in pod.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
            for (r, v) in of(c) {
                *out[i].entry(r).or_default() += v;
            }
        }
        for c in pod.pointer("/spec/initContainers").and_then(Value::as_array).into_iter().flatten() {
            for (r, v) in of(c) {
                let e = out[i].entry(r).or_default();
                *e = e.max(v);
            }
        }
    }
    out
}

/// A summed quantity the way describe prints it: cpu in cores or millicores, bytes with the
/// largest binary suffix that divides them, other resources as numbers.
fn quantity_text(resource: &str, v: f64) -> String {
    if resource == "cpu" {
        let m = (v * 1000.0).round() as i64;
        return if m % 1000 == 0 { (m / 1000).to_string() } else { format!("{m}m") };
    }
    let n = v.round() as i64;
    if matches!(resource, "memory" | "ephemeral-storage") && n != 0 {
        for (suffix, unit) in [("Gi", 1i64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
            if n % unit == 0 {
                return format!("{}{suffix}", n / unit);
            }
        }
    }
    if v.fract() == 0.0 {
        n.to_string()
    } else {
        format!("{}m", (v * 1000.0).round() as i64)
    }
}

/// `0 (0%)`: an amount and its share of what the node can allocate.
fn with_share(resource: &str, v: f64, allocatable: Option<f64>) -> String {
    let pct = match allocatable {
        Some(a) if a > 0.0 => (v / a * 100.0) as i64,
        _ => 0,
    };
    format!("{} ({pct}%)", quantity_text(resource, v))
}

/// The node's "Non-terminated Pods" and "Allocated resources" sections, from the pods bound to
/// it (`pods`: those not Succeeded or Failed).
fn node_pods_sections(node: &Value, pods: &[Value]) -> String {
    let alloc = |r: &str| {
        node.pointer(&format!("/status/allocatable/{}", r.replace('/', "~1")))
            .and_then(|q| q.as_str().map(str::to_string).or_else(|| Some(q.to_string())))
            .and_then(|t| apimachinery::quantity::parse(&t))
    };
    let mut out = format!(
        "Non-terminated Pods:\t({} in total)\n  Namespace\tName\tCPU Requests\tCPU Limits\tMemory Requests\tMemory Limits\tAge\n  ---------\t----\t------------\t----------\t---------------\t-------------\t---\n",
        pods.len()
    );
    let mut total: [std::collections::BTreeMap<String, f64>; 2] = Default::default();
    for p in pods {
        let [req, lim] = pod_requests_and_limits(p);
        let get = |m: &std::collections::BTreeMap<String, f64>, r: &str| m.get(r).copied().unwrap_or(0.0);
        out.push_str(&format!(
            "  {}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            s(p, "/metadata/namespace"),
            s(p, "/metadata/name"),
            with_share("cpu", get(&req, "cpu"), alloc("cpu")),
            with_share("cpu", get(&lim, "cpu"), alloc("cpu")),
            with_share("memory", get(&req, "memory"), alloc("memory")),
            with_share("memory", get(&lim, "memory"), alloc("memory")),
            age(p.pointer("/metadata/creationTimestamp").and_then(Value::as_str)),
        ));
        for (i, m) in [req, lim].into_iter().enumerate() {
            for (r, v) in m {
                *total[i].entry(r).or_default() += v;
            }
        }
    }
    out.push_str("Allocated resources:\n  (Total limits may be over 100 percent, i.e., overcommitted.)\n  Resource\tRequests\tLimits\n  --------\t--------\t------\n");
    let get = |i: usize, r: &str| total[i].get(r).copied().unwrap_or(0.0);
    for r in ["cpu", "memory", "ephemeral-storage"] {
        out.push_str(&format!(
            "  {r}\t{}\t{}\n",
            with_share(r, get(0, r), alloc(r)),
            with_share(r, get(1, r), alloc(r))
        ));
    }
    // Extended resources (and hugepages): plain amounts.
    let mut others: Vec<&String> =
        total[0].keys().chain(total[1].keys()).filter(|r| r.contains('/') || r.starts_with("hugepages-")).collect();
    others.sort();
    others.dedup();
    for r in others {
        out.push_str(&format!("  {r}\t{}\t{}\n", quantity_text(r, get(0, r)), quantity_text(r, get(1, r))));
    }
    out
}

/// The node section, with its pods' sections when `extra` has them (`{"pods": [...]}`). Pure.
pub fn describe_node(o: &Value, extra: Option<&Value>) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, false);
    out.push_str(&format!("Roles:\t{}\n", apimachinery::printers::node_roles(o)));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("CreationTimestamp:\t{}\n", when(o, "/metadata/creationTimestamp")));
    let taints: Vec<String> = o
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| match t.get("value").and_then(Value::as_str) {
            Some(v) => format!("{}={v}:{}", s(t, "/key"), s(t, "/effect")),
            None => format!("{}:{}", s(t, "/key"), s(t, "/effect")),
        })
        .collect();
    if taints.is_empty() {
        out.push_str("Taints:\t<none>\n");
    } else {
        for (i, t) in taints.iter().enumerate() {
            out.push_str(&format!("{}\t{t}\n", if i == 0 { "Taints:" } else { "" }));
        }
    }
    out.push_str(&format!(
        "Unschedulable:\t{}\n",
        o.pointer("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false)
    ));
    let conds: Vec<&Value> = o.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().collect();
    out.push_str("Conditions:\n  Type\tStatus\tLastHeartbeatTime\tLastTransitionTime\tReason\tMessage\n  ----\t------\t-----------------\t------------------\t------\t-------\n");
    for c in conds {
        out.push_str(&format!(
            "  {}\t{}\t{}\t{}\t{}\t{}\n",
            s(c, "/type"),
            s(c, "/status"),
            s(c, "/lastHeartbeatTime"),
            s(c, "/lastTransitionTime"),
            s(c, "/reason"),
            s(c, "/message")
        ));
    }
    out.push_str("Addresses:\n");
    for a in o.pointer("/status/addresses").and_then(Value::as_array).into_iter().flatten() {
        out.push_str(&format!("  {}:\t{}\n", s(a, "/type"), s(a, "/address")));
    }
    for (k, title) in [("capacity", "Capacity"), ("allocatable", "Allocatable")] {
        if let Some(m) = o.pointer(&format!("/status/{k}")).and_then(Value::as_object) {
            out.push_str(&format!("{title}:\n"));
            for (rk, rv) in m {
                out.push_str(&format!("  {rk}:\t{}\n", rv.as_str().unwrap_or_default()));
            }
        }
    }
    if let Some(info) = o.pointer("/status/nodeInfo").and_then(Value::as_object) {
        out.push_str("System Info:\n");
        for (k, title) in [
            ("machineID", "Machine ID"),
            ("systemUUID", "System UUID"),
            ("bootID", "Boot ID"),
            ("kernelVersion", "Kernel Version"),
            ("osImage", "OS Image"),
            ("operatingSystem", "Operating System"),
            ("architecture", "Architecture"),
            ("containerRuntimeVersion", "Container Runtime Version"),
            ("kubeletVersion", "Kubelet Version"),
        ] {
            out.push_str(&format!("  {title}:\t{}\n", info.get(k).and_then(Value::as_str).unwrap_or_default()));
        }
    }
    if let Some(c) = o.pointer("/spec/podCIDR").and_then(Value::as_str) {
        out.push_str(&format!("PodCIDR:\t{c}\n"));
    }
    if let Some(pods) = extra.and_then(|e| e.get("pods")).and_then(Value::as_array) {
        let live: Vec<Value> =
            pods.iter().filter(|p| !matches!(s(p, "/status/phase"), "Succeeded" | "Failed")).cloned().collect();
        out.push_str(&node_pods_sections(o, &live));
    }
    out
}

/// Any other kind: metadata, then spec and status as indented YAML.
pub fn describe_generic(o: &Value, namespaced: bool) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, namespaced);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("API Version:\t{}\n", s(o, "/apiVersion")));
    out.push_str(&format!("Kind:\t{}\n", s(o, "/kind")));
    if let Some(m) = o.as_object() {
        for (k, v) in m {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            let mut title = k.clone();
            if let Some(f) = title.get_mut(0..1) {
                f.make_ascii_uppercase();
            }
            match v {
                Value::Object(_) | Value::Array(_) => {
                    out.push_str(&format!("{title}:\n"));
                    for l in crate::print::to_yaml(v).lines() {
                        out.push_str(&format!("  {l}\n"));
                    }
                }
                other => out.push_str(&format!(
                    "{title}:\t{}\n",
                    other.as_str().map(String::from).unwrap_or_else(|| other.to_string())
                )),
            }
        }
    }
    out
}

/// The Events section. Pure.
pub fn events_section(events: &[Value]) -> String {
    if events.is_empty() {
        return "Events:\t<none>\n".into();
    }
    let mut evs: Vec<&Value> = events.iter().collect();
    let ts = |e: &Value| {
        e.get("lastTimestamp")
            .or_else(|| e.get("eventTime"))
            .or_else(|| e.pointer("/metadata/creationTimestamp"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    evs.sort_by_key(|e| ts(e));
    let mut out = String::from("Events:\n  Type\tReason\tAge\tFrom\tMessage\n  ----\t------\t----\t----\t-------\n");
    for e in evs {
        let count = e.get("count").and_then(Value::as_i64).unwrap_or(1);
        let last = age(Some(&ts(e)));
        let a = if count > 1 {
            let first = e.get("firstTimestamp").and_then(Value::as_str);
            format!("{last} (x{count} over {})", age(first))
        } else {
            last
        };
        let from = {
            let c = s(e, "/source/component");
            let c = if c.is_empty() { s(e, "/reportingComponent") } else { c };
            let h = s(e, "/source/host");
            if h.is_empty() {
                c.to_string()
            } else {
                format!("{c}, {h}")
            }
        };
        out.push_str(&format!("  {}\t{}\t{a}\t{from}\t{}\n", s(e, "/type"), s(e, "/reason"), s(e, "/message").trim()));
    }
    out
}

/// The full text for one object (before alignment).
pub fn describe_text(res: &ApiRes, o: &Value, extra: Option<&Value>) -> String {
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "pods") => describe_pod(o),
        ("", "nodes") => describe_node(o, extra),
        ("", "services") => describe_service(o, extra),
        ("apps", "deployments") => describe_deployment(o),
        ("apps", "replicasets") => describe_replicaset(o),
        ("", "namespaces") => describe_namespace(o),
        ("apps", "statefulsets") => describe_more::describe_statefulset(o, extra),
        ("apps", "daemonsets") => describe_more::describe_daemonset(o, extra),
        ("batch", "jobs") => describe_more::describe_job(o),
        ("batch", "cronjobs") => describe_more::describe_cronjob(o),
        ("", "configmaps") => describe_more::describe_configmap(o),
        ("", "secrets") => describe_more::describe_secret(o),
        ("networking.k8s.io", "ingresses") => describe_more::describe_ingress(o, extra),
        ("", "persistentvolumeclaims") => describe_more::describe_pvc(o, extra),
        ("", "persistentvolumes") => describe_more::describe_pv(o),
        ("autoscaling", "horizontalpodautoscalers") => describe_more::describe_hpa(o),
        _ => describe_generic(o, res.namespaced),
    }
}

/// What a describer needs besides the object: a Service's Endpoints, the pods of a
/// StatefulSet or DaemonSet, the pods using a claim, an Ingress's backends' endpoints.
async fn extra_for(ctx: &Ctx, res: &ApiRes, o: &Value) -> Option<Value> {
    let ns = s(o, "/metadata/namespace");
    let name = s(o, "/metadata/name");
    let pods = || async {
        ctx.get(&format!("/api/v1/namespaces/{ns}/pods"))
            .await
            .ok()
            .and_then(|l| l.get("items").cloned())
            .unwrap_or(json!([]))
    };
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "nodes") => {
            let path = with_query("/api/v1/pods", &[("fieldSelector", format!("spec.nodeName={name}"))]);
            let pods = ctx.get(&path).await.ok().and_then(|l| l.get("items").cloned()).unwrap_or(json!([]));
            Some(json!({"pods": pods}))
        }
        ("", "services") => ctx.get(&format!("/api/v1/namespaces/{ns}/endpoints/{name}")).await.ok(),
        ("apps", "statefulsets") | ("apps", "daemonsets") => Some(json!({"pods": pods().await})),
        ("", "persistentvolumeclaims") => {
            let all = pods().await;
            let users: Vec<&str> =
                all.as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| {
                        p.pointer("/spec/volumes").and_then(Value::as_array).into_iter().flatten().any(|v| {
                            v.pointer("/persistentVolumeClaim/claimName").and_then(Value::as_str) == Some(name)
                        })
                    })
                    .filter_map(|p| p.pointer("/metadata/name").and_then(Value::as_str))
                    .collect();
            Some(json!({"usedBy": users}))
        }
        ("networking.k8s.io", "ingresses") => {
            let mut backends = serde_json::Map::new();
            for b in describe_more::ingress_backends(o) {
                let Some(svc_name) = b.pointer("/service/name").and_then(Value::as_str) else { continue };
                let text = match ctx.get(&format!("/api/v1/namespaces/{ns}/services/{svc_name}")).await {
                    Ok(svc) => {
                        let eps = ctx.get(&format!("/api/v1/namespaces/{ns}/endpoints/{svc_name}")).await.ok();
                        describe_more::backend_endpoints(&svc, eps.as_ref(), &b)
                    }
                    Err(e) if e.is_not_found() => format!("<error: services \"{svc_name}\" not found>"),
                    Err(e) => format!("<error: {e}>"),
                };
                backends.insert(describe_more::backend_key(&b), json!(text));
            }
            Some(json!({"backends": backends}))
        }
        _ => None,
    }
}

async fn events_for(ctx: &Ctx, o: &Value, res: &ApiRes) -> Result<Vec<Value>> {
    let ns = o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let fs = format!(
        "involvedObject.name={},involvedObject.namespace={},involvedObject.kind={},involvedObject.uid={}",
        s(o, "/metadata/name"),
        if res.namespaced { ns } else { "" },
        res.kind,
        s(o, "/metadata/uid")
    );
    let path = if res.namespaced { format!("/api/v1/namespaces/{ns}/events") } else { "/api/v1/events".into() };
    let list = ctx.get(&with_query(&path, &[("fieldSelector", fs)])).await?;
    Ok(list.get("items").and_then(Value::as_array).cloned().unwrap_or_default())
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let mut first = true;
    let mut failed = false;
    let ns = if a.all_namespaces { None } else { Some(ctx.namespace.as_str()) };
    for r in parse_args(&a.args)? {
        let res = ctx.resolve(&r.type_arg).await?;
        let mut objs = Vec::new();
        let list_path =
            with_query(&res.collection_path(ns), &[("labelSelector", a.selector.clone().unwrap_or_default())]);
        if r.names.is_empty() {
            let l = ctx.get(&list_path).await?;
            objs.extend(l.get("items").and_then(Value::as_array).cloned().unwrap_or_default());
            if objs.is_empty() {
                // kubectl describe names the namespace even for cluster-scoped types.
                eprintln!("{}", super::get::no_resources_message(&ctx.namespace, ns.is_none(), true));
            }
        } else {
            for n in &r.names {
                match ctx.get(&res.object_path(ns, n)).await {
                    Ok(o) => objs.push(o),
                    Err(e) if e.is_not_found() => {
                        // kubectl describe falls back to a name prefix match.
                        let l = ctx.get(&list_path).await?;
                        let m: Vec<Value> = l
                            .get("items")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .filter(|o| s(o, "/metadata/name").starts_with(n.as_str()))
                            .cloned()
                            .collect();
                        if m.is_empty() {
                            eprintln!("{e}");
                            failed = true;
                        }
                        objs.extend(m);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        for o in objs {
            let o = super::get::with_type_meta(o, &res);
            let extra = extra_for(ctx, &res, &o).await;
            let mut text = describe_text(&res, &o, extra.as_ref());
            // (kubectl's secret and namespace describers print no events)
            if a.show_events && !(res.group.is_empty() && matches!(res.plural.as_str(), "namespaces" | "secrets")) {
                let evs = events_for(ctx, &o, &res).await.unwrap_or_default();
                text.push_str(&events_section(&evs));
            }
            if !first {
                println!();
                println!();
            }
            first = false;
            print!("{}", tabwrite(&text, 2));
        }
    }
    if failed {
        Err(KubectlError::Reported)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_sections_sum_the_pods_requests_and_limits() {
        let node = json!({"metadata": {"name": "n1"}, "status": {"allocatable": {
            "cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi", "example.com/widget": "3"}}});
        let pod = |name: &str, phase: &str| {
            json!({"metadata": {"namespace": "default", "name": name}, "status": {"phase": phase},
                "spec": {"containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "250m", "memory": "256Mi", "example.com/widget": "1"},
                    "limits": {"cpu": "500m", "memory": "512Mi", "example.com/widget": "1"}}}],
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}]}})
        };
        let text = tabwrite(
            &describe_node(
                &node,
                Some(&json!({"pods": [pod("a", "Running"), pod("b", "Pending"), pod("c", "Succeeded")]})),
            ),
            2,
        );
        let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(text.lines().any(|l| words(l) == "Non-terminated Pods: (2 in total)"), "{text}");
        assert!(
            text.lines().any(|l| words(l) == "default a 1 (50%) 500m (25%) 256Mi (6%) 512Mi (12%) <unknown>"),
            "{text}"
        );
        let allocated = text.split("Allocated resources:").nth(1).unwrap();
        let row = |r: &str| {
            allocated
                .lines()
                .find(|l| l.trim_start().starts_with(r))
                .unwrap()
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(row("cpu"), "2 (100%) 1 (50%)");
        assert_eq!(row("memory"), "512Mi (12%) 1Gi (25%)");
        assert_eq!(row("ephemeral-storage"), "0 (0%) 0 (0%)");
        assert_eq!(row("example.com/widget"), "2 2");
    }

    #[test]
    fn pod_sections() {
        let p = json!({"metadata": {"name": "p", "namespace": "default", "labels": {"b": "2", "a": "1"}},
            "spec": {"containers": [{"name": "web", "image": "busybox", "ports": [{"containerPort": 8080}],
                     "readinessProbe": {"httpGet": {"path": "/i", "port": 8080}, "periodSeconds": 2}}]},
            "status": {"phase": "Pending"}});
        let t = tabwrite(&(describe_pod(&p) + &events_section(&[])), 2);
        assert!(t.starts_with("Name:             p\nNamespace:        default\n"), "{t}");
        assert!(t.contains("Labels:           a=1\n                  b=2\n"), "{t}");
        assert!(t.contains("Containers:\n  web:\n    Image:"), "{t}");
        assert!(t.contains("http-get //:8080/i delay=0s timeout=0s period=2s #success=0 #failure=0"), "{t}");
        assert!(t.ends_with("Tolerations:      <none>\nEvents:           <none>\n"), "{t}");
    }

    #[test]
    fn events_table() {
        let e = json!({"type": "Normal", "reason": "Scheduled", "message": "assigned", "source": {"component": "default-scheduler"}});
        let t = tabwrite(&events_section(&[e]), 2);
        assert!(t.starts_with("Events:\n  Type    Reason     Age"), "{t}");
        assert!(t.contains("  Normal  Scheduled  <unknown>  default-scheduler  assigned"), "{t}");
    }
}
