//! The Koupleless base ↔ module-controller wire protocol: MQTT topics and the JSON of
//! every message, exactly as upstream's arklet and module-controller speak them (summarized
//! in this crate's README). Pure types and parsing; no I/O.
//!
//! Every base→controller MQTT message is an [`Envelope`] `{"publishTimestamp": ms, "data": …}`;
//! [`open_envelope`] refuses malformed and stale (≥ 10 s old) ones so the tunnel can drop
//! them with a log line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The default environment (`--env`).
pub const DEFAULT_ENV: &str = "dev";
/// Messages this old or older are dropped (upstream's rule).
pub const STALE_AFTER_MS: i64 = 10_000;
/// arklet's default HTTP port.
pub const DEFAULT_ARKLET_PORT: u16 = 1238;

pub const BIZ_STATE_ACTIVATED: &str = "ACTIVATED";
pub const BIZ_STATE_RESOLVED: &str = "RESOLVED";
pub const BIZ_STATE_DEACTIVATED: &str = "DEACTIVATED";
pub const BIZ_STATE_BROKEN: &str = "BROKEN";
pub const BIZ_STATE_STOPPED: &str = "STOPPED";
pub const CODE_SUCCESS: &str = "SUCCESS";
pub const CODE_FAILED: &str = "FAILED";

/// Commands the controller publishes to `koupleless_{env}/{id}/{cmd}`.
pub const CMD_HEALTH: &str = "health";
pub const CMD_QUERY_ALL_BIZ: &str = "queryAllBiz";
pub const CMD_INSTALL_BIZ: &str = "installBiz";
pub const CMD_UNINSTALL_BIZ: &str = "uninstallBiz";

/// The MQTT topic names of one environment.
#[derive(Clone, Debug)]
pub struct Topics {
    pub env: String,
}

impl Topics {
    pub fn new(env: &str) -> Self {
        Topics { env: env.to_string() }
    }
    fn prefix(&self) -> String {
        format!("koupleless_{}", self.env)
    }
    /// Controller subscriptions made on connect (wildcards over every base).
    pub fn heart_all(&self) -> String {
        format!("{}/+/base/heart", self.prefix())
    }
    pub fn query_baseline_all(&self) -> String {
        format!("{}/+/base/queryBaseline", self.prefix())
    }
    /// A base→controller topic `koupleless_{env}/{id}/base/{kind}`.
    pub fn base(&self, id: &str, kind: &str) -> String {
        format!("{}/{id}/base/{kind}", self.prefix())
    }
    /// The per-base topics the controller subscribes to once it owns the base.
    pub fn per_base_subscriptions(&self, id: &str) -> Vec<String> {
        ["health", "simpleBiz", "biz", "bizOperation", "batchInstallBizResponse"]
            .iter()
            .map(|k| self.base(id, k))
            .collect()
    }
    /// A controller→base command topic `koupleless_{env}/{id}/{cmd}`.
    pub fn command(&self, id: &str, cmd: &str) -> String {
        format!("{}/{id}/{cmd}", self.prefix())
    }
    /// What a base subscribes to: its commands.
    pub fn base_commands(&self, id: &str) -> String {
        format!("{}/{id}/+", self.prefix())
    }
    /// All bases' commands (the simulator's one subscription).
    pub fn all_commands(&self) -> String {
        format!("{}/+/+", self.prefix())
    }
    pub fn all_baselines(&self) -> String {
        format!("{}/+/base/baseline", self.prefix())
    }

    /// Split a topic of this environment into (base id, rest), e.g.
    /// `koupleless_dev/b1/base/heart` → `("b1", "base/heart")`.
    pub fn parse<'a>(&self, topic: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = topic.strip_prefix("koupleless_")?.strip_prefix(self.env.as_str())?.strip_prefix('/')?;
        let (id, tail) = rest.split_once('/')?;
        if id.is_empty() || tail.is_empty() {
            return None;
        }
        Some((id, tail))
    }
}

/// `{"publishTimestamp": <ms>, "data": …}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Envelope<T> {
    pub publish_timestamp: i64,
    pub data: T,
}

impl<T> Envelope<T> {
    pub fn new(now_ms: i64, data: T) -> Self {
        Envelope { publish_timestamp: now_ms, data }
    }
}

/// Why an incoming message was dropped.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MessageError {
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("stale message: published {age_ms} ms ago (limit {STALE_AFTER_MS} ms)")]
    Stale { age_ms: i64 },
}

