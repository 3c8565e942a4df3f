//! The protobuf form of `/openapi/v2` (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! gnostic's `openapi.v2.Document`, which client-go's discovery client asks for (kubectl
//! 1.27/1.28 fail without it). Encodes the JSON Swagger document; pure.
//!
//! Field numbers are gnostic's `OpenAPIv2.proto`. Vendor extensions and defaults travel as
//! `Any { yaml }` (JSON is valid YAML).

use serde_json::{Map, Value};

/// What clients ask for.
pub const ACCEPT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
/// What Kubernetes answers with (Go's mime parser rejects the `@` of the requested type).
pub const MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// A protobuf message under construction.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn key(&mut self, tag: u32, wire: u64) {
        self.varint(((tag as u64) << 3) | wire);
    }
    fn bytes(&mut self, tag: u32, b: &[u8]) {
        self.key(tag, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn string(&mut self, tag: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(tag, s.as_bytes());
        }
    }
    fn str_of(&mut self, tag: u32, v: &Value, field: &str) {
        if let Some(s) = v.get(field).and_then(Value::as_str) {
            self.string(tag, s);
        }
    }
    fn strings_of(&mut self, tag: u32, v: &Value, field: &str) {
        for s in v.get(field).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            self.bytes(tag, s.as_bytes());
        }
    }
    fn boolean(&mut self, tag: u32, b: bool) {
        if b {
            self.key(tag, 0);
            self.varint(1);
        }
    }
    fn msg(&mut self, tag: u32, m: Msg) {
        self.bytes(tag, &m.0);
    }
}

/// `Any { yaml }`
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(2, &serde_json::to_string(v).unwrap_or_default());
    m
}

/// `NamedAny`s for the `x-` keys of an object.
fn vendor_extensions(out: &mut Msg, tag: u32, v: &Value) {
    for (k, x) in v.as_object().into_iter().flatten().filter(|(k, _)| k.starts_with("x-")) {
        let mut n = Msg::default();
        n.string(1, k);
        n.msg(2, any(x));
        out.msg(tag, n);
    }
}

fn schema(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.str_of(1, v, "$ref");
    m.str_of(2, v, "format");
    m.str_of(3, v, "title");
    m.str_of(4, v, "description");
    if let Some(d) = v.get("default") {
        m.msg(5, any(d));
    }
    m.strings_of(19, v, "required");
    for e in v.get("enum").and_then(Value::as_array).into_iter().flatten() {
        m.msg(20, any(e));
    }
    match v.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut a = Msg::default();
            a.key(2, 0);
            a.varint(*b as u64);
            m.msg(21, a);
        }
        Some(s @ Value::Object(_)) => {
            let mut a = Msg::default();
            a.msg(1, schema(s));
            m.msg(21, a);
        }
        _ => {}
    }
    match v.get("type") {
        Some(Value::String(t)) => {
            let mut t2 = Msg::default();
            t2.string(1, t);
            m.msg(22, t2);
        }
        Some(Value::Array(ts)) => {
            let mut t2 = Msg::default();
            for t in ts.iter().filter_map(Value::as_str) {
                t2.bytes(1, t.as_bytes());
            }
            m.msg(22, t2);
        }
        _ => {}
    }
    if let Some(items) = v.get("items") {
        let mut i = Msg::default();
        match items {
            Value::Array(a) => a.iter().for_each(|s| i.msg(1, schema(s))),
            s => i.msg(1, schema(s)),
        }
        m.msg(23, i);
    }
    for s in v.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        m.msg(24, schema(s));
    }
    if let Some(props) = v.get("properties").and_then(Value::as_object) {
        m.msg(25, named_schemas(props));
    }
    vendor_extensions(&mut m, 31, v);
    m
}

/// `Properties` / `Definitions`: repeated `NamedSchema` at tag 1.
fn named_schemas(map: &Map<String, Value>) -> Msg {
    let mut out = Msg::default();
    for (k, s) in map {
        let mut n = Msg::default();
        n.string(1, k);
        n.msg(2, schema(s));
        out.msg(1, n);
    }
    out
}

