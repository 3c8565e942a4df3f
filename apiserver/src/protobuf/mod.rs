//! `application/vnd.kubernetes.protobuf` request bodies, decoded into the JSON object the
//! registry stores. Pure functions.
//!
//! The envelope is the magic `k8s\0` followed by a `runtime.Unknown` message
//! (`typeMeta` = 1 {apiVersion = 1, kind = 2}, `raw` = 2, `contentEncoding` = 3,
//! `contentType` = 4); `raw` is the kind's own message. Messages are decoded by the wire
//! layout in [`descriptors`] with JSON names taken from the OpenAPI definitions, and the
//! types whose JSON form is not their message are special-cased as Kubernetes marshals them:
//! `Time`/`MicroTime` (RFC 3339), `Duration`, `Quantity`, `IntOrString`, `RawExtension`,
//! `FieldsV1`, `JSON`, `ExtraValue`. `bytes` fields become base64 strings.
//!
//! Go's protobuf marshalling writes non-pointer fields even when empty, where its JSON
//! marshalling omits them (`omitempty`); empty strings, zero numbers, `false` and zero
//! times are therefore left out, as the JSON a Go client would have sent — except for the
//! pointer fields in [`KEEP_ZERO`], where an explicit zero means something.

pub mod descriptors;

use std::collections::HashMap;
use std::sync::LazyLock;

use base64::Engine;
use serde_json::{json, Map, Value};

use descriptors::{normalized, Label, DESCRIPTORS, SCALARS};

pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8] = b"k8s\0";

/// JSON property names of each message's fields, by tag.
/// Only the definitions' property names are read, not whole schemas.
static JSON_NAMES: LazyLock<HashMap<String, HashMap<u32, String>>> = LazyLock::new(|| {
    #[derive(serde::Deserialize)]
    struct Properties<'a> {
        #[serde(borrow, default)]
        properties: HashMap<std::borrow::Cow<'a, str>, serde::de::IgnoredAny>,
    }
    let defs = &*crate::openapi::DEFINITIONS;
    let by_lower: HashMap<String, &'static str> = defs.names().map(|k| (k.to_ascii_lowercase(), k)).collect();
    let mut out = HashMap::new();
    for (name, msg) in &DESCRIPTORS.messages {
        let def_name = format!("io.k8s.{name}")
            .replace("apiextensions_apiserver", "apiextensions-apiserver")
            .replace("kube_aggregator", "kube-aggregator")
            .to_ascii_lowercase();
        let props: HashMap<String, String> = by_lower
            .get(&def_name)
            .and_then(|d| defs.raw(d))
            .and_then(|raw| serde_json::from_str::<Properties<'_>>(raw).ok())
            .map(|p| p.properties.keys().map(|k| (normalized(k), k.to_string())).collect())
            .unwrap_or_default();
        let names = msg
            .fields
            .iter()
            .map(|f| {
                (f.tag, props.get(&normalized(&f.rust_name)).cloned().unwrap_or_else(|| lower_camel(&f.rust_name)))
            })
            .collect();
        out.insert(name.clone(), names);
    }
    out
});

fn lower_camel(snake: &str) -> String {
    crate::openapi::camel_case(snake.trim_start_matches("r#"), false)
}

/// Whether a Content-Type (without parameters, lower-cased) is Kubernetes protobuf.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type == MEDIA_TYPE
}

