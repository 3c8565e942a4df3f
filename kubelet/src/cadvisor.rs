//! The kubelet's container metrics for Prometheus: `/metrics/cadvisor` (the series the
//! kubelet's embedded cAdvisor exports, with its names, help texts and labels) and
//! `/metrics/resource` (the kubelet's small, stable resource-metrics set that metrics
//! pipelines read).
//!
//! Both are pure renderings of the samples housekeeping keeps ([`crate::stats`]), so a
//! scrape reads no cgroup file and makes no Docker call beyond the (cached) container list.
//!
//! Labels on `/metrics/cadvisor` are cAdvisor's as the kubelet sets them: `container` (the
//! pod's container name; `POD` for the sandbox, which carries the pod's network counters, as
//! the kubelet's Docker integration reported them), `id` (the cgroup), `image`, `name`
//! (Docker's container name), `namespace`, `pod`. Samples carry the time they were read.

use common::exposition::{Kind, Writer};

use crate::stats::{ContainerSample, NodeReading, PodSample};

/// What `machine_*` reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    pub cores: u64,
    pub memory_bytes: u64,
}

fn ms(t: jiff::Timestamp) -> i64 {
    t.as_millisecond()
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

type Value = fn(&ContainerSample) -> Option<f64>;

/// The per-container families: name, help, type, value.
const CONTAINER_FAMILIES: &[(&str, &str, Kind, Value)] = &[
    ("container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.", Kind::Counter, |s| {
        Some(secs(s.reading.cpu_system_ns))
    }),
    ("container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.", Kind::Counter, |s| {
        Some(secs(s.reading.cpu_user_ns))
    }),
    ("container_memory_cache", "Number of bytes of page cache memory.", Kind::Gauge, |s| {
        Some(s.reading.cache_bytes as f64)
    }),
    ("container_memory_rss", "Size of RSS in bytes.", Kind::Gauge, |s| Some(s.reading.rss_bytes as f64)),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        Kind::Gauge,
        |s| Some(s.reading.usage_bytes as f64),
    ),
    ("container_memory_working_set_bytes", "Current working set in bytes.", Kind::Gauge, |s| {
        Some(s.reading.working_set_bytes as f64)
    }),
    ("container_spec_memory_limit_bytes", "Memory limit for the container.", Kind::Gauge, |s| {
        Some(s.reading.limit_bytes as f64)
    }),
    ("container_start_time_seconds", "Start time of the container since unix epoch in seconds.", Kind::Gauge, |s| {
        s.started_at.map(|t| t.as_second() as f64)
    }),
];

/// The network families: name, help, value of an interface.
type NetValue = fn(&crate::netstats::Interface) -> u64;
const NETWORK_FAMILIES: &[(&str, &str, NetValue)] = &[
    ("container_network_receive_bytes_total", "Cumulative count of bytes received", |i| i.rx_bytes),
    ("container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", |i| {
        i.rx_errors
    }),
    ("container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving", |i| {
        i.rx_dropped
    }),
    ("container_network_receive_packets_total", "Cumulative count of packets received", |i| i.rx_packets),
    ("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", |i| i.tx_bytes),
    ("container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", |i| {
        i.tx_errors
    }),
    (
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        |i| i.tx_dropped,
    ),
    ("container_network_transmit_packets_total", "Cumulative count of packets transmitted", |i| i.tx_packets),
];

