//! `kubectl describe` sections for statefulsets, daemonsets, jobs, cronjobs, configmaps,
//! secrets, ingresses, persistentvolumeclaims, persistentvolumes and
//! horizontalpodautoscalers, in the official
//! kubectl's order and words. Pure; what needs other objects (pods, services, endpoints)
//! gets them through `extra`, gathered by `describe::run`.

use apimachinery::printers::access_modes;
use base64::Engine;
use serde_json::{json, Value};

use super::describe::{map_lines, meta_header, names, or_none, or_unset, s, selector_string, template, when};

fn i(o: &Value, p: &str) -> i64 {
    o.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

fn text(v: &Value) -> String {
    v.as_str().map(String::from).unwrap_or_else(|| v.to_string())
}

/// Go's `%v` of a string slice: `[a b]`.
fn go_list(v: Option<&Value>) -> String {
    let items: Vec<String> = v.and_then(Value::as_array).into_iter().flatten().map(text).collect();
    format!("[{}]", items.join(" "))
}

/// `N Running / N Waiting / N Succeeded / N Failed` over the pods a controller owns.
pub fn pods_status(o: &Value, pods: &[Value]) -> String {
    let uid = s(o, "/metadata/uid");
    let owned = pods.iter().filter(|p| {
        p.pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|refs| refs.iter().any(|r| r.get("uid").and_then(Value::as_str) == Some(uid)))
    });
    let (mut run, mut wait, mut ok, mut fail) = (0, 0, 0, 0);
    for p in owned {
        match s(p, "/status/phase") {
            "Running" => run += 1,
            "Pending" => wait += 1,
            "Succeeded" => ok += 1,
            "Failed" => fail += 1,
            _ => {}
        }
    }
    format!("{run} Running / {wait} Waiting / {ok} Succeeded / {fail} Failed")
}

fn pods_of(extra: Option<&Value>) -> Vec<Value> {
    extra.and_then(|e| e.get("pods")).and_then(Value::as_array).cloned().unwrap_or_default()
}

pub fn describe_statefulset(o: &Value, extra: Option<&Value>) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    out.push_str(&format!("CreationTimestamp:\t{}\n", when(o, "/metadata/creationTimestamp")));
    out.push_str(&format!("Selector:\t{}\n", selector_string(o)));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    let desired = o.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    out.push_str(&format!("Replicas:\t{desired} desired | {} total\n", i(o, "/status/replicas")));
    let strategy = o.pointer("/spec/updateStrategy/type").and_then(Value::as_str).unwrap_or("RollingUpdate");
    out.push_str(&format!("Update Strategy:\t{strategy}\n"));
    if strategy == "RollingUpdate" {
        out.push_str(&format!("  Partition:\t{}\n", i(o, "/spec/updateStrategy/rollingUpdate/partition")));
    }
    out.push_str(&format!("Pods Status:\t{}\n", pods_status(o, &pods_of(extra))));
    template(&mut out, o.pointer("/spec/template"));
    let claims: Vec<&Value> =
        o.pointer("/spec/volumeClaimTemplates").and_then(Value::as_array).into_iter().flatten().collect();
    if claims.is_empty() {
        out.push_str("Volume Claims:\t<none>\n");
    } else {
        out.push_str("Volume Claims:\n");
        for c in claims {
            out.push_str(&format!("  Name:\t{}\n", s(c, "/metadata/name")));
            out.push_str(&format!("  StorageClass:\t{}\n", s(c, "/spec/storageClassName")));
            map_lines(&mut out, "  ", "Labels", c.pointer("/metadata/labels"), "=");
            map_lines(&mut out, "  ", "Annotations", c.pointer("/metadata/annotations"), ": ");
            out.push_str(&format!("  Capacity:\t{}\n", or_none(s(c, "/spec/resources/requests/storage"))));
            out.push_str(&format!("  Access Modes:\t{}\n", go_list(c.pointer("/spec/accessModes"))));
        }
    }
    out
}