/// Decode an enveloped object into its JSON form, with `apiVersion` and `kind` set.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body.strip_prefix(MAGIC).ok_or("the protobuf body does not start with the k8s magic prefix")?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    let mut content_type = String::new();
    for item in Fields::new(rest) {
        let (tag, wire) = item?;
        match (tag, wire) {
            (1, Wire::Len(tm)) => {
                for f in Fields::new(tm) {
                    match f? {
                        (1, Wire::Len(b)) => api_version = utf8(b)?,
                        (2, Wire::Len(b)) => kind = utf8(b)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Len(b)) => raw = b,
            (4, Wire::Len(b)) => content_type = utf8(b)?,
            _ => {}
        }
    }
    if !content_type.is_empty() && content_type != MEDIA_TYPE {
        return Err(format!("unsupported content type in the protobuf envelope: {content_type}"));
    }
    if kind.is_empty() {
        return Err("the protobuf envelope does not name a kind".into());
    }
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version.as_str()),
    };
    let def = crate::openapi::DEFINITIONS
        .name_of(group, version, &kind)
        .ok_or_else(|| format!("no kind \"{kind}\" is registered for version \"{api_version}\""))?;
    let (msg, _) =
        DESCRIPTORS.message_for_definition(def).ok_or_else(|| format!("no protobuf message is known for {kind}"))?;
    let mut obj = decode_message(raw, msg)?;
    if let Value::Object(m) = &mut obj {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[derive(Debug)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Len(&'a [u8]),
}

/// Iterates the (tag, value) pairs of a message.
struct Fields<'a> {
    buf: &'a [u8],
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Fields { buf, failed: false }
    }
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or("truncated varint")?;
        *buf = rest;
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err("varint too long".into())
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>), String>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() || self.failed {
            return None;
        }
        let r = (|| {
            let key = varint(&mut self.buf)?;
            let tag = (key >> 3) as u32;
            let w = match key & 7 {
                0 => Wire::Varint(varint(&mut self.buf)?),
                1 => {
                    let (b, rest) = self.buf.split_at_checked(8).ok_or("truncated fixed64")?;
                    self.buf = rest;
                    Wire::Fixed64(u64::from_le_bytes(b.try_into().map_err(|_| "bad fixed64")?))
                }
                2 => {
                    let n = varint(&mut self.buf)? as usize;
                    let (b, rest) = self.buf.split_at_checked(n).ok_or("truncated length-delimited field")?;
                    self.buf = rest;
                    Wire::Len(b)
                }
                5 => {
                    let (b, rest) = self.buf.split_at_checked(4).ok_or("truncated fixed32")?;
                    self.buf = rest;
                    Wire::Fixed32(u32::from_le_bytes(b.try_into().map_err(|_| "bad fixed32")?))
                }
                t => return Err(format!("unsupported protobuf wire type {t}")),
            };
            Ok((tag, w))
        })();
        if r.is_err() {
            self.failed = true;
        }
        Some(r)
    }
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8 in a protobuf string".to_string())
}

fn scalar(ty: &str, w: &Wire<'_>) -> Result<Value, String> {
    Ok(match (ty, w) {
        ("string", Wire::Len(b)) => json!(utf8(b)?),
        ("bytes", Wire::Len(b)) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        ("bool", Wire::Varint(v)) => json!(*v != 0),
        ("int32", Wire::Varint(v)) => json!(*v as i64 as i32),
        ("int64", Wire::Varint(v)) => json!(*v as i64),
        ("uint32" | "uint64", Wire::Varint(v)) => json!(*v),
        ("sint32" | "sint64", Wire::Varint(v)) => json!(((*v >> 1) as i64) ^ -((*v & 1) as i64)),
        ("double", Wire::Fixed64(v)) => json!(f64::from_bits(*v)),
        ("float", Wire::Fixed32(v)) => json!(f32::from_bits(*v) as f64),
        (t, w) => return Err(format!("unexpected protobuf encoding {w:?} for a {t} field")),
    })
}

/// Optional (pointer) fields whose zero value is meaningful and kept.
pub const KEEP_ZERO: &[&str] = &[
    "gracePeriodSeconds",
    "replicas",
    "minReplicas",
    "automountServiceAccountToken",
    "enableServiceLinks",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "backoffLimit",
    "parallelism",
    "completions",
    "suspend",
    "revisionHistoryLimit",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
    "ttlSecondsAfterFinished",
    "startingDeadlineSeconds",
    "progressDeadlineSeconds",
    "runAsUser",
    "runAsGroup",
    "fsGroup",
    "runAsNonRoot",
    "privileged",
    "readOnlyRootFilesystem",
    "allowPrivilegeEscalation",
    "optional",
    "defaultMode",
    "expirationSeconds",
    "immutable",
];

/// Whether Go's JSON would leave the value out (`omitempty` on a non-pointer field).
fn is_empty_scalar(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Null => true,
        _ => false,
    }
}

fn time_string(seconds: i64, nanos: i64, micro: bool) -> Result<Value, String> {
    if seconds == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let ts = jiff::Timestamp::new(seconds, if micro { (nanos / 1000 * 1000) as i32 } else { 0 })
        .map_err(|e| format!("invalid time: {e}"))?;
    Ok(json!(if micro {
        ts.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
    } else {
        ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }))
}

/// Go's `time.Duration.String()` for whole nanoseconds.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let neg = nanos < 0;
    let n = nanos.unsigned_abs();
    let secs = n / 1_000_000_000;
    let frac = n % 1_000_000_000;
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if frac == 0 {
        out.push_str(&format!("{s}s"));
    } else {
        let f = format!("{frac:09}");
        out.push_str(&format!("{s}.{}s", f.trim_end_matches('0')));
    }
    out
}

