//! RBAC benchmark: what authorization costs.
//!
//!     cargo bench -p e2e --bench rbac
//!     BENCH_SECONDS=5 cargo bench -p e2e --bench rbac
//!     BENCH_APISERVER_BIN=/path/to/apiserver cargo bench -p e2e --bench rbac   # another build
//!
//! Figures, each with its baseline from the same run:
//! - the decision per request (the request's attributes from its method, path and query,
//!   then the authorizers) with 1,000 roles and 1,000 bindings in the index — allowed,
//!   and refused after looking at every binding that applies — against AlwaysAllow's;
//! - gets/s of one pod through a release apiserver with `--authorization-mode=RBAC`
//!   (the same 1,000 roles and bindings stored) against one with AlwaysAllow, both behind
//!   the same token authentication, 16 concurrent keep-alive clients.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::authz::rbac::{Index, Objects};
use apiserver::authz::{request_attributes, Authorizer, Decision, Mode, User};
use e2e::ApiServer;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use serde_json::json;

const ROLES: usize = 1000;
const BINDINGS: usize = 1000;
const NAMESPACES: usize = 50;

fn seconds() -> Duration {
    Duration::from_secs_f64(std::env::var("BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0))
}

fn rule(verbs: &[&str], group: &str, resources: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

fn meta(name: String, ns: Option<String>) -> ObjectMeta {
    ObjectMeta { name: Some(name), namespace: ns, ..Default::default() }
}

fn role_ref(kind: &str, name: String) -> RoleRef {
    RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: kind.into(), name }
}

fn user_subject(name: String) -> Subject {
    Subject { kind: "User".into(), name, api_group: Some("rbac.authorization.k8s.io".into()), namespace: None }
}

/// 1,000 roles (half ClusterRoles, half Roles over 50 namespaces, four rules each) and
/// 1,000 bindings (half cluster-wide to 500 users, half namespaced to 500 others), plus
/// jane's: `view`-like rules on pods in `ns-0` and a group binding she is in.
fn objects() -> Objects {
    let mut o = Objects::default();
    let rules = |i: usize| {
        vec![
            rule(&["get", "list", "watch"], "", &["pods", "pods/log", "services", "configmaps"]),
            rule(&["get", "list"], "apps", &["deployments", "replicasets", "statefulsets"]),
            rule(&["create", "update"], "batch", &[&format!("jobs-{i}")]),
            rule(&["delete"], "", &["secrets"]),
        ]
    };
    for i in 0..ROLES / 2 {
        o.cluster_roles.insert(
            format!("cr-{i}"),
            ClusterRole { metadata: meta(format!("cr-{i}"), None), rules: Some(rules(i)), aggregation_rule: None },
        );
        let ns = format!("ns-{}", i % NAMESPACES);
        o.roles.insert(
            (ns.clone(), format!("r-{i}")),
            Role { metadata: meta(format!("r-{i}"), Some(ns)), rules: Some(rules(i)) },
        );
    }
    for i in 0..BINDINGS / 2 {
        o.cluster_role_bindings.insert(
            format!("crb-{i}"),
            ClusterRoleBinding {
                metadata: meta(format!("crb-{i}"), None),
                role_ref: role_ref("ClusterRole", format!("cr-{i}")),
                subjects: Some(vec![user_subject(format!("cluster-user-{i}"))]),
            },
        );
        let ns = format!("ns-{}", i % NAMESPACES);
        o.role_bindings.insert(
            (ns.clone(), format!("rb-{i}")),
            RoleBinding {
                metadata: meta(format!("rb-{i}"), Some(ns)),
                role_ref: role_ref("Role", format!("r-{i}")),
                subjects: Some(vec![user_subject(format!("user-{i}")), user_subject("jane".into())]),
            },
        );
    }
    o
}

/// ns per decision over `iterations` of `f`.
fn per_op(mut f: impl FnMut() -> bool) -> f64 {
    let iterations = 200_000;
    let mut allowed = 0usize;
    let start = Instant::now();
    for _ in 0..iterations {
        allowed += usize::from(std::hint::black_box(f()));
    }
    std::hint::black_box(allowed);
    start.elapsed().as_nanos() as f64 / iterations as f64
}

fn bench_decision() {
    let rbac = Authorizer::new(vec![Mode::Node, Mode::Rbac]);
    let t = Instant::now();
    rbac.rbac.set(Index::build(&objects()));
    let build = t.elapsed();
    let allow = Authorizer::new(vec![Mode::AlwaysAllow]);
    let jane = User { name: "jane".into(), uid: "u".into(), groups: vec!["system:authenticated".into()] };
    let get = http::Method::GET;
    let decide = |a: &Authorizer, path: &str, query: &str| {
        let attrs = request_attributes(&get, path, query, jane.clone());
        a.authorize(&attrs).decision == Decision::Allow
    };
    let pod = "/api/v1/namespaces/ns-0/pods/web";
    let denied = "/api/v1/namespaces/ns-0/secrets/token";
    let list = "/api/v1/namespaces/ns-0/pods";
    assert!(decide(&rbac, pod, ""), "jane may get pods in ns-0");
    assert!(!decide(&rbac, denied, ""), "jane may not get secrets");
    let base = per_op(|| decide(&allow, pod, ""));
    let rows = [
        ("get pod, allowed", per_op(|| decide(&rbac, pod, ""))),
        ("watch pods by name, allowed", per_op(|| decide(&rbac, list, "watch=true&fieldSelector=metadata.name%3Dweb"))),
        ("get secret, refused", per_op(|| decide(&rbac, denied, ""))),
    ];
    println!("\nauthorization decision per request ({ROLES} roles, {BINDINGS} bindings; index built in {build:?})");
    println!("  {:<36} {:>12} {:>14} {:>8}", "request", "RBAC", "AlwaysAllow", "ratio");
    for (what, ns) in rows {
        println!("  {what:<36} {:>9.2} µs {:>11.2} µs {:>7.1}x", ns / 1000.0, base / 1000.0, ns / base);
    }
}

/// Gets/s of one pod from 16 clients with `token`.
async fn gets(server: &ApiServer, token: &str) -> f64 {
    let mut config = kube::Config::new(server.url().parse().expect("url"));
    config.auth_info.token = Some(token.to_string().into());
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).expect("client"), "default");
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (pods, count) = (pods.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                pods.get("web").await.expect("get");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Store the benchmark's roles and bindings (and jane's view of `default`) as the admin.
async fn load_policy(server: &ApiServer) {
    let mut config = kube::Config::new(server.url().parse().expect("url"));
    config.auth_info.token = Some("admin-token".to_string().into());
    let client = kube::Client::try_from(config).expect("client");
    let o = objects();
    let pp = PostParams::default();
    let cr: Api<ClusterRole> = Api::all(client.clone());
    let crb: Api<ClusterRoleBinding> = Api::all(client.clone());
    let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for i in 0..NAMESPACES {
        let ns = serde_json::from_value(json!({"metadata": {"name": format!("ns-{i}")}})).expect("namespace");
        ns_api.create(&pp, &ns).await.expect("create namespace");
    }
    futures::future::join_all(o.cluster_roles.values().map(|r| cr.create(&pp, r))).await;
    futures::future::join_all(o.cluster_role_bindings.values().map(|b| crb.create(&pp, b))).await;
    futures::future::join_all(o.roles.iter().map(|((ns, _), r)| {
        let api: Api<Role> = Api::namespaced(client.clone(), ns);
        let pp = pp.clone();
        async move { api.create(&pp, r).await }
    }))
    .await;
    futures::future::join_all(o.role_bindings.iter().map(|((ns, _), b)| {
        let api: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
        let pp = pp.clone();
        async move { api.create(&pp, b).await }
    }))
    .await;
    let rb: Api<RoleBinding> = Api::namespaced(client.clone(), "default");
    let view = RoleBinding {
        metadata: meta("jane-view".into(), None),
        role_ref: role_ref("ClusterRole", "cr-0".into()),
        subjects: Some(vec![user_subject("jane".into())]),
    };
    rb.create(&pp, &view).await.expect("jane's binding");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]}}))
    .expect("pod");
    pods.create(&pp, &pod).await.expect("create pod");
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    bench_decision();

    e2e::use_release_apiserver();
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "admin-token,admin,1,\"system:masters\"\njane-token,jane,2\n").expect("token file");
    let tokens = tokens.to_string_lossy().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let rbac = ApiServer::start_with(&["--token-auth-file", &tokens, "--authorization-mode=RBAC"]).expect("apiserver");
    let allow = ApiServer::start_with(&["--token-auth-file", &tokens]).expect("apiserver");
    let (with_rbac, always) = rt.block_on(async {
        load_policy(&rbac).await;
        load_policy(&allow).await;
        // The binding reaches the index through its watch.
        let mut config = kube::Config::new(rbac.url().parse().expect("url"));
        config.auth_info.token = Some("jane-token".to_string().into());
        let jane: Api<Pod> = Api::namespaced(kube::Client::try_from(config).expect("client"), "default");
        let until = Instant::now() + Duration::from_secs(30);
        while jane.get("web").await.is_err() {
            assert!(Instant::now() < until, "jane's binding never took effect");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Warm both, then measure each twice, alternating.
        gets(&rbac, "jane-token").await;
        gets(&allow, "jane-token").await;
        let (a1, b1) = (gets(&rbac, "jane-token").await, gets(&allow, "jane-token").await);
        let (b2, a2) = (gets(&allow, "jane-token").await, gets(&rbac, "jane-token").await);
        ((a1 + a2) / 2.0, (b1 + b2) / 2.0)
    });
    println!("\ngets/s of one pod through the apiserver (16 clients, {:?} each, token authentication)", seconds());
    println!("  {:<36} {:>12} {:>14} {:>8}", "", "RBAC", "AlwaysAllow", "ratio");
    println!("  {:<36} {with_rbac:>12.0} {always:>14.0} {:>7.2}x", "gets/s", with_rbac / always);
}
