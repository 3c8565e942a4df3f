//! The base side of the MQTT tunnel, for one base or many simulated ones sharing one
//! connection: heartbeats every interval, `queryBaseline` once on first connect, and
//! answers to `health`, `queryAllBiz`, `installBiz`, `uninstallBiz` and the baseline.
//! Retained command replays (delivered with the retain flag on subscribe) are ignored: a
//! restarted base gets its modules through the baseline and the controller's reconcile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, Packet, QoS, SubscribeFilter};
use serde::Serialize;

use super::host::{Failure, Host};
use crate::mqtt::MqttConfig;
use crate::protocol::{
    now_ms, ArkResponse, BaseMetadata, BizModel, BizOperationResponse, Envelope, HeartbeatData, OperationResultData,
    Topics, CMD_HEALTH, CMD_INSTALL_BIZ, CMD_QUERY_ALL_BIZ, CMD_UNINSTALL_BIZ, CODE_FAILED, CODE_SUCCESS,
};

/// Who a base is.
#[derive(Clone, Debug)]
pub struct BaseIdentity {
    pub id: String,
    pub name: String,
    pub version: String,
    pub cluster_name: String,
    pub local_ip: String,
    pub host_name: String,
    pub arklet_port: u16,
}

impl BaseIdentity {
    pub fn metadata(&self) -> BaseMetadata {
        BaseMetadata {
            identity: self.id.clone(),
            version: self.version.clone(),
            cluster_name: self.cluster_name.clone(),
            name: self.name.clone(),
        }
    }
    pub fn heartbeat(&self) -> HeartbeatData {
        HeartbeatData {
            base_metadata: self.metadata(),
            local_ip: self.local_ip.clone(),
            local_host_name: self.host_name.clone(),
            port: self.arklet_port as i32,
            state: "ACTIVATED".into(),
        }
    }
}

/// One hosted base.
pub struct BaseEntry {
    pub identity: BaseIdentity,
    pub host: Arc<dyn Host>,
}

/// Message counters of a running agent.
#[derive(Default)]
pub struct AgentStats {
    pub received: AtomicU64,
    pub sent: AtomicU64,
}

/// The reply to an install/uninstall.
pub fn operation_reply(
    command: &str,
    biz: &BizModel,
    base_id: &str,
    result: &Result<(), Failure>,
) -> BizOperationResponse {
    let response = match result {
        Ok(()) => ArkResponse {
            code: CODE_SUCCESS.into(),
            data: OperationResultData { code: CODE_SUCCESS.into(), message: String::new() },
            message: String::new(),
            error_stack_trace: String::new(),
            base_identity: base_id.into(),
        },
        Err(f) => ArkResponse {
            code: CODE_FAILED.into(),
            data: OperationResultData { code: f.reason.clone(), message: f.message.clone() },
            message: f.message.clone(),
            error_stack_trace: String::new(),
            base_identity: base_id.into(),
        },
    };
    BizOperationResponse {
        command: command.into(),
        biz_name: biz.biz_name.clone(),
        biz_version: biz.biz_version.clone(),
        response,
    }
}

struct Agent {
    topics: Topics,
    client: AsyncClient,
    bases: HashMap<String, Arc<BaseEntry>>,
    stats: Arc<AgentStats>,
}

impl Agent {
    async fn publish<T: Serialize>(&self, topic: String, data: &T) {
        let body = match serde_json::to_vec(&Envelope::new(now_ms(), data)) {
            Ok(b) => b,
            Err(e) => return tracing::error!(error = %e, "encoding message"),
        };
        self.stats.sent.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.client.publish(topic, QoS::AtLeastOnce, false, body).await {
            tracing::warn!(error = %e, "publishing");
        }
    }