pub fn describe_daemonset(o: &Value, extra: Option<&Value>) -> String {
    let mut out = String::new();
    // (kubectl prints no Namespace line for daemonsets)
    out.push_str(&format!("Name:\t{}\n", s(o, "/metadata/name")));
    out.push_str(&format!("Selector:\t{}\n", selector_string(o)));
    let ns = crate::print::labels_string(o.pointer("/spec/template/spec/nodeSelector"));
    out.push_str(&format!("Node-Selector:\t{}\n", if ns.is_empty() || ns == "<none>" { "<none>".into() } else { ns }));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Desired Number of Nodes Scheduled: {}\n", i(o, "/status/desiredNumberScheduled")));
    out.push_str(&format!("Current Number of Nodes Scheduled: {}\n", i(o, "/status/currentNumberScheduled")));
    out.push_str(&format!(
        "Number of Nodes Scheduled with Up-to-date Pods: {}\n",
        i(o, "/status/updatedNumberScheduled")
    ));
    out.push_str(&format!("Number of Nodes Scheduled with Available Pods: {}\n", i(o, "/status/numberAvailable")));
    out.push_str(&format!("Number of Nodes Misscheduled: {}\n", i(o, "/status/numberMisscheduled")));
    out.push_str(&format!("Pods Status:\t{}\n", pods_status(o, &pods_of(extra))));
    template(&mut out, o.pointer("/spec/template"));
    out
}

pub fn describe_job(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    out.push_str(&format!("Selector:\t{}\n", selector_string(o)));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    if let Some(owner) = o.pointer("/metadata/ownerReferences/0") {
        out.push_str(&format!("Controlled By:\t{}/{}\n", s(owner, "/kind"), s(owner, "/name")));
    }
    out.push_str(&format!("Parallelism:\t{}\n", o.pointer("/spec/parallelism").and_then(Value::as_i64).unwrap_or(1)));
    match o.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => out.push_str(&format!("Completions:\t{c}\n")),
        None => out.push_str("Completions:\t<unset>\n"),
    }
    out.push_str(&format!(
        "Completion Mode:\t{}\n",
        o.pointer("/spec/completionMode").and_then(Value::as_str).unwrap_or("NonIndexed")
    ));
    out.push_str(&format!("Suspend:\t{}\n", o.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false)));
    out.push_str(&format!(
        "Backoff Limit:\t{}\n",
        o.pointer("/spec/backoffLimit").and_then(Value::as_i64).unwrap_or(6)
    ));
    if o.pointer("/status/startTime").is_some() {
        out.push_str(&format!("Start Time:\t{}\n", when(o, "/status/startTime")));
    }
    if o.pointer("/status/completionTime").is_some() {
        out.push_str(&format!("Completed At:\t{}\n", when(o, "/status/completionTime")));
        let secs = |p: &str| {
            o.pointer(p).and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok()).map(|t| t.as_second())
        };
        if let (Some(a), Some(b)) = (secs("/status/startTime"), secs("/status/completionTime")) {
            out.push_str(&format!("Duration:\t{}\n", apimachinery::duration::human_duration(b - a)));
        }
    }
    if o.pointer("/spec/activeDeadlineSeconds").is_some() {
        out.push_str(&format!("Active Deadline Seconds:\t{}s\n", i(o, "/spec/activeDeadlineSeconds")));
    }
    let ready = match o.pointer("/status/ready").and_then(Value::as_i64) {
        Some(r) => format!(" ({r} Ready)"),
        None => String::new(),
    };
    out.push_str(&format!(
        "Pods Statuses:\t{} Active{ready} / {} Succeeded / {} Failed\n",
        i(o, "/status/active"),
        i(o, "/status/succeeded"),
        i(o, "/status/failed")
    ));
    template(&mut out, o.pointer("/spec/template"));
    out
}