fn labels(s: &ContainerSample) -> [(&'static str, &str); 6] {
    [
        ("container", &s.container),
        ("id", &s.id),
        ("image", &s.image),
        ("name", &s.name),
        ("namespace", &s.namespace),
        ("pod", &s.pod),
    ]
}

/// `/metrics/cadvisor`.
pub fn render(containers: &[ContainerSample], pods: &[PodSample], machine: Machine) -> String {
    let mut w = Writer::new();
    let name = "container_cpu_usage_seconds_total";
    w.family(name, "Cumulative cpu time consumed in seconds.", Kind::Counter);
    for s in containers {
        let l = labels(s);
        let with_cpu = [l[0], ("cpu", "total"), l[1], l[2], l[3], l[4], l[5]];
        w.sample(name, &with_cpu, secs(s.reading.cpu_ns), Some(ms(s.at)));
    }
    let name = "container_fs_usage_bytes";
    w.family(name, "Number of bytes that are consumed by the container on this filesystem.", Kind::Gauge);
    for s in containers {
        if let Some(fs) = &s.fs {
            let l = labels(s);
            let with_device = [l[0], ("device", fs.device.as_str()), l[1], l[2], l[3], l[4], l[5]];
            w.sample(name, &with_device, fs.bytes as f64, Some(ms(fs.at)));
        }
    }
    for (name, help, kind, value) in CONTAINER_FAMILIES {
        w.family(name, help, *kind);
        for s in containers {
            if let Some(v) = value(s) {
                w.sample(name, &labels(s), v, Some(ms(s.at)));
            }
        }
    }
    for (name, help, value) in NETWORK_FAMILIES {
        w.family(name, help, Kind::Counter);
        for p in pods {
            for i in &p.network.interfaces {
                let l = [
                    ("container", "POD"),
                    ("id", p.id.as_str()),
                    ("image", p.image.as_str()),
                    ("interface", i.name.as_str()),
                    ("name", p.name.as_str()),
                    ("namespace", p.namespace.as_str()),
                    ("pod", p.pod.as_str()),
                ];
                w.sample(name, &l, value(i) as f64, Some(ms(p.network.at)));
            }
        }
    }
    w.family(
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        Kind::Gauge,
    )
    .sample("container_scrape_error", &[], 0.0, None);
    w.family("machine_cpu_cores", "Number of logical CPU cores.", Kind::Gauge).sample(
        "machine_cpu_cores",
        &[],
        machine.cores as f64,
        None,
    );
    w.family("machine_memory_bytes", "Amount of memory installed on the machine.", Kind::Gauge).sample(
        "machine_memory_bytes",
        &[],
        machine.memory_bytes as f64,
        None,
    );
    w.finish()
}

/// `/metrics/resource`: the kubelet's resource metrics (stable, hence the `[STABLE]`
/// prefix Kubernetes puts on their help texts).
pub fn render_resource(containers: &[ContainerSample], node: &NodeReading) -> String {
    let mut w = Writer::new();
    fn cl(s: &ContainerSample) -> [(&'static str, &str); 3] {
        [("container", &s.container), ("namespace", &s.namespace), ("pod", &s.pod)]
    }
    let name = "container_cpu_usage_seconds_total";
    w.family(name, "[STABLE] Cumulative cpu time consumed by the container in core-seconds", Kind::Counter);
    for s in containers {
        w.sample(name, &cl(s), secs(s.reading.cpu_ns), Some(ms(s.at)));
    }
    let name = "container_memory_working_set_bytes";
    w.family(name, "[STABLE] Current working set of the container in bytes", Kind::Gauge);
    for s in containers {
        w.sample(name, &cl(s), s.reading.working_set_bytes as f64, Some(ms(s.at)));
    }
    let name = "container_start_time_seconds";
    w.family(name, "[STABLE] Start time of the container since unix epoch in seconds", Kind::Gauge);
    for s in containers {
        if let Some(t) = s.started_at {
            w.sample(name, &cl(s), t.as_second() as f64, Some(ms(s.at)));
        }
    }
    let name = "node_cpu_usage_seconds_total";
    w.family(name, "[STABLE] Cumulative cpu time consumed by the node in core-seconds", Kind::Counter).sample(
        name,
        &[],
        secs(node.cpu_ns),
        Some(ms(node.at)),
    );
    let name = "node_memory_working_set_bytes";
    w.family(name, "[STABLE] Current working set of the node in bytes", Kind::Gauge).sample(
        name,
        &[],
        node.working_set_bytes() as f64,
        Some(ms(node.at)),
    );
    // Pods: the sum of their containers, at the newest of their samples.
    let mut pods: Vec<(&str, &str, u64, u64, i64)> = Vec::new();
    for s in containers {
        match pods.last_mut() {
            Some(p) if p.0 == s.namespace && p.1 == s.pod => {
                p.2 += s.reading.cpu_ns;
                p.3 += s.reading.working_set_bytes;
                p.4 = p.4.max(ms(s.at));
            }
            _ => pods.push((&s.namespace, &s.pod, s.reading.cpu_ns, s.reading.working_set_bytes, ms(s.at))),
        }
    }
    let name = "pod_cpu_usage_seconds_total";
    w.family(name, "[STABLE] Cumulative cpu time consumed by the pod in core-seconds", Kind::Counter);
    for (ns, pod, cpu, _, at) in &pods {
        w.sample(name, &[("namespace", ns), ("pod", pod)], secs(*cpu), Some(*at));
    }
    let name = "pod_memory_working_set_bytes";
    w.family(name, "[STABLE] Current working set of the pod in bytes", Kind::Gauge);
    for (ns, pod, _, mem, at) in &pods {
        w.sample(name, &[("namespace", ns), ("pod", pod)], *mem as f64, Some(*at));
    }
    w.family(
        "scrape_error",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        Kind::Gauge,
    )
    .sample("scrape_error", &[], 0.0, None);
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::Reading;
    use crate::netstats::Interface;
    use crate::stats::{FsUsage, Network};

    fn t(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn sample(pod: &str, container: &str) -> ContainerSample {
        ContainerSample {
            namespace: "default".into(),
            pod: pod.into(),
            container: container.into(),
            image: "busybox".into(),
            name: format!("k8s_{container}_{pod}"),
            id: format!("/docker/{container}"),
            reading: Reading {
                cpu_ns: 1_500_000_000,
                cpu_user_ns: 1_000_000_000,
                cpu_system_ns: 500_000_000,
                usage_bytes: 4096,
                working_set_bytes: 2048,
                rss_bytes: 1024,
                cache_bytes: 512,
                limit_bytes: 0,
            },
            at: t(1_700_000_010),
            started_at: Some(t(1_700_000_000)),
            fs: Some(FsUsage { device: "/dev/vda".into(), bytes: 8192, at: t(1_700_000_005) }),
        }
    }

    #[test]
    fn cadvisor_series_and_labels() {
        let pods = [PodSample {
            namespace: "default".into(),
            pod: "web".into(),
            image: "pause".into(),
            name: "k8s_POD_web".into(),
            id: "/docker/sandbox".into(),
            network: Network {
                interfaces: vec![Interface { name: "eth0".into(), rx_bytes: 100, tx_bytes: 50, ..Default::default() }],
                at: t(1_700_000_010),
            },
        }];
        let text = render(&[sample("web", "nginx")], &pods, Machine { cores: 2, memory_bytes: 1 << 30 });
        let l = r#"container="nginx",id="/docker/nginx",image="busybox",name="k8s_nginx_web",namespace="default",pod="web""#;
        for line in [
            "# TYPE container_cpu_usage_seconds_total counter".to_string(),
            r#"container_cpu_usage_seconds_total{container="nginx",cpu="total",id="/docker/nginx",image="busybox",name="k8s_nginx_web",namespace="default",pod="web"} 1.5 1700000010000"#.to_string(),
            r#"container_fs_usage_bytes{container="nginx",device="/dev/vda",id="/docker/nginx",image="busybox",name="k8s_nginx_web",namespace="default",pod="web"} 8192 1700000005000"#.to_string(),
            format!("container_memory_working_set_bytes{{{l}}} 2048 1700000010000"),
            format!("container_memory_rss{{{l}}} 1024 1700000010000"),
            format!("container_spec_memory_limit_bytes{{{l}}} 0 1700000010000"),
            format!("container_start_time_seconds{{{l}}} 1.7e+09 1700000010000"),
            r#"container_network_receive_bytes_total{container="POD",id="/docker/sandbox",image="pause",interface="eth0",name="k8s_POD_web",namespace="default",pod="web"} 100 1700000010000"#.to_string(),
            r#"container_network_transmit_bytes_total{container="POD",id="/docker/sandbox",image="pause",interface="eth0",name="k8s_POD_web",namespace="default",pod="web"} 50 1700000010000"#.to_string(),
            "machine_cpu_cores 2".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Every family has its HELP and TYPE once.
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(types, helps);
        assert_eq!(types, 2 + CONTAINER_FAMILIES.len() + NETWORK_FAMILIES.len() + 3);
    }

    #[test]
    fn resource_metrics_sum_pods() {
        let node =
            NodeReading { cpu_ns: 7_000_000_000, memory_total: 1000, memory_available: 400, at: t(1_700_000_020) };
        let text = render_resource(&[sample("web", "a"), sample("web", "b"), sample("db", "c")], &node);
        for line in [
            "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds",
            r#"container_cpu_usage_seconds_total{container="a",namespace="default",pod="web"} 1.5 1700000010000"#,
            r#"container_memory_working_set_bytes{container="c",namespace="default",pod="db"} 2048 1700000010000"#,
            "node_cpu_usage_seconds_total 7 1700000020000",
            "node_memory_working_set_bytes 600 1700000020000",
            r#"pod_cpu_usage_seconds_total{namespace="default",pod="web"} 3 1700000010000"#,
            r#"pod_memory_working_set_bytes{namespace="default",pod="db"} 2048 1700000010000"#,
            "scrape_error 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