/// Parse an envelope and refuse it when `now_ms - publishTimestamp >= 10 s`.
pub fn open_envelope<T: for<'de> Deserialize<'de>>(payload: &[u8], now_ms: i64) -> Result<T, MessageError> {
    let env: Envelope<T> = serde_json::from_slice(payload).map_err(|e| MessageError::Malformed(e.to_string()))?;
    let age_ms = now_ms - env.publish_timestamp;
    if age_ms >= STALE_AFTER_MS {
        return Err(MessageError::Stale { age_ms });
    }
    Ok(env.data)
}

/// `baseMetadata` of a heartbeat, also the body of `queryBaseline`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct BaseMetadata {
    pub identity: String,
    pub version: String,
    pub cluster_name: String,
    pub name: String,
}

/// A base's heartbeat.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatData {
    pub base_metadata: BaseMetadata,
    #[serde(rename = "localIP", default)]
    pub local_ip: String,
    #[serde(default)]
    pub local_host_name: String,
    /// The arklet (HTTP) port.
    #[serde(default)]
    pub port: i32,
    /// `ACTIVATED` or `DEACTIVATED`.
    #[serde(default)]
    pub state: String,
}

/// The JVM figures of a health report (bytes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct JvmInfo {
    #[serde(rename = "java used metaspace")]
    pub used_metaspace: f64,
    #[serde(rename = "java committed metaspace")]
    pub committed_metaspace: f64,
    #[serde(rename = "java max metaspace")]
    pub max_metaspace: f64,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct CpuInfo {
    pub count: i64,
    #[serde(rename = "total used (%)")]
    pub total_used_percent: f64,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct MasterBizInfo {
    pub biz_name: String,
    pub biz_state: String,
    pub biz_version: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct HealthData {
    pub jvm: JvmInfo,
    pub cpu: CpuInfo,
    pub master_biz_info: MasterBizInfo,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct HealthDataWrapper {
    pub health_data: HealthData,
}

/// `base/health`: `{code:"SUCCESS", data:{healthData:{…}}}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct HealthResponse {
    pub code: String,
    pub data: HealthDataWrapper,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `latestStateRecord` of a module.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct StateRecord {
    pub change_time: i64,
    pub state: String,
    pub reason: String,
    pub message: String,
}

/// One module of `base/simpleBiz`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SimpleBizInfo {
    pub name: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_state_record: Option<StateRecord>,
}

/// `base/simpleBiz` data: the array as the protocol doc has it, or arklet's
/// `{code, data: [...]}` response wrapping it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum SimpleBizData {
    List(Vec<SimpleBizInfo>),
    Wrapped { data: Vec<SimpleBizInfo> },
}

impl SimpleBizData {
    pub fn into_vec(self) -> Vec<SimpleBizInfo> {
        match self {
            SimpleBizData::List(v) | SimpleBizData::Wrapped { data: v } => v,
        }
    }
}

/// `installBiz` / `uninstallBiz` command body and a baseline entry.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct BizModel {
    pub biz_name: String,
    #[serde(default)]
    pub biz_version: String,
    #[serde(default)]
    pub biz_url: String,
}

impl BizModel {
    /// A module's key: `name:version`.
    pub fn key(&self) -> String {
        biz_key(&self.biz_name, &self.biz_version)
    }
}

pub fn biz_key(name: &str, version: &str) -> String {
    format!("{name}:{version}")
}

/// `response.data` of a biz operation.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct OperationResultData {
    pub code: String,
    pub message: String,
}

/// arklet's reply to an operation (also the HTTP tunnel's reply body).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct ArkResponse {
    pub code: String,
    pub data: OperationResultData,
    pub message: String,
    pub error_stack_trace: String,
    pub base_identity: String,
}