pub fn describe_cronjob(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Schedule:\t{}\n", s(o, "/spec/schedule")));
    out.push_str(&format!(
        "Concurrency Policy:\t{}\n",
        o.pointer("/spec/concurrencyPolicy").and_then(Value::as_str).unwrap_or("Allow")
    ));
    let suspend = o.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false);
    out.push_str(&format!("Suspend:\t{}\n", if suspend { "True" } else { "False" }));
    let opt = |p: &str, unit: &str| match o.pointer(p).and_then(Value::as_i64) {
        Some(n) => format!("{n}{unit}"),
        None => "<unset>".into(),
    };
    out.push_str(&format!("Successful Job History Limit:\t{}\n", opt("/spec/successfulJobsHistoryLimit", "")));
    out.push_str(&format!("Failed Job History Limit:\t{}\n", opt("/spec/failedJobsHistoryLimit", "")));
    out.push_str(&format!("Starting Deadline Seconds:\t{}\n", opt("/spec/startingDeadlineSeconds", "s")));
    let jt = o.pointer("/spec/jobTemplate").cloned().unwrap_or(json!({}));
    let sel = jt.pointer("/spec/selector").map(|_| selector_string(&jt)).unwrap_or_else(|| "<unset>".into());
    out.push_str(&format!("Selector:\t{sel}\n"));
    let jopt =
        |p: &str| jt.pointer(p).and_then(Value::as_i64).map(|n| n.to_string()).unwrap_or_else(|| "<unset>".into());
    out.push_str(&format!("Parallelism:\t{}\n", jopt("/spec/parallelism")));
    out.push_str(&format!("Completions:\t{}\n", jopt("/spec/completions")));
    if jt.pointer("/spec/activeDeadlineSeconds").is_some() {
        out.push_str(&format!("Active Deadline Seconds:\t{}s\n", jopt("/spec/activeDeadlineSeconds")));
    }
    template(&mut out, jt.pointer("/spec/template"));
    match o.pointer("/status/lastScheduleTime") {
        Some(_) => out.push_str(&format!("Last Schedule Time:\t{}\n", when(o, "/status/lastScheduleTime"))),
        None => out.push_str("Last Schedule Time:\t<unset>\n"),
    }
    out.push_str(&format!("Active Jobs:\t{}\n", or_none(&names(o.pointer("/status/active")).join(", "))));
    out
}

pub fn describe_configmap(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str("\nData\n====\n");
    if let Some(data) = o.get("data").and_then(Value::as_object) {
        let mut keys: Vec<&String> = data.keys().collect();
        keys.sort();
        for k in keys {
            out.push_str(&format!("{k}:\n----\n{}\n\n", text(&data[k])));
        }
    }
    out.push_str("\nBinaryData\n====\n");
    if let Some(data) = o.get("binaryData").and_then(Value::as_object) {
        let mut keys: Vec<&String> = data.keys().collect();
        keys.sort();
        for k in keys {
            let n = base64::engine::general_purpose::STANDARD.decode(text(&data[k])).map(|b| b.len()).unwrap_or(0);
            out.push_str(&format!("{k}: {n} bytes\n"));
        }
    }
    out.push('\n');
    out
}

pub fn describe_secret(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("\nType:\t{}\n\nData\n====\n", o.get("type").and_then(Value::as_str).unwrap_or("Opaque")));
    if let Some(data) = o.get("data").and_then(Value::as_object) {
        let mut keys: Vec<&String> = data.keys().collect();
        keys.sort();
        for k in keys {
            let n = base64::engine::general_purpose::STANDARD.decode(text(&data[k])).map(|b| b.len()).unwrap_or(0);
            out.push_str(&format!("{k}:\t{n} bytes\n"));
        }
    }
    out
}

/// The `svc:port` text of an Ingress backend.
pub fn backend_key(b: &Value) -> String {
    if let Some(svc) = b.get("service") {
        let port =
            svc.pointer("/port/number").map(text).or_else(|| svc.pointer("/port/name").map(text)).unwrap_or_default();
        return format!("{}:{port}", s(svc, "/name"));
    }
    match b.get("resource") {
        Some(r) => format!("APIGroup: {}, Kind: {}, Name: {}", s(r, "/apiGroup"), s(r, "/kind"), s(r, "/name")),
        None => String::new(),
    }
}

/// Every backend an Ingress names.
pub fn ingress_backends(o: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = o.pointer("/spec/defaultBackend").cloned().into_iter().collect();
    for r in o.pointer("/spec/rules").and_then(Value::as_array).into_iter().flatten() {
        for p in r.pointer("/http/paths").and_then(Value::as_array).into_iter().flatten() {
            if let Some(b) = p.get("backend") {
                out.push(b.clone());
            }
        }
    }
    out
}