    async fn on_message(self: &Arc<Self>, topic: &str, payload: &[u8], retained: bool) {
        let Some((id, cmd)) = self.topics.parse(topic) else { return };
        let Some(base) = self.bases.get(id).cloned() else { return };
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        if retained {
            tracing::debug!(%topic, "ignoring a retained command replay");
            return;
        }
        match cmd {
            CMD_HEALTH => self.publish(self.topics.base(id, "health"), &base.host.health()).await,
            CMD_QUERY_ALL_BIZ => self.publish(self.topics.base(id, "simpleBiz"), &base.host.list()).await,
            CMD_INSTALL_BIZ | CMD_UNINSTALL_BIZ => {
                let biz: BizModel = match serde_json::from_slice(payload) {
                    Ok(b) => b,
                    Err(e) => return tracing::warn!(%topic, error = %e, "dropping malformed command"),
                };
                tracing::info!(base = %id, command = %cmd, module = %biz.key(), "command received");
                let me = self.clone();
                let cmd = cmd.to_string();
                let id = id.to_string();
                tokio::spawn(async move {
                    let result = if cmd == CMD_INSTALL_BIZ {
                        base.host.install(&biz).await
                    } else {
                        base.host.uninstall(&biz).await
                    };
                    let reply = operation_reply(&cmd, &biz, &id, &result);
                    me.publish(me.topics.base(&id, "bizOperation"), &reply).await;
                });
            }
            "base/baseline" => {
                let list: Vec<BizModel> = match serde_json::from_slice::<Vec<BizModel>>(payload) {
                    Ok(l) => l,
                    Err(_) => match serde_json::from_slice::<Envelope<Vec<BizModel>>>(payload) {
                        Ok(e) => e.data,
                        Err(e) => return tracing::warn!(%topic, error = %e, "dropping malformed baseline"),
                    },
                };
                tracing::info!(base = %id, modules = list.len(), "installing baseline");
                let me = self.clone();
                let id = id.to_string();
                tokio::spawn(async move {
                    let mut results = Vec::new();
                    for biz in &list {
                        let r = base.host.install(biz).await;
                        results.push(operation_reply(CMD_INSTALL_BIZ, biz, &id, &r));
                    }
                    me.publish(me.topics.base(&id, "batchInstallBizResponse"), &results).await;
                });
            }
            _ => {}
        }
    }

    async fn subscribe(&self) {
        let filters: Vec<SubscribeFilter> = if self.bases.len() == 1 {
            self.bases
                .keys()
                .flat_map(|id| {
                    [
                        SubscribeFilter::new(self.topics.base_commands(id), QoS::AtLeastOnce),
                        SubscribeFilter::new(self.topics.base(id, "baseline"), QoS::AtLeastOnce),
                    ]
                })
                .collect()
        } else {
            vec![
                SubscribeFilter::new(self.topics.all_commands(), QoS::AtLeastOnce),
                SubscribeFilter::new(self.topics.all_baselines(), QoS::AtLeastOnce),
            ]
        };
        if let Err(e) = self.client.subscribe_many(filters).await {
            tracing::error!(error = %e, "subscribing");
        }
    }

    async fn heartbeats(self: Arc<Self>, interval: Duration) {
        let ids: Vec<String> = self.bases.keys().cloned().collect();
        let n = ids.len().max(1) as u32;
        let step = interval / n;
        loop {
            let start = tokio::time::Instant::now();
            for (i, id) in ids.iter().enumerate() {
                if let Some(b) = self.bases.get(id) {
                    self.publish(self.topics.base(id, "heart"), &b.identity.heartbeat()).await;
                }
                if n > 1 {
                    tokio::time::sleep_until(start + step * (i as u32 + 1)).await;
                }
            }
            tokio::time::sleep_until(start + interval).await;
        }
    }
}

/// Run the MQTT side of `bases` until the process ends.
pub async fn run_mqtt(
    config: MqttConfig,
    client_id: &str,
    env: &str,
    bases: Vec<BaseEntry>,
    heartbeat_interval: Duration,
    stats: Arc<AgentStats>,
) -> anyhow::Result<()> {
    let (client, mut eventloop) = AsyncClient::new(config.options(client_id), 100_000);
    let agent = Arc::new(Agent {
        topics: Topics::new(env),
        client,
        bases: bases.into_iter().map(|b| (b.identity.id.clone(), Arc::new(b))).collect(),
        stats,
    });
    let mut first = true;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                tracing::info!(bases = agent.bases.len(), "connected to the MQTT broker");
                let a = agent.clone();
                let first_connect = first;
                first = false;
                tokio::spawn(async move {
                    a.subscribe().await;
                    if first_connect {
                        for (id, b) in &a.bases {
                            a.publish(a.topics.base(id, "queryBaseline"), &b.identity.metadata()).await;
                        }
                        a.clone().heartbeats(heartbeat_interval).await;
                    }
                });
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let a = agent.clone();
                a.on_message(&p.topic, &p.payload, p.retain).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "MQTT connection error; reconnecting");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_replies_carry_the_reason() {
        let biz = BizModel { biz_name: "b".into(), biz_version: "1".into(), biz_url: "x".into() };
        let ok = operation_reply(CMD_INSTALL_BIZ, &biz, "id", &Ok(()));
        assert_eq!(ok.response.code, "SUCCESS");
        let bad = operation_reply(
            CMD_INSTALL_BIZ,
            &biz,
            "id",
            &Err(Failure { reason: "DownloadFailed".into(), message: "404".into() }),
        );
        let mapped = crate::mapping::op_response(&bad);
        assert_eq!(mapped.result, crate::tunnel::OperationResult::Failure);
        assert_eq!(mapped.reason, "DownloadFailed");
        assert_eq!(mapped.message, "404");
    }
}