fn raw_json(b: &[u8]) -> Result<Value, String> {
    if b.is_empty() {
        return Ok(Value::Null);
    }
    if b.starts_with(MAGIC) {
        return decode(b);
    }
    serde_json::from_slice(b).map_err(|e| format!("invalid embedded JSON: {e}"))
}

/// Decode one message by name.
pub fn decode_message(buf: &[u8], msg_name: &str) -> Result<Value, String> {
    // Types whose JSON is not their message.
    let short = msg_name.rsplit('.').next().unwrap_or(msg_name);
    match msg_name {
        "apimachinery.pkg.apis.meta.v1.Time" | "apimachinery.pkg.apis.meta.v1.MicroTime" => {
            let (mut s, mut n) = (0i64, 0i64);
            for f in Fields::new(buf) {
                match f? {
                    (1, Wire::Varint(v)) => s = v as i64,
                    (2, Wire::Varint(v)) => n = v as i64 as i32 as i64,
                    _ => {}
                }
            }
            return time_string(s, n, short == "MicroTime");
        }
        "apimachinery.pkg.apis.meta.v1.Duration" => {
            let mut d = 0i64;
            for f in Fields::new(buf) {
                if let (1, Wire::Varint(v)) = f? {
                    d = v as i64;
                }
            }
            return Ok(json!(go_duration(d)));
        }
        "apimachinery.pkg.api.resource.Quantity" => {
            for f in Fields::new(buf) {
                if let (1, Wire::Len(b)) = f? {
                    return Ok(json!(utf8(b)?));
                }
            }
            return Ok(json!("0"));
        }
        "apimachinery.pkg.util.intstr.IntOrString" => {
            let (mut ty, mut i, mut s) = (0u64, 0i64, String::new());
            for f in Fields::new(buf) {
                match f? {
                    (1, Wire::Varint(v)) => ty = v,
                    (2, Wire::Varint(v)) => i = v as i64 as i32 as i64,
                    (3, Wire::Len(b)) => s = utf8(b)?,
                    _ => {}
                }
            }
            return Ok(if ty == 1 { json!(s) } else { json!(i) });
        }
        "apimachinery.pkg.runtime.RawExtension"
        | "apimachinery.pkg.apis.meta.v1.FieldsV1"
        | "apiextensions_apiserver.pkg.apis.apiextensions.v1.JSON" => {
            for f in Fields::new(buf) {
                if let (1, Wire::Len(b)) = f? {
                    return raw_json(b);
                }
            }
            return Ok(Value::Null);
        }
        _ if short == "ExtraValue" => {
            let mut items = Vec::new();
            for f in Fields::new(buf) {
                if let (1, Wire::Len(b)) = f? {
                    items.push(json!(utf8(b)?));
                }
            }
            return Ok(Value::Array(items));
        }
        _ => {}
    }
    let msg = DESCRIPTORS.messages.get(msg_name).ok_or_else(|| format!("unknown protobuf message {msg_name}"))?;
    let names = JSON_NAMES.get(msg_name);
    let mut out = Map::new();
    for item in Fields::new(buf) {
        let (tag, w) = item?;
        let Some(field) = msg.fields.iter().find(|f| f.tag == tag) else { continue };
        let name = names.and_then(|n| n.get(&tag)).cloned().unwrap_or_else(|| lower_camel(&field.rust_name));
        let is_scalar = SCALARS.contains(&field.ty.as_str());
        let value_of = |w: &Wire<'_>| -> Result<Value, String> {
            if is_scalar {
                scalar(&field.ty, w)
            } else {
                match w {
                    Wire::Len(b) => decode_message(b, &field.ty),
                    other => Err(format!("unexpected protobuf encoding {other:?} for message field {name}")),
                }
            }
        };
        match field.label {
            Label::Optional => {
                let v = value_of(&w)?;
                let keep_zero = KEEP_ZERO.contains(&name.as_str()) && !v.is_string();
                let drop = is_scalar && is_empty_scalar(&v) && !keep_zero;
                if drop || v.is_null() {
                    out.remove(&name);
                    continue;
                }
                out.insert(name, v);
            }
            Label::Repeated => {
                let list = out.entry(name.clone()).or_insert_with(|| json!([]));
                let Some(list) = list.as_array_mut() else { continue };
                match (&w, is_scalar && field.ty != "string" && field.ty != "bytes") {
                    // Packed numeric values.
                    (Wire::Len(b), true) => {
                        let mut rest: &[u8] = b;
                        while !rest.is_empty() {
                            let v = varint(&mut rest)?;
                            list.push(scalar(&field.ty, &Wire::Varint(v))?);
                        }
                    }
                    _ => list.push(value_of(&w)?),
                }
            }
            Label::Map => {
                let Wire::Len(entry) = w else { return Err(format!("bad map entry for {name}")) };
                let (mut key, mut val) = (String::new(), None);
                for f in Fields::new(entry) {
                    match f? {
                        (1, Wire::Len(b)) => key = utf8(b)?,
                        (2, v) => val = Some(value_of(&v)?),
                        _ => {}
                    }
                }
                let val = val.unwrap_or_else(|| match field.ty.as_str() {
                    "string" | "bytes" => json!(""),
                    t if SCALARS.contains(&t) => json!(0),
                    _ => json!({}),
                });
                let m = out.entry(name).or_insert_with(|| json!({}));
                if let Some(m) = m.as_object_mut() {
                    m.insert(key, val);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tag: u32, wire: u8) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, ((tag as u64) << 3) | wire as u64);
        out
    }
    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn len(tag: u32, b: &[u8]) -> Vec<u8> {
        let mut out = key(tag, 2);
        put_varint(&mut out, b.len() as u64);
        out.extend_from_slice(b);
        out
    }
    fn int(tag: u32, v: u64) -> Vec<u8> {
        let mut out = key(tag, 0);
        put_varint(&mut out, v);
        out
    }
    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = len(1, api_version.as_bytes());
        tm.extend(len(2, kind.as_bytes()));
        let mut out = MAGIC.to_vec();
        out.extend(len(1, &tm));
        out.extend(len(2, raw));
        out.extend(len(3, b""));
        out.extend(len(4, b""));
        out
    }

    #[test]
    fn decodes_a_configmap() {
        // ObjectMeta{name=1, namespace=3, labels=11, creationTimestamp=8 (zero)}
        let mut meta = len(1, b"cm");
        meta.extend(len(2, b""));
        meta.extend(len(3, b"default"));
        meta.extend(len(8, b""));
        let mut label = len(1, b"app");
        label.extend(len(2, b"x"));
        meta.extend(len(11, &label));
        let mut raw = len(1, &meta);
        let mut entry = len(1, b"k");
        entry.extend(len(2, b"v"));
        raw.extend(len(2, &entry));
        let mut bin = len(1, b"b");
        bin.extend(len(2, b"\x01\x02"));
        raw.extend(len(3, &bin));
        let v = decode(&envelope("v1", "ConfigMap", &raw)).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm", "namespace": "default", "labels": {"app": "x"}},
                   "data": {"k": "v"}, "binaryData": {"b": "AQI="}})
        );
    }

    #[test]
    fn decodes_special_types() {
        // Deployment.spec.replicas=1, template.spec.containers[0] {name, ports[{containerPort 80}]},
        // strategy.rollingUpdate.maxSurge = IntOrString "25%"
        let mut port = int(3, 80);
        port.extend(len(4, b"TCP"));
        let mut c = len(1, b"app");
        c.extend(len(2, b"nginx"));
        c.extend(len(6, &port));
        let mut tspec = len(2, &c);
        tspec.extend(int(11, 0)); // hostNetwork: false is dropped
        let tmpl = len(2, &tspec);
        let mut surge = int(1, 1);
        surge.extend(len(3, b"25%"));
        let ru = len(2, &surge);
        let strategy = len(2, &ru);
        let mut spec = int(1, 1);
        spec.extend(len(3, &tmpl));
        spec.extend(len(4, &strategy));
        let mut ts = int(1, 1_700_000_000);
        ts.extend(int(2, 0));
        let mut meta = len(1, b"d");
        meta.extend(len(8, &ts));
        let mut raw = len(1, &meta);
        raw.extend(len(2, &spec));
        let v = decode(&envelope("apps/v1", "Deployment", &raw)).unwrap();
        assert_eq!(v["metadata"]["creationTimestamp"], "2023-11-14T22:13:20Z");
        assert_eq!(v["spec"]["replicas"], 1);
        assert_eq!(v["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert!(v["spec"]["template"]["spec"].get("hostNetwork").is_none());
        let c0 = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c0["name"], "app");
        assert_eq!(c0["ports"], json!([{"containerPort": 80, "protocol": "TCP"}]));
    }

    #[test]
    fn rejects_garbage() {
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
        assert!(decode(&envelope("v1", "NoSuchKind", b"")).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(30_000_000_000), "30s");
        assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
    }
}