/// `ip:port,…` of a backend's service port from its Endpoints (`<none>` when empty).
pub fn backend_endpoints(svc: &Value, endpoints: Option<&Value>, backend: &Value) -> String {
    let want_num = backend.pointer("/service/port/number").and_then(Value::as_i64);
    let want_name = backend.pointer("/service/port/name").and_then(Value::as_str);
    let sp = svc.pointer("/spec/ports").and_then(Value::as_array).into_iter().flatten().find(|p| {
        want_num.is_some_and(|n| p.get("port").and_then(Value::as_i64) == Some(n))
            || want_name.is_some_and(|n| p.get("name").and_then(Value::as_str) == Some(n))
    });
    let Some(sp) = sp else { return "<none>".into() };
    let port_name = sp.get("name").and_then(Value::as_str).unwrap_or_default();
    let mut eps = Vec::new();
    for subset in endpoints.and_then(|e| e.get("subsets")).and_then(Value::as_array).into_iter().flatten() {
        for p in subset.get("ports").and_then(Value::as_array).into_iter().flatten() {
            if p.get("name").and_then(Value::as_str).unwrap_or_default() != port_name {
                continue;
            }
            for a in subset.get("addresses").and_then(Value::as_array).into_iter().flatten() {
                eps.push(format!("{}:{}", s(a, "/ip"), i(p, "/port")));
            }
        }
    }
    if eps.is_empty() {
        "<none>".into()
    } else {
        eps.join(",")
    }
}

pub fn describe_ingress(o: &Value, extra: Option<&Value>) -> String {
    let ep = |b: &Value| -> String {
        let key = backend_key(b);
        extra
            .and_then(|e| e.pointer("/backends"))
            .and_then(|m| m.get(&key))
            .map(text)
            .unwrap_or_else(|| "<none>".into())
    };
    let mut out = String::new();
    out.push_str(&format!("Name:\t{}\n", s(o, "/metadata/name")));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    out.push_str(&format!("Namespace:\t{}\n", s(o, "/metadata/namespace")));
    let addrs: Vec<String> = o
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| a.get("ip").or_else(|| a.get("hostname")).map(text).unwrap_or_default())
        .collect();
    out.push_str(&format!("Address:\t{}\n", addrs.join(",")));
    out.push_str(&format!("Ingress Class:\t{}\n", or_none(s(o, "/spec/ingressClassName"))));
    match o.pointer("/spec/defaultBackend") {
        Some(b) => out.push_str(&format!("Default backend:\t{} ({})\n", backend_key(b), ep(b))),
        None => out.push_str("Default backend:\t<default>\n"),
    }
    let tls: Vec<&Value> = o.pointer("/spec/tls").and_then(Value::as_array).into_iter().flatten().collect();
    if !tls.is_empty() {
        out.push_str("TLS:\n");
        for t in tls {
            let hosts: Vec<String> = t.get("hosts").and_then(Value::as_array).into_iter().flatten().map(text).collect();
            let secret = s(t, "/secretName");
            if secret.is_empty() {
                out.push_str(&format!("  SNI routes {}\n", hosts.join(",")));
            } else {
                out.push_str(&format!("  {secret} terminates {}\n", hosts.join(",")));
            }
        }
    }
    out.push_str("Rules:\n  Host\tPath\tBackends\n  ----\t----\t--------\n");
    let rules: Vec<&Value> = o.pointer("/spec/rules").and_then(Value::as_array).into_iter().flatten().collect();
    if rules.is_empty() {
        if let Some(b) = o.pointer("/spec/defaultBackend") {
            out.push_str(&format!("  *\t*\t{} ({})\n", backend_key(b), ep(b)));
        }
    }
    for r in rules {
        let host = s(r, "/host");
        out.push_str(&format!("  {}\t\n", if host.is_empty() { "*" } else { host }));
        for p in r.pointer("/http/paths").and_then(Value::as_array).into_iter().flatten() {
            let b = p.get("backend").cloned().unwrap_or(Value::Null);
            out.push_str(&format!("  \t{} \t{} ({})\n", s(p, "/path"), backend_key(&b), ep(&b)));
        }
    }
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out
}

