//! IPVS mode against the running kernel, as root, each part in a network namespace of its
//! own (the host's addresses and rules are never touched):
//!
//! - the real `IPVS` generic netlink probe: where the kernel has no `ip_vs` (this machine),
//!   the mode is refused at start with a message naming the module and the other modes;
//!   where it has, a virtual server with a real server is added, read back with the dump
//!   requests, and deleted over netlink, and a refused operation is reported by name;
//! - `kube-ipvs0`: created (a dummy device, or an `ifb` one where the kernel has no dummy
//!   devices, as here), its addresses made equal to a desired set twice (adds and deletes),
//!   local to the host while the device stays down, removed;
//! - the iptables helpers: loaded with `iptables-restore`, listed back by `iptables-save`
//!   exactly as rendered, and removed with the jump rules by `kubeproxy --cleanup`.
//!
//! With `CI=true` a missing prerequisite (root, `ip`, `iptables`) fails instead of skipping.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kubeproxy::iptables::{self, Config, Tables};
use kubeproxy::ipvs::{self, Op, RealServer, VirtualServer, VsKey};
use kubeproxy::model::{service_ports, NodeInfo, Protocol, ServicePort};
use kubeproxy::{backend, ipvs_dummy, ipvs_iptables, ipvs_netlink};
use serde_json::json;

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(out.status.success(), "`{cmd}`: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn prerequisites() -> bool {
    let root = sh("id -u").trim() == "0";
    let tools = Command::new("sh")
        .args(["-c", "command -v ip && command -v iptables && command -v iptables-restore && command -v iptables-save"])
        .output()
        .is_ok_and(|o| o.status.success());
    if root && tools {
        return true;
    }
    let msg =
        format!("IPVS test needs root and ip, iptables, iptables-restore, iptables-save (root={root}, tools={tools})");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("SKIP: {msg}");
    false
}

/// A network namespace, deleted on drop (also when the test fails).
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("kpipvs-{tag}-{}", std::process::id());
        sh(&format!("ip netns add {name}"));
        Netns(name)
    }

    /// Run `f` on a thread that has entered the namespace (what it spawns and the sockets
    /// it opens are in it too); a panic in `f` is raised here after the join.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.0);
        let result = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(&path).expect("netns file");
            // SAFETY: a namespace descriptor; setns changes only this thread (and what it spawns).
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join();
        match result {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn service(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})).expect("service")
}