fn parameter(p: &Value) -> Msg {
    let mut param = Msg::default();
    let location = p.get("in").and_then(Value::as_str).unwrap_or_default();
    if location == "body" {
        let mut b = Msg::default();
        b.str_of(1, p, "description");
        b.str_of(2, p, "name");
        b.string(3, "body");
        b.boolean(4, p.get("required").and_then(Value::as_bool).unwrap_or(false));
        if let Some(s) = p.get("schema") {
            b.msg(5, schema(s));
        }
        param.msg(1, b);
    } else {
        // Query (3) and path (4) sub-schemas differ in field numbers after `name`.
        let (which, type_tag, unique_tag) = if location == "path" { (4, 5, 19) } else { (3, 6, 20) };
        let mut s = Msg::default();
        s.boolean(1, p.get("required").and_then(Value::as_bool).unwrap_or(false));
        s.string(2, location);
        s.str_of(3, p, "description");
        s.str_of(4, p, "name");
        s.str_of(type_tag, p, "type");
        s.boolean(unique_tag, p.get("uniqueItems").and_then(Value::as_bool).unwrap_or(false));
        let mut nb = Msg::default();
        nb.msg(which, s);
        param.msg(2, nb);
    }
    let mut item = Msg::default();
    item.msg(1, param);
    item
}

fn operation(op: &Value) -> Msg {
    let mut m = Msg::default();
    m.strings_of(1, op, "tags");
    m.str_of(3, op, "description");
    m.str_of(5, op, "operationId");
    m.strings_of(6, op, "produces");
    m.strings_of(7, op, "consumes");
    for p in op.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        m.msg(8, parameter(p));
    }
    let mut rs = Msg::default();
    for (code, r) in op.get("responses").and_then(Value::as_object).into_iter().flatten() {
        let mut resp = Msg::default();
        resp.str_of(1, r, "description");
        if let Some(s) = r.get("schema") {
            let mut si = Msg::default();
            si.msg(1, schema(s));
            resp.msg(2, si);
        }
        let mut rv = Msg::default();
        rv.msg(1, resp);
        let mut named = Msg::default();
        named.string(1, code);
        named.msg(2, rv);
        rs.msg(1, named);
    }
    m.msg(9, rs);
    m.strings_of(10, op, "schemes");
    vendor_extensions(&mut m, 13, op);
    m
}

/// Encode a Swagger 2.0 JSON document as gnostic's `openapi.v2.Document`.
pub fn encode(doc: &Value) -> Vec<u8> {
    let mut d = Msg::default();
    d.str_of(1, doc, "swagger");
    if let Some(info) = doc.get("info") {
        let mut i = Msg::default();
        i.str_of(1, info, "title");
        i.str_of(2, info, "version");
        d.msg(2, i);
    }
    let mut paths = Msg::default();
    for (p, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
        let mut pi = Msg::default();
        for (verb, tag) in [("get", 2), ("put", 3), ("post", 4), ("delete", 5), ("patch", 8)] {
            if let Some(op) = item.get(verb) {
                pi.msg(tag, operation(op));
            }
        }
        for prm in item.get("parameters").and_then(Value::as_array).into_iter().flatten() {
            pi.msg(9, parameter(prm));
        }
        let mut named = Msg::default();
        named.string(1, p);
        named.msg(2, pi);
        paths.msg(2, named);
    }
    d.msg(8, paths);
    if let Some(defs) = doc.get("definitions").and_then(Value::as_object) {
        d.msg(9, named_schemas(defs));
    }
    d.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn encodes_a_small_document() {
        let doc = json!({"swagger": "2.0", "info": {"title": "K", "version": "v1"}, "paths": {},
                         "definitions": {"A": {"type": "object", "x-k": [1]}}});
        let b = encode(&doc);
        // swagger = "2.0"
        assert_eq!(&b[..5], &[0x0a, 3, b'2', b'.', b'0']);
        let text = String::from_utf8_lossy(&b);
        assert!(text.contains("x-k") && text.contains("[1]") && text.contains("object"));
    }
}