pub fn describe_pvc(o: &Value, extra: Option<&Value>) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    out.push_str(&format!("StorageClass:\t{}\n", s(o, "/spec/storageClassName")));
    out.push_str(&format!("Status:\t{}\n", s(o, "/status/phase")));
    out.push_str(&format!("Volume:\t{}\n", s(o, "/spec/volumeName")));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Finalizers:\t{}\n", go_list(o.pointer("/metadata/finalizers"))));
    out.push_str(&format!("Capacity:\t{}\n", s(o, "/status/capacity/storage")));
    out.push_str(&format!("Access Modes:\t{}\n", access_modes(o.pointer("/status/accessModes"))));
    out.push_str(&format!(
        "VolumeMode:\t{}\n",
        o.pointer("/spec/volumeMode").and_then(Value::as_str).unwrap_or("Filesystem")
    ));
    let users: Vec<String> =
        extra.and_then(|e| e.get("usedBy")).and_then(Value::as_array).into_iter().flatten().map(text).collect();
    if users.is_empty() {
        out.push_str("Used By:\t<none>\n");
    }
    for (n, u) in users.iter().enumerate() {
        out.push_str(&format!("{}\t{u}\n", if n == 0 { "Used By:" } else { "" }));
    }
    out
}

pub fn describe_pv(o: &Value) -> String {
    let mut out = String::new();
    out.push_str(&format!("Name:\t{}\n", s(o, "/metadata/name")));
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("Finalizers:\t{}\n", go_list(o.pointer("/metadata/finalizers"))));
    out.push_str(&format!("StorageClass:\t{}\n", s(o, "/spec/storageClassName")));
    out.push_str(&format!("Status:\t{}\n", s(o, "/status/phase")));
    let claim = match o.pointer("/spec/claimRef") {
        Some(c) => format!("{}/{}", s(c, "/namespace"), s(c, "/name")),
        None => String::new(),
    };
    out.push_str(&format!("Claim:\t{claim}\n"));
    out.push_str(&format!("Reclaim Policy:\t{}\n", s(o, "/spec/persistentVolumeReclaimPolicy")));
    out.push_str(&format!("Access Modes:\t{}\n", access_modes(o.pointer("/spec/accessModes"))));
    out.push_str(&format!(
        "VolumeMode:\t{}\n",
        o.pointer("/spec/volumeMode").and_then(Value::as_str).unwrap_or("Filesystem")
    ));
    out.push_str(&format!("Capacity:\t{}\n", s(o, "/spec/capacity/storage")));
    match o.pointer("/spec/nodeAffinity/required/nodeSelectorTerms").and_then(Value::as_array) {
        None => out.push_str("Node Affinity:\t<none>\n"),
        Some(terms) => {
            out.push_str("Node Affinity:\t\n  Required Terms:\t\n");
            for (n, t) in terms.iter().enumerate() {
                let exprs: Vec<String> = t
                    .get("matchExpressions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        let vals: Vec<String> =
                            e.get("values").and_then(Value::as_array).into_iter().flatten().map(text).collect();
                        format!("{} {} [{}]", s(e, "/key"), s(e, "/operator").to_lowercase(), vals.join(", "))
                    })
                    .collect();
                out.push_str(&format!("    Term {n}:\t{}\n", exprs.join(", ")));
            }
        }
    }
    out.push_str(&format!("Message:\t{}\n", s(o, "/status/message")));
    out.push_str("Source:\n");
    if let Some(h) = o.pointer("/spec/hostPath") {
        out.push_str("    Type:\tHostPath (bare host directory volume)\n");
        out.push_str(&format!("    Path:\t{}\n", s(h, "/path")));
        out.push_str(&format!("    HostPathType:\t{}\n", or_none(s(h, "/type"))));
    } else if let Some(n) = o.pointer("/spec/nfs") {
        out.push_str("    Type:\tNFS (an NFS mount that lasts the lifetime of a pod)\n");
        out.push_str(&format!("    Server:\t{}\n", s(n, "/server")));
        out.push_str(&format!("    Path:\t{}\n", s(n, "/path")));
        out.push_str(&format!("    ReadOnly:\t{}\n", n.get("readOnly").and_then(Value::as_bool).unwrap_or(false)));
    } else if let Some(l) = o.pointer("/spec/local") {
        out.push_str("    Type:\tLocalVolume (a persistent volume backed by local storage on a node)\n");
        out.push_str(&format!("    Path:\t{}\n", s(l, "/path")));
    } else {
        out.push_str(&format!("    Type:\t{}\n", or_unset("")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::print::tabwriter::tabwrite;

    #[test]
    fn configmap_and_secret_layout() {
        let cm = json!({"metadata": {"name": "settings", "namespace": "demo"}, "data": {"GREETING": "hello"}, "binaryData": {"b": "AAE="}});
        assert_eq!(
            tabwrite(&describe_configmap(&cm), 2),
            "Name:         settings\nNamespace:    demo\nLabels:       <none>\nAnnotations:  <none>\n\nData\n====\nGREETING:\n----\nhello\n\n\nBinaryData\n====\nb: 2 bytes\n\n"
        );
        let sec = json!({"metadata": {"name": "creds", "namespace": "demo"}, "type": "Opaque", "data": {"password": "czNjcjN0"}});
        assert!(tabwrite(&describe_secret(&sec), 2).ends_with("\nType:  Opaque\n\nData\n====\npassword:  6 bytes\n"));
    }

    #[test]
    fn ingress_rules_and_backends() {
        let ing = json!({"metadata": {"name": "my-dns", "namespace": "default"}, "spec": {"rules": [{"host": "myservice.com", "http": {"paths": [
            {"path": "/web", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
            {"path": "/other", "backend": {"service": {"name": "other", "port": {"number": 80}}}}]}}]}});
        let extra = json!({"backends": {"web:80": "<none>", "other:80": "<error: services \"other\" not found>"}});
        let t = tabwrite(&describe_ingress(&ing, Some(&extra)), 2);
        assert!(t.contains("  myservice.com  \n                 /web     web:80 (<none>)\n                 /other   other:80 (<error: services \"other\" not found>)\n"), "{t}");
        let svc = json!({"spec": {"ports": [{"name": "http", "port": 80}]}});
        let eps = json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "http", "port": 8080}]}]});
        assert_eq!(
            backend_endpoints(&svc, Some(&eps), &ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]),
            "10.0.0.1:8080"
        );
    }

    #[test]
    fn controller_pod_counts() {
        let o = json!({"metadata": {"uid": "u1"}});
        let pod = |phase: &str, uid: &str| json!({"metadata": {"ownerReferences": [{"uid": uid}]}, "status": {"phase": phase}});
        let pods = [pod("Running", "u1"), pod("Pending", "u1"), pod("Running", "other"), pod("Failed", "u1")];
        assert_eq!(pods_status(&o, &pods), "1 Running / 1 Waiting / 0 Succeeded / 1 Failed");
    }
}