fn slice(svc: &str, ips: &[&str]) -> EndpointSlice {
    let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    serde_json::from_value(json!({"metadata": {"name": format!("{svc}-x"), "namespace": "default",
        "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "endpoints": eps, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}))
    .expect("slice")
}

fn ports() -> Vec<ServicePort> {
    let svcs = [
        service(
            "a",
            json!({"clusterIP": "10.96.0.1", "externalIPs": ["192.0.2.7"],
            "ports": [{"name": "http", "port": 80}]}),
        ),
        service(
            "b",
            json!({"type": "NodePort", "clusterIP": "10.96.0.2",
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        ),
    ];
    service_ports(
        &svcs,
        &[slice("a", &["10.244.1.1", "10.244.1.2"]), slice("b", &["10.244.2.1"])],
        &NodeInfo::named("n"),
    )
}

#[test]
fn ipvs_family_probe() {
    if !prerequisites() {
        return;
    }
    match ipvs_netlink::check_kernel() {
        Err(e) => {
            // This machine: no ip_vs. The refusal comes from the generic netlink controller
            // (ENOENT for the family), before anything is written.
            let msg = format!("{e:#}");
            for needle in
                ["ip_vs", "IPVS", "No such file or directory", "--proxy-mode=nftables", "--proxy-mode=iptables"]
            {
                assert!(msg.contains(needle), "{needle:?} in {msg}");
            }
            assert_eq!(ipvs_netlink::resolve_family("IPVS").expect("the controller answers"), None);
            // The controller itself answers for a family every kernel has.
            assert_eq!(ipvs_netlink::resolve_family("nlctrl").expect("nlctrl"), Some(0x10));
            let refused = backend::Ipvs::new(vec![], "rr".into(), Config::default()).err().expect("refused at start");
            assert!(format!("{refused:#}").contains("ip_vs"));
            assert!(ipvs_netlink::Connection::open().is_err());
            // The binary refuses at start, before writing anything.
            let ns = Netns::new("refuse");
            let out = Command::new("ip")
                .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_kubeproxy"), "--proxy-mode", "ipvs"])
                .args([
                    "--master",
                    "http://127.0.0.1:1",
                    "--network-policy=false",
                    "--healthz-bind-address",
                    "127.0.0.1:0",
                ])
                .output()
                .expect("kubeproxy");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains("ip_vs") && stderr.contains("--proxy-mode=nftables"),
                "{stderr}"
            );
            ns.run(|| {
                assert!(saved("nat").is_empty() && saved("filter").is_empty(), "no rule written");
                assert!(!ipvs_dummy::exists(), "no kube-ipvs0");
            });
            eprintln!("no ip_vs on this kernel: {msg}");
        }
        Ok(family) => {
            eprintln!("IPVS generic netlink family {family}: exercising a round trip");
            Netns::new("rt").run(round_trip);
        }
    }
}

#[test]
fn refusals_are_matched_to_their_operations() {
    if !prerequisites() {
        return;
    }
    // The kernel's answers to IPVS messages sent to the generic netlink controller (0x10),
    // which has none of these commands: every operation is refused with EOPNOTSUPP, so the
    // send and acknowledgement path runs on any kernel, ip_vs or not.
    let mut conn = ipvs_netlink::Connection::with_family(0x10).expect("generic netlink socket");
    let key = VsKey { addr: Ipv4Addr::new(10, 96, 0, 1), port: 80, protocol: Protocol::Tcp };
    let vs = VirtualServer { key: key.clone(), scheduler: "rr".into(), persistence_timeout: None };
    let rs = RealServer { addr: Ipv4Addr::new(10, 244, 1, 1), port: 8080, weight: 1 };
    let ops = [
        Op::BindAddress(key.addr),
        Op::AddVirtualServer(vs),
        Op::AddRealServer(key.clone(), rs.clone()),
        Op::DeleteRealServer(key, rs),
    ];
    let err = format!("{:#}", conn.apply(&ops).expect_err("refused"));
    assert!(
        err.contains("operation 1 of 3 (add virtual server tcp 10.96.0.1:80 (scheduler rr))")
            && err.contains("Operation not supported")
            && err.contains("2 more refused"),
        "{err}"
    );
    // More operations than go out in one sendmsg: every acknowledgement is collected.
    let many: Vec<Op> = (0..1200u16)
        .map(|i| {
            let key = VsKey { addr: Ipv4Addr::new(10, 96, (i >> 8) as u8, i as u8), port: 80, protocol: Protocol::Udp };
            Op::DeleteVirtualServer(key)
        })
        .collect();
    let err = format!("{:#}", conn.apply(&many).expect_err("refused"));
    assert!(
        err.contains("operation 1 of 1200 (delete virtual server udp 10.96.0.0:80)")
            && err.contains("1199 more refused"),
        "{err}"
    );
    // The same socket goes on: a dump request is answered (refused) too.
    let err = format!("{:#}", conn.read(|_| true).expect_err("refused"));
    assert!(err.contains("Operation not supported"), "{err}");
}

#[test]
fn a_backend_sync_programs_addresses_and_rules_then_ipvs() {
    if !prerequisites() {
        return;
    }
    use kubeproxy::backend::Backend;
    let has_ipvs = ipvs_netlink::check_kernel().is_ok();
    Netns::new("sync").run(move || {
        let cfg = Config { cluster_cidr: Some("10.244.0.0/16".into()), ..Default::default() };
        let node = vec![Ipv4Addr::new(192, 168, 1, 10)];
        let mut b = backend::Ipvs::unchecked(node.clone(), "rr".into(), cfg.clone());
        let arcs: Vec<_> = ports().into_iter().map(std::sync::Arc::new).collect();
        let result = b.sync(&arcs);
        // Addresses and iptables rules come first, whatever the kernel's IPVS.
        let desired = ipvs::desired(&arcs, &node, "rr");
        assert_eq!(ipvs_dummy::addresses().unwrap(), desired.bound);
        assert_eq!(saved("nat"), ipvs_iptables::render(&arcs, &cfg, &node).nat);
        if has_ipvs {
            let stats = result.expect("sync");
            assert!(stats.wrote);
            let mut conn = ipvs_netlink::Connection::open().unwrap();
            assert_eq!(conn.read(|_| true).unwrap(), desired.services);
            // Forgotten state: the next sync reads the kernel back and has nothing to do.
            b.invalidate();
            b.sync(&arcs).expect("sync again");
            assert_eq!(conn.read(|_| true).unwrap(), desired.services);
        } else {
            let err = format!("{:#}", result.expect_err("no IPVS family"));
            assert!(err.contains("IPVS") && err.contains("ip_vs"), "{err}");
            // The failed sync forgot its state: the next one starts from the kernel again
            // (the same addresses and rules, then the same refusal).
            assert!(b.sync(&arcs).is_err());
            assert_eq!(ipvs_dummy::addresses().unwrap(), desired.bound);
        }
    });
}

/// On a kernel with ip_vs (IPVS tables are per network namespace).
fn round_trip() {
    let mut conn = ipvs_netlink::Connection::open().expect("IPVS family");
    let key = VsKey { addr: Ipv4Addr::new(10, 96, 0, 1), port: 80, protocol: Protocol::Tcp };
    let vs = VirtualServer { key: key.clone(), scheduler: "rr".into(), persistence_timeout: Some(10800) };
    let rs = RealServer { addr: Ipv4Addr::new(10, 244, 1, 1), port: 8080, weight: 1 };
    conn.apply(&[Op::AddVirtualServer(vs.clone()), Op::AddRealServer(key.clone(), rs.clone())]).expect("add");
    let read = conn.read(|_| true).expect("dump");
    assert_eq!(read.get(&key), Some(&(vs.clone(), BTreeSet::from([rs.clone()]))));
    // Adding it again: the kernel refuses, and the error names the operation.
    let err = conn.apply(&[Op::AddVirtualServer(vs)]).expect_err("exists");
    assert!(format!("{err:#}").contains("add virtual server tcp 10.96.0.1:80"), "{err:#}");
    conn.apply(&[Op::DeleteRealServer(key.clone(), rs), Op::DeleteVirtualServer(key.clone())]).expect("delete");
    assert!(conn.read(|_| true).expect("dump").is_empty());
}

#[test]
fn kube_ipvs0_addresses_follow_the_services() {
    if !prerequisites() {
        return;
    }
    Netns::new("dummy").run(|| {
        let set = |v: &[&str]| v.iter().map(|s| s.parse().unwrap()).collect::<BTreeSet<Ipv4Addr>>();
        assert!(!ipvs_dummy::exists());
        assert!(ipvs_dummy::addresses().unwrap().is_empty());
        // The Service addresses the IPVS state binds: cluster and external IPs.
        let desired = ipvs::desired(&ports(), &[Ipv4Addr::new(192, 168, 1, 10)], "rr").bound;
        assert_eq!(desired, set(&["10.96.0.1", "10.96.0.2", "192.0.2.7"]));
        assert_eq!(ipvs_dummy::sync(&BTreeSet::new(), &desired).unwrap(), 3);
        assert_eq!(ipvs_dummy::addresses().unwrap(), desired);
        let routes = sh("ip route show table local dev kube-ipvs0");
        assert!(routes.contains("local 10.96.0.1 "), "the host accepts a Service address: {routes}");
        // A local address: something on the host may listen on it (the device stays down).
        std::net::TcpListener::bind("10.96.0.1:0").expect("bind a Service address");
        assert!(!sh("ip -o link show dev kube-ipvs0").contains(",UP"), "kube-ipvs0 stays down");
        // From what the kernel has: one stays, two go, one comes.
        let next = set(&["10.96.0.2", "10.96.0.3"]);
        assert_eq!(ipvs_dummy::sync(&ipvs_dummy::addresses().unwrap(), &next).unwrap(), 3);
        assert_eq!(ipvs_dummy::addresses().unwrap(), next);
        assert_eq!(ipvs_dummy::sync(&next, &next).unwrap(), 0, "nothing to change");
        sh("ip -4 -o addr show dev kube-ipvs0 | grep -q 'inet 10.96.0.3/32'");
        ipvs_dummy::remove().unwrap();
        assert!(!ipvs_dummy::exists());
    });
}

/// `iptables-save -t TABLE` as chain → rules, for our chains.
fn saved(table: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in sh(&format!("iptables-save -t {table}")).lines() {
        if let Some(c) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next()) {
            if c.starts_with("KUBE-") {
                out.entry(c.to_string()).or_default();
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            if chain.starts_with("KUBE-") {
                out.entry(chain.to_string()).or_default().push(line.to_string());
            }
        }
    }
    out
}

fn jumps(table: &str) -> Vec<String> {
    sh(&format!("iptables-save -t {table}"))
        .lines()
        .filter(|l| l.starts_with("-A ") && !l.starts_with("-A KUBE-") && l.contains("-j KUBE-"))
        .map(String::from)
        .collect()
}

#[test]
fn iptables_helpers_load_and_are_cleaned_up() {
    if !prerequisites() {
        return;
    }
    let ns = Netns::new("ipt");
    ns.run(|| {
        let cfg = Config { cluster_cidr: Some("10.244.0.0/16".into()), ..Default::default() };
        let rules = ipvs_iptables::render(&ports(), &cfg, &[]);
        let input = iptables::restore_input(&Tables::default(), &rules).expect("rules");
        backend::run_with_input("iptables-restore", &["-w", "--noflush"], &input).expect("iptables-restore");
        backend::ensure_jump_rules(&ipvs_iptables::jump_rules()).expect("jump rules");
        backend::ensure_jump_rules(&ipvs_iptables::jump_rules()).expect("jump rules are not doubled");
        // The kernel holds exactly what was rendered, in iptables-save's own words.
        assert_eq!(saved("nat"), rules.nat);
        assert_eq!(saved("filter"), rules.filter);
        assert_eq!(jumps("nat").len(), 3, "{:?}", jumps("nat"));
        assert_eq!(jumps("filter").len(), 3, "{:?}", jumps("filter"));
        // A second sync writes only the chain that changed.
        let mut cfg2 = cfg.clone();
        cfg2.masquerade_all = true;
        let rules2 = ipvs_iptables::render(&ports(), &cfg2, &[]);
        let input2 = iptables::restore_input(&rules, &rules2).expect("a change");
        assert!(input2.contains(":KUBE-SERVICES") && !input2.contains(":KUBE-POSTROUTING"), "{input2}");
        backend::run_with_input("iptables-restore", &["-w", "--noflush"], &input2).expect("iptables-restore");
        assert_eq!(saved("nat"), rules2.nat);
        // And a kube-ipvs0 for --cleanup to remove.
        ipvs_dummy::sync(&BTreeSet::new(), &BTreeSet::from([Ipv4Addr::new(10, 96, 0, 1)])).unwrap();
    });
    // The binary's --cleanup, run in the namespace.
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.0, env!("CARGO_BIN_EXE_kubeproxy"), "--cleanup"])
        .output()
        .expect("kubeproxy --cleanup");
    assert!(out.status.success(), "--cleanup: {}", String::from_utf8_lossy(&out.stderr));
    ns.run(|| {
        assert!(saved("nat").is_empty() && saved("filter").is_empty(), "every KUBE-* chain removed");
        assert!(jumps("nat").is_empty() && jumps("filter").is_empty(), "every jump rule removed");
        assert!(!ipvs_dummy::exists(), "kube-ipvs0 removed");
    });
}
