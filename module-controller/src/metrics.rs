//! Prometheus metrics of the module-controller (and the base), registered in one registry
//! that `/metrics` serves.

use std::sync::LazyLock;

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    /// Tunnel messages received, by kind (`heart`, `health`, `simpleBiz`, …).
    pub messages_received: IntCounterVec,
    /// Tunnel messages dropped, by reason (`malformed`, `stale`, `unowned`).
    pub messages_dropped: IntCounterVec,
    /// Commands sent to bases, by command.
    pub commands_sent: IntCounterVec,
    /// API writes, by kind (`pod_status`, `node_status`, `node`, `lease`, `pod_delete`).
    pub api_writes: IntCounterVec,
    /// Virtual nodes this replica owns.
    pub owned_vnodes: IntGauge,
}

fn counter(name: &str, help: &str, label: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), &[label]).unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let registry = Registry::new();
    let m = Metrics {
        messages_received: counter(
            "module_controller_tunnel_messages_received_total",
            "Tunnel messages received",
            "kind",
        ),
        messages_dropped: counter(
            "module_controller_tunnel_messages_dropped_total",
            "Tunnel messages dropped",
            "reason",
        ),
        commands_sent: counter("module_controller_tunnel_commands_sent_total", "Commands sent to bases", "command"),
        api_writes: counter("module_controller_api_writes_total", "Writes to the apiserver", "kind"),
        owned_vnodes: IntGauge::new("module_controller_owned_vnodes", "Virtual nodes owned by this replica")
            .unwrap_or_else(|e| panic!("metric: {e}")),
        registry,
    };
    for c in [&m.messages_received, &m.messages_dropped, &m.commands_sent, &m.api_writes] {
        let _ = m.registry.register(Box::new(c.clone()));
    }
    let _ = m.registry.register(Box::new(m.owned_vnodes.clone()));
    m
});