/// `describeHorizontalPodAutoscalerV2`: the metrics as `current / target`, the bounds, the
/// behavior when set, the replica counts and the conditions.
pub fn describe_hpa(o: &Value) -> String {
    let mut out = String::new();
    meta_header(&mut out, o, true);
    map_lines(&mut out, "", "Labels", o.pointer("/metadata/labels"), "=");
    map_lines(&mut out, "", "Annotations", o.pointer("/metadata/annotations"), ": ");
    out.push_str(&format!("CreationTimestamp:\t{}\n", when(o, "/metadata/creationTimestamp")));
    let kind = s(o, "/spec/scaleTargetRef/kind");
    out.push_str(&format!("Reference:\t{kind}/{}\n", s(o, "/spec/scaleTargetRef/name")));
    out.push_str("Metrics:\t( current / target )\n");
    let current = o.pointer("/status/currentMetrics").and_then(Value::as_array).cloned().unwrap_or_default();
    for (idx, m) in o.pointer("/spec/metrics").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let cur = current.get(idx);
        let cur_at = |p: &str| cur.and_then(|c| c.pointer(p)).map(text);
        match m.get("type").and_then(Value::as_str).unwrap_or_default() {
            t @ ("Resource" | "ContainerResource") => {
                let key = if t == "Resource" { "resource" } else { "containerResource" };
                let name = s(m, &format!("/{key}/name"));
                let on = if t == "Resource" {
                    format!("resource {name} on pods")
                } else {
                    format!("resource {name} of container \"{}\" on pods", s(m, "/containerResource/container"))
                };
                if let Some(target) = m.pointer(&format!("/{key}/target/averageValue")) {
                    let c = cur_at(&format!("/{key}/current/averageValue")).unwrap_or_else(|| "<unknown>".into());
                    out.push_str(&format!("  {on}:\t{c} / {}\n", text(target)));
                } else {
                    let c = match (
                        cur_at(&format!("/{key}/current/averageUtilization")),
                        cur_at(&format!("/{key}/current/averageValue")),
                    ) {
                        (Some(u), Some(v)) => format!("{u}% ({v})"),
                        _ => "<unknown>".into(),
                    };
                    let target = m
                        .pointer(&format!("/{key}/target/averageUtilization"))
                        .map(|u| format!("{}%", text(u)))
                        .unwrap_or_else(|| "<auto>".into());
                    out.push_str(&format!("  {on}  (as a percentage of request):\t{c} / {target}\n"));
                }
            }
            "Pods" => {
                let c = cur_at("/pods/current/averageValue").unwrap_or_else(|| "<unknown>".into());
                out.push_str(&format!(
                    "  \"{}\" on pods:\t{c} / {}\n",
                    s(m, "/pods/metric/name"),
                    s(m, "/pods/target/averageValue")
                ));
            }
            "Object" => {
                let on = format!("{}/{}", s(m, "/object/describedObject/kind"), s(m, "/object/describedObject/name"));
                let metric = s(m, "/object/metric/name");
                if m.pointer("/object/target/value").is_some() {
                    let c = cur_at("/object/current/value").unwrap_or_else(|| "<unknown>".into());
                    out.push_str(&format!("  \"{metric}\" on {on}:\t{c} / {}\n", s(m, "/object/target/value")));
                } else {
                    let c = cur_at("/object/current/averageValue").unwrap_or_else(|| "<unknown>".into());
                    out.push_str(&format!(
                        "  \"{metric}\" on {on} (target average value):\t{c} / {}\n",
                        s(m, "/object/target/averageValue")
                    ));
                }
            }
            other => out.push_str(&format!("  <unknown metric type \"{other}\">\n")),
        }
    }
    let min = o.pointer("/spec/minReplicas").map(text).unwrap_or_else(|| "<unset>".into());
    out.push_str(&format!("Min replicas:\t{min}\n"));
    out.push_str(&format!("Max replicas:\t{}\n", i(o, "/spec/maxReplicas")));
    if let Some(b) = o.pointer("/spec/behavior").filter(|b| !b.is_null()) {
        out.push_str("Behavior:\n");
        for (title, key) in [("Scale Up", "scaleUp"), ("Scale Down", "scaleDown")] {
            let Some(r) = b.get(key).filter(|r| !r.is_null()) else { continue };
            out.push_str(&format!("  {title}:\n"));
            if let Some(w) = r.get("stabilizationWindowSeconds") {
                out.push_str(&format!("    Stabilization Window: {} seconds\n", text(w)));
            }
            let policies = r.get("policies").and_then(Value::as_array).cloned().unwrap_or_default();
            if !policies.is_empty() {
                let select = r.get("selectPolicy").map(text).unwrap_or_else(|| "Max".into());
                out.push_str(&format!("    Select Policy: {select}\n    Policies:\n"));
                for p in policies {
                    out.push_str(&format!(
                        "      - Type: {}\tValue: {}\tPeriod: {} seconds\n",
                        s(&p, "/type"),
                        i(&p, "/value"),
                        i(&p, "/periodSeconds")
                    ));
                }
            }
        }
    }
    out.push_str(&format!(
        "{kind} pods:\t{} current / {} desired\n",
        i(o, "/status/currentReplicas"),
        i(o, "/status/desiredReplicas")
    ));
    let conditions = o.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    if !conditions.is_empty() {
        out.push_str("Conditions:\n  Type\tStatus\tReason\tMessage\n  ----\t------\t------\t-------\n");
        for c in conditions {
            out.push_str(&format!(
                "  {}\t{}\t{}\t{}\n",
                s(&c, "/type"),
                s(&c, "/status"),
                s(&c, "/reason"),
                s(&c, "/message")
            ));
        }
    }
    out
}