/// `base/bizOperation`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BizOperationResponse {
    pub command: String,
    pub biz_name: String,
    #[serde(default)]
    pub biz_version: String,
    #[serde(default)]
    pub response: ArkResponse,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_round_trip() {
        let t = Topics::new("dev");
        assert_eq!(t.heart_all(), "koupleless_dev/+/base/heart");
        assert_eq!(t.command("b1", CMD_INSTALL_BIZ), "koupleless_dev/b1/installBiz");
        assert_eq!(t.parse("koupleless_dev/10.0.0.1/base/heart"), Some(("10.0.0.1", "base/heart")));
        assert_eq!(t.parse("koupleless_test/b1/base/heart"), None);
        assert_eq!(t.parse("koupleless_dev//base/heart"), None);
        assert_eq!(t.per_base_subscriptions("x").len(), 5);
    }

    #[test]
    fn heartbeat_json_is_upstreams() {
        let raw = br#"{"publishTimestamp": 1000, "data": {"baseMetadata": {"identity": "b1", "version": "1.0.0",
            "clusterName": "c1", "name": "base"}, "localIP": "10.0.0.5", "localHostName": "h1", "port": 1238,
            "state": "ACTIVATED"}}"#;
        let hb: HeartbeatData = open_envelope(raw, 2000).unwrap();
        assert_eq!(hb.base_metadata.cluster_name, "c1");
        assert_eq!(hb.local_ip, "10.0.0.5");
        assert_eq!(hb.port, 1238);
        let back = serde_json::to_value(&hb).unwrap();
        assert_eq!(back["localIP"], "10.0.0.5");
        assert_eq!(back["baseMetadata"]["clusterName"], "c1");
    }

    #[test]
    fn stale_and_malformed_are_refused() {
        let raw = br#"{"publishTimestamp": 1000, "data": {"baseMetadata": {}}}"#;
        assert_eq!(open_envelope::<HeartbeatData>(raw, 11_000), Err(MessageError::Stale { age_ms: 10_000 }));
        assert!(open_envelope::<HeartbeatData>(raw, 10_999).is_ok());
        assert!(matches!(open_envelope::<HeartbeatData>(b"{not json", 0), Err(MessageError::Malformed(_))));
        assert!(matches!(open_envelope::<HeartbeatData>(br#"{"data": {}}"#, 0), Err(MessageError::Malformed(_))));
    }

    #[test]
    fn health_figures_parse() {
        let raw = br#"{"publishTimestamp": 5, "data": {"code": "SUCCESS", "data": {"healthData": {
            "jvm": {"java used metaspace": 100, "java committed metaspace": 200, "java max metaspace": 1000,
                    "java heap max": 5},
            "cpu": {"count": 4, "total used (%)": 12.5},
            "masterBizInfo": {"bizName": "base", "bizState": "ACTIVATED", "bizVersion": "1.0.0"}}}}}"#;
        let h: HealthResponse = open_envelope(raw, 6).unwrap();
        assert_eq!(h.code, "SUCCESS");
        assert_eq!(h.data.health_data.jvm.max_metaspace, 1000.0);
        assert_eq!(h.data.health_data.jvm.committed_metaspace, 200.0);
        assert_eq!(h.data.health_data.cpu.count, 4);
        assert_eq!(h.data.health_data.master_biz_info.biz_name, "base");
    }

    #[test]
    fn simple_biz_accepts_both_shapes() {
        let a = br#"{"publishTimestamp": 5, "data": [{"name": "biz1", "version": "0.0.1", "state": "ACTIVATED",
            "latestStateRecord": {"changeTime": 3, "state": "ACTIVATED", "reason": "", "message": "ok"}}]}"#;
        let v = open_envelope::<SimpleBizData>(a, 6).unwrap().into_vec();
        assert_eq!(v[0].latest_state_record.as_ref().unwrap().change_time, 3);
        let b = br#"{"publishTimestamp": 5, "data": {"code": "SUCCESS", "data": [{"name": "biz1"}]}}"#;
        assert_eq!(open_envelope::<SimpleBizData>(b, 6).unwrap().into_vec()[0].name, "biz1");
    }

    #[test]
    fn biz_operation_parses() {
        let raw = br#"{"publishTimestamp": 5, "data": {"command": "installBiz", "bizName": "biz1",
            "bizVersion": "0.0.1", "response": {"code": "FAILED", "data": {"code": "FAILED", "message": "404"},
            "message": "download failed", "errorStackTrace": "", "baseIdentity": "b1"}}}"#;
        let op: BizOperationResponse = open_envelope(raw, 6).unwrap();
        assert_eq!(op.response.data.message, "404");
        assert_eq!(op.response.base_identity, "b1");
        let cmd = serde_json::to_value(BizModel {
            biz_name: "biz1".into(),
            biz_version: "0.0.1".into(),
            biz_url: "file:///x".into(),
        })
        .unwrap();
        assert_eq!(cmd, serde_json::json!({"bizName": "biz1", "bizVersion": "0.0.1", "bizUrl": "file:///x"}));
    }
}
