//! Server-side apply: field ownership (`metadata.managedFields`) and the apply merge, after
//! `sigs.k8s.io/structured-merge-diff` as the apiserver uses it. Pure functions.
//!
//! An applied configuration owns the fields it sets (its *field set*, stored as `FieldsV1`:
//! `{"f:spec": {"f:replicas": {}}}`, list items of keyed lists as `k:{"name":"web"}`, set
//! members as `v:"x"`). Applying:
//! - conflicts when it sets a field to a value different from the live one and another
//!   manager owns that field (409 unless `force`, which takes the field over);
//! - merges the configuration into the live object (maps recursively, lists keyed by their
//!   patch merge key element-wise, sets as sets, other lists atomically);
//! - removes fields this manager applied before and no longer sets, unless another manager
//!   still owns them.
//!
//! Which lists are keyed comes from the same schema as strategic merge patch ([`Schema`]).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::strategicpatch::Schema;

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Elem {
    /// `f:<name>` — a map field.
    Field(String),
    /// `k:{"<key>":<value>}` — an element of a keyed list (the JSON of the key fields).
    Key(String),
    /// `v:<json>` — a member of a set.
    Value(String),
}

pub type Path = Vec<Elem>;

/// A set of leaf paths.
pub type FieldSet = BTreeSet<Path>;

/// Fields of an object that are never managed.
fn is_unmanaged_top(k: &str) -> bool {
    matches!(k, "apiVersion" | "kind" | "status")
}

fn is_unmanaged_meta(k: &str) -> bool {
    matches!(
        k,
        "name"
            | "namespace"
            | "uid"
            | "resourceVersion"
            | "generation"
            | "creationTimestamp"
            | "deletionTimestamp"
            | "deletionGracePeriodSeconds"
            | "managedFields"
            | "selfLink"
    )
}

/// The configuration as applied: without the fields apply does not manage.
pub fn strip_unmanaged(config: &Value) -> Value {
    let mut c = config.clone();
    if let Some(m) = c.as_object_mut() {
        m.retain(|k, _| !is_unmanaged_top(k));
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| !is_unmanaged_meta(k));
        }
        if m.get("metadata").and_then(Value::as_object).is_some_and(|x| x.is_empty()) {
            m.remove("metadata");
        }
    }
    c
}

/// How a list field merges.
enum ListKind<'a> {
    Keyed(&'a str),
    Set,
    Atomic,
}

fn list_kind<'a>(meta: &'a crate::strategicpatch::PatchMeta, items: &[Value]) -> ListKind<'a> {
    let merge = meta.strategies.iter().any(|s| s == "merge");
    match (&meta.merge_key, merge) {
        (Some(k), true) if items.iter().all(Value::is_object) => ListKind::Keyed(k),
        (None, true) if items.iter().all(|v| !v.is_object() && !v.is_array()) => ListKind::Set,
        _ => ListKind::Atomic,
    }
}

fn key_of(item: &Value, key: &str) -> String {
    let mut m = Map::new();
    m.insert(key.to_string(), item.get(key).cloned().unwrap_or(Value::Null));
    serde_json::to_string(&Value::Object(m)).unwrap_or_default()
}

/// The leaf paths a configuration sets. A keyed list element is itself a leaf too (its
/// presence is owned), as are empty maps.
pub fn field_set(config: &Value, schema: Schema<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    walk(config, schema, &mut Vec::new(), false, &mut |p, _| {
        out.insert(p.clone());
    });
    out
}

/// Every path of an object with its value: its leaves, its list elements and the maps (not
/// the structs) above them — what a write of the whole object touches, as Kubernetes'
/// comparison of two objects sees it.
fn all_values<'a>(obj: &'a Value, schema: Schema<'_>) -> std::collections::BTreeMap<Path, &'a Value> {
    let mut out = std::collections::BTreeMap::new();
    walk(obj, schema, &mut Vec::new(), true, &mut |p, v| {
        out.insert(p.clone(), v);
    });
    out
}

/// Visit the paths of `v` (`containers`: maps that are members too) with their values.
fn walk<'a>(
    v: &'a Value,
    schema: Schema<'_>,
    path: &mut Path,
    containers: bool,
    out: &mut dyn FnMut(&Path, &'a Value),
) {
    let Some(m) = v.as_object() else {
        out(path, v);
        return;
    };
    if m.is_empty() && !path.is_empty() {
        out(path, v);
        return;
    }
    for (k, x) in m {
        walk_field(k, x, schema, path, containers, out);
    }
}

/// [`walk`] for one field `k` (value `x`) of an object whose schema is `parent`.
fn walk_field<'a>(
    k: &str,
    x: &'a Value,
    parent: Schema<'_>,
    path: &mut Path,
    containers: bool,
    out: &mut dyn FnMut(&Path, &'a Value),
) {
    let (sub, meta) = parent.field(k);
    path.push(Elem::Field(k.to_string()));
    match x {
        Value::Object(_) => {
            if containers && !sub.is_struct() {
                out(path, x);
            }
            walk(x, sub, path, containers, out)
        }
        Value::Array(items) => match list_kind(&meta, items) {
            ListKind::Keyed(key) => {
                if items.is_empty() {
                    out(path, x);
                }
                for item in items {
                    path.push(Elem::Key(key_of(item, key)));
                    out(path, item);
                    walk(item, sub.items(), path, containers, out);
                    path.pop();
                }
            }
            ListKind::Set => {
                if items.is_empty() {
                    out(path, x);
                }
                for item in items {
                    path.push(Elem::Value(serde_json::to_string(item).unwrap_or_default()));
                    out(path, item);
                    path.pop();
                }
            }
            ListKind::Atomic => out(path, x),
        },
        _ => out(path, x),
    }
    path.pop();
}

/// What an update from `old` to `new` did to their paths: (removed, changed) — the paths
/// only `old` has, and those `new` added or gave another value (a map whose members
/// changed is not itself changed). The answer comparing every path of both would give,
/// but fields equal in both are skipped without listing their paths, so a write that
/// changes one condition of a large object costs about what that condition costs.
fn diff(old: &Value, new: &Value, schema: Schema<'_>) -> (FieldSet, FieldSet) {
    let mut d = (FieldSet::new(), FieldSet::new());
    match (old.as_object(), new.as_object()) {
        (Some(a), Some(b)) => diff_maps(a, b, schema, &mut Vec::new(), &mut d),
        _ => {
            let (before, after) = (all_values(old, schema), all_values(new, schema));
            compare(&before, &after, &mut d);
        }
    }
    d
}

fn diff_maps(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    schema: Schema<'_>,
    path: &mut Path,
    d: &mut (FieldSet, FieldSet),
) {
    for (k, x) in a {
        match b.get(k) {
            None => walk_field(k, x, schema, path, true, &mut |p, _| {
                d.0.insert(p.clone());
            }),
            Some(y) if x == y => {}
            Some(y) => diff_field(k, x, y, schema, path, d),
        }
    }
    for (k, y) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
        walk_field(k, y, schema, path, true, &mut |p, _| {
            d.1.insert(p.clone());
        });
    }
}

/// Field `k` differs (`x` before, `y` after).
fn diff_field(k: &str, x: &Value, y: &Value, parent: Schema<'_>, path: &mut Path, d: &mut (FieldSet, FieldSet)) {
    if let (Some(a), Some(b)) = (x.as_object(), y.as_object()) {
        if !a.is_empty() && !b.is_empty() {
            // Both non-empty maps: the map's own path (if it has one) is in both and
            // unchanged; only its members can differ.
            let (sub, _) = parent.field(k);
            path.push(Elem::Field(k.to_string()));
            diff_maps(a, b, sub, path, d);
            path.pop();
            return;
        }
    }
    // Lists, scalars, and maps becoming or ceasing to be empty: compare the field's paths.
    let (mut before, mut after) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    walk_field(k, x, parent, path, true, &mut |p, v| {
        before.insert(p.clone(), v);
    });
    walk_field(k, y, parent, path, true, &mut |p, v| {
        after.insert(p.clone(), v);
    });
    compare(&before, &after, d);
}

fn compare(
    before: &std::collections::BTreeMap<Path, &Value>,
    after: &std::collections::BTreeMap<Path, &Value>,
    d: &mut (FieldSet, FieldSet),
) {
    d.0.extend(before.keys().filter(|p| !after.contains_key(*p)).cloned());
    d.1.extend(
        after
            .iter()
            .filter(|(p, b)| match before.get(*p) {
                None => true,
                Some(a) => a != *b && !(a.is_object() && b.is_object()),
            })
            .map(|(p, _)| p.clone()),
    );
}

fn elem_key(e: &Elem) -> String {
    match e {
        Elem::Field(f) => format!("f:{f}"),
        Elem::Key(k) => format!("k:{k}"),
        Elem::Value(v) => format!("v:{v}"),
    }
}

/// Encode a field set as `FieldsV1`; a member that also has members below it gets `".": {}`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    fn node_at<'a>(node: &'a mut Map<String, Value>, path: &[Elem]) -> Option<&'a mut Map<String, Value>> {
        let Some((first, rest)) = path.split_first() else { return Some(node) };
        let child = node.entry(elem_key(first)).or_insert_with(|| json!({}));
        node_at(child.as_object_mut()?, rest)
    }
    let mut root = Map::new();
    for path in set {
        node_at(&mut root, path);
    }
    for path in set {
        if let Some(n) = node_at(&mut root, path) {
            if !n.is_empty() && !n.contains_key(".") {
                n.insert(".".into(), json!({}));
            }
        }
    }
    Value::Object(root)
}

/// What a create owns, as `FieldsV1`: every path of the object's managed part (as
/// [`update`]'s comparison with `{}` lists them), built in one walk of the object without
/// copying it or collecting paths first (every create pays for this).
pub fn created_fields_v1(obj: &Value, schema: Schema<'_>) -> Value {
    let mut root = Map::new();
    let Some(top) = obj.as_object() else { return Value::Object(root) };
    for (k, x) in top {
        if is_unmanaged_top(k) {
            continue;
        }
        if let (true, Some(meta)) = (k == "metadata", x.as_object()) {
            // Managed metadata only; metadata holding nothing else is not there at all.
            let (sub, _) = schema.field(k);
            let mut node = Map::new();
            for (mk, mx) in meta.iter().filter(|(mk, _)| !is_unmanaged_meta(mk)) {
                add_created_field(&mut node, mk, mx, sub);
            }
            if !node.is_empty() {
                if !sub.is_struct() {
                    node.insert(".".into(), json!({}));
                }
                root.insert(format!("f:{k}"), Value::Object(node));
            }
            continue;
        }
        add_created_field(&mut root, k, x, schema);
    }
    Value::Object(root)
}

/// Add field `k` (value `x`) of an object whose schema is `parent` to `node`.
fn add_created_field(node: &mut Map<String, Value>, k: &str, x: &Value, parent: Schema<'_>) {
    let (sub, meta) = parent.field(k);
    let child = match x {
        Value::Object(o) if !o.is_empty() => {
            let mut child = created_children(o, sub);
            // A map (not a struct) is itself a member.
            if !sub.is_struct() {
                child.insert(".".into(), json!({}));
            }
            child
        }
        Value::Array(items) if !items.is_empty() => match list_kind(&meta, items) {
            ListKind::Keyed(key) => {
                let mut child = Map::new();
                for item in items {
                    // Keyed lists hold objects only (list_kind checks); each element is a member.
                    let mut element = item.as_object().map(|o| created_children(o, sub.items())).unwrap_or_default();
                    if !element.is_empty() {
                        element.insert(".".into(), json!({}));
                    }
                    merge_nodes(&mut child, format!("k:{}", key_of(item, key)), element);
                }
                child
            }
            ListKind::Set => items
                .iter()
                .map(|item| (format!("v:{}", serde_json::to_string(item).unwrap_or_default()), json!({})))
                .collect(),
            ListKind::Atomic => Map::new(),
        },
        _ => Map::new(),
    };
    merge_nodes(node, format!("f:{k}"), child);
}

fn created_children(o: &Map<String, Value>, schema: Schema<'_>) -> Map<String, Value> {
    let mut node = Map::new();
    for (k, x) in o {
        add_created_field(&mut node, k, x, schema);
    }
    node
}

/// Put `child` at `key` in `node`, merging with what is there (two elements of a keyed list
/// with the same key own the union of their fields).
fn merge_nodes(node: &mut Map<String, Value>, key: String, child: Map<String, Value>) {
    match node.get_mut(&key).and_then(Value::as_object_mut) {
        Some(existing) => {
            for (k, v) in child {
                let v = match v {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                merge_nodes(existing, k, v);
            }
        }
        None => {
            node.insert(key, Value::Object(child));
        }
    }
}

/// Decode `FieldsV1` into a field set.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(m: &Map<String, Value>, path: &mut Path, out: &mut FieldSet) {
        if (m.is_empty() || m.contains_key(".")) && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, x) in m {
            let e = if let Some(f) = k.strip_prefix("f:") {
                Elem::Field(f.to_string())
            } else if let Some(f) = k.strip_prefix("k:") {
                Elem::Key(f.to_string())
            } else if let Some(f) = k.strip_prefix("v:") {
                Elem::Value(f.to_string())
            } else {
                continue;
            };
            path.push(e);
            go(x.as_object().unwrap_or(&Map::new()), path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(m) = v.as_object() {
        go(m, &mut Vec::new(), &mut out);
    }
    out
}

/// `.spec.template.spec.containers[name="web"].image`
pub fn path_string(path: &Path) -> String {
    let mut s = String::new();
    for e in path {
        match e {
            Elem::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Elem::Key(k) => {
                let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            Elem::Value(v) => s.push_str(&format!("[={v}]")),
        }
    }
    s
}

/// The value at a path, if present.
fn get<'a>(v: &'a Value, path: &[Elem]) -> Option<&'a Value> {
    let mut cur = v;
    for e in path {
        cur = match e {
            Elem::Field(f) => cur.get(f)?,
            Elem::Key(k) => {
                let m: Map<String, Value> = serde_json::from_str(k).ok()?;
                cur.as_array()?.iter().find(|item| m.iter().all(|(k, v)| item.get(k) == Some(v)))?
            }
            Elem::Value(v) => {
                let want: Value = serde_json::from_str(v).ok()?;
                cur.as_array()?.iter().find(|x| **x == want)?
            }
        };
    }
    Some(cur)
}

/// Remove the value at a path (no-op when absent).
fn remove(v: &mut Value, path: &[Elem]) {
    let Some((last, parent)) = path.split_last() else { return };
    let mut cur = v;
    for e in parent {
        let next = match e {
            Elem::Field(f) => cur.get_mut(f),
            Elem::Key(k) => {
                let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                cur.as_array_mut().and_then(|a| a.iter_mut().find(|item| m.iter().all(|(k, v)| item.get(k) == Some(v))))
            }
            Elem::Value(_) => None,
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match last {
        Elem::Field(f) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(f);
            }
        }
        Elem::Key(k) => {
            let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            if let Some(a) = cur.as_array_mut() {
                a.retain(|item| !m.iter().all(|(k, v)| item.get(k) == Some(v)));
            }
        }
        Elem::Value(v) => {
            let want: Value = serde_json::from_str(v).unwrap_or(Value::Null);
            if let Some(a) = cur.as_array_mut() {
                a.retain(|x| *x != want);
            }
        }
    }
}

/// Merge an applied configuration into the live object.
pub fn merge(live: &Value, config: &Value, schema: Schema<'_>) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) => {
            let mut out = l.clone();
            for (k, cv) in c {
                let (sub, meta) = schema.field(k);
                let merged = match (l.get(k), cv) {
                    (Some(lv @ Value::Object(_)), Value::Object(_)) => merge(lv, cv, sub),
                    (Some(Value::Array(la)), Value::Array(ca)) => match list_kind(&meta, ca) {
                        ListKind::Keyed(key) => {
                            let mut items = la.clone();
                            for ci in ca {
                                match items.iter().position(|li| li.get(key) == ci.get(key)) {
                                    Some(i) => items[i] = merge(&items[i], ci, sub.items()),
                                    None => items.push(ci.clone()),
                                }
                            }
                            Value::Array(items)
                        }
                        ListKind::Set => {
                            let mut items = la.clone();
                            for ci in ca {
                                if !items.contains(ci) {
                                    items.push(ci.clone());
                                }
                            }
                            Value::Array(items)
                        }
                        ListKind::Atomic => cv.clone(),
                    },
                    _ => cv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, c) => c.clone(),
    }
}

/// One conflict: the path and the manager that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    pub path: String,
}

impl Conflict {
    pub fn message(&self) -> String {
        format!("conflict with {}: {}", self.manager, self.path)
    }
}

/// The `Apply failed with …` message for a set of conflicts.
pub fn conflicts_message(conflicts: &[Conflict]) -> String {
    if conflicts.len() == 1 {
        return format!("Apply failed with 1 conflict: {}", conflicts[0].message());
    }
    let mut by_manager: Vec<(String, Vec<String>)> = Vec::new();
    for c in conflicts {
        match by_manager.iter_mut().find(|(m, _)| *m == c.manager) {
            Some((_, ps)) => ps.push(c.path.clone()),
            None => by_manager.push((c.manager.clone(), vec![c.path.clone()])),
        }
    }
    let mut s = format!("Apply failed with {} conflicts: ", conflicts.len());
    let parts: Vec<String> = by_manager
        .iter()
        .map(|(m, ps)| {
            if ps.len() == 1 {
                format!("conflict with {m}: {}", ps[0])
            } else {
                format!("conflicts with {m}:\n{}", ps.iter().map(|p| format!("- {p}")).collect::<Vec<_>>().join("\n"))
            }
        })
        .collect();
    s.push_str(&parts.join("\n"));
    s
}

/// What an apply request asks for.
pub struct ApplyRequest<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub force: bool,
    /// RFC 3339 time for the managedFields entry.
    pub now: &'a str,
}

/// Apply `config` to `live` (`{}` when creating) whose `metadata.managedFields` are `managed`.
/// Returns the new object (with managedFields set) or the conflicts.
pub fn apply(live: &Value, config: &Value, schema: Schema<'_>, req: &ApplyRequest<'_>) -> Result<Value, Vec<Conflict>> {
    let managed: Vec<Value> =
        live.pointer("/metadata/managedFields").and_then(Value::as_array).cloned().unwrap_or_default();
    let cfg = strip_unmanaged(config);
    let new_set = field_set(&cfg, schema);
    let is_mine = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(req.manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply")
    };
    let previous: FieldSet =
        managed.iter().find(|e| is_mine(e)).map(|e| from_fields_v1(&e["fieldsV1"])).unwrap_or_default();
    let mut others: Vec<(Value, FieldSet)> = managed
        .iter()
        .filter(|e| !is_mine(e))
        .map(|e| (e.clone(), from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null))))
        .collect();
    // Conflicts: a changed value owned by someone else.
    let mut conflicts = Vec::new();
    let mut taken: BTreeSet<Path> = BTreeSet::new();
    for p in &new_set {
        let (Some(lv), Some(cv)) = (get(live, p), get(&cfg, p)) else { continue };
        if lv == cv || (lv.is_object() && cv.is_object()) {
            continue;
        }
        for (entry, set) in &others {
            if set.contains(p) {
                let name = entry.get("manager").and_then(Value::as_str).unwrap_or_default();
                let who = if entry.get("operation").and_then(Value::as_str) == Some("Update") {
                    format!("\"{name}\" using {}", entry.get("apiVersion").and_then(Value::as_str).unwrap_or_default())
                } else {
                    format!("\"{name}\"")
                };
                conflicts.push(Conflict { manager: who, path: path_string(p) });
                taken.insert(p.clone());
            }
        }
    }
    if !conflicts.is_empty() && !req.force {
        return Err(conflicts);
    }
    // Forced: the other managers lose the fields taken over.
    for (_, set) in others.iter_mut() {
        set.retain(|p| !taken.contains(p));
    }
    let mut out = merge(live, &cfg, schema);
    // Fields this manager no longer applies, owned by nobody else, go away (outermost first:
    // a list element goes as a whole, before its key field could be removed from under it).
    let mut gone: Vec<&Path> = previous.difference(&new_set).collect();
    gone.sort_by_key(|p| p.len());
    for p in gone {
        let still_owned =
            others.iter().any(|(_, s)| s.iter().any(|q| q.starts_with(p))) || new_set.iter().any(|q| q.starts_with(p));
        if !still_owned {
            remove(&mut out, p);
            // Containers left empty by the removal, and not applied, go too.
            for i in (1..p.len()).rev() {
                let anc = &p[..i];
                let empty = match get(&out, anc) {
                    Some(Value::Array(a)) => a.is_empty(),
                    Some(Value::Object(m)) => m.is_empty(),
                    _ => false,
                };
                if !empty || get(&cfg, anc).is_some() {
                    break;
                }
                remove(&mut out, anc);
            }
        }
    }
    // managedFields: others (minus what was taken), then this manager's Apply entry.
    let mut entries: Vec<Value> = Vec::new();
    // The entry's time moves only when what the manager owns changes.
    let time = match managed.iter().find(|e| is_mine(e)) {
        Some(e) if previous == new_set => e.get("time").cloned().unwrap_or_else(|| json!(req.now)),
        _ => json!(req.now),
    };
    let mut mine = Some(json!({
        "manager": req.manager,
        "operation": "Apply",
        "apiVersion": req.api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(&new_set),
    }));
    for e in &managed {
        if is_mine(e) {
            if let Some(m) = mine.take() {
                entries.push(m);
            }
            continue;
        }
        let Some((entry, set)) = others.iter().find(|(x, _)| x == e) else { continue };
        if set.is_empty() {
            continue;
        }
        let mut entry = entry.clone();
        entry["fieldsV1"] = to_fields_v1(set);
        entries.push(entry);
    }
    if let Some(m) = mine {
        entries.push(m);
    }
    if let Some(meta) = out.as_object_mut().map(|o| o.entry("metadata").or_insert_with(|| json!({}))) {
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("managedFields".into(), Value::Array(entries));
        }
    }
    Ok(out)
}

/// What a write other than an apply (a create, update or patch) is recorded as: an
/// `Update` operation of `manager` (the request's `fieldManager`, else its User-Agent's
/// first part), through the main resource or a subresource.
pub struct UpdateRequest<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    /// `status` for a status update; None for the main resource.
    pub subresource: Option<&'a str>,
    /// RFC 3339 time for the managedFields entry.
    pub now: &'a str,
}

/// The part of an object a write through `subresource` is tracked on.
fn tracked(obj: &Value, subresource: Option<&str>) -> Value {
    match subresource {
        None => strip_unmanaged(obj),
        Some(sub) => obj.get(sub).map(|v| json!({ sub: v })).unwrap_or_else(|| json!({})),
    }
}

/// The managedFields after `old` (`{}` for a create) became `new` through an Update,
/// starting from the entries `managed`, as Kubernetes' field manager records an update:
/// the fields the write added or changed become the writer's (and stop being anyone
/// else's: an update never conflicts), fields it removed are nobody's, the writer's entry
/// gets the time; managers left owning nothing are dropped. A write that changes nothing
/// leaves the entries as they were.
pub fn update(old: &Value, new: &Value, managed: &[Value], schema: Schema<'_>, req: &UpdateRequest<'_>) -> Vec<Value> {
    let entry = |fields_v1: Value| {
        // Built by hand: `json!` would copy the field set through serialization.
        let s = |v: &str| Value::String(v.to_string());
        let mut e = Map::new();
        e.insert("manager".into(), s(req.manager));
        e.insert("operation".into(), s("Update"));
        e.insert("apiVersion".into(), s(req.api_version));
        e.insert("time".into(), s(req.now));
        e.insert("fieldsType".into(), s("FieldsV1"));
        e.insert("fieldsV1".into(), fields_v1);
        if let Some(sub) = req.subresource {
            e.insert("subresource".into(), s(sub));
        }
        Value::Object(e)
    };
    let old_t = tracked(old, req.subresource);
    let created = old_t.as_object().is_none_or(|m| m.is_empty());
    if created && managed.is_empty() && req.subresource.is_none() {
        // A plain create: everything is the creator's, and there is nobody else to update.
        let fields = created_fields_v1(new, schema);
        return if fields.as_object().is_some_and(|m| !m.is_empty()) { vec![entry(fields)] } else { Vec::new() };
    }
    // From `{}` (a create) everything is added.
    let (removed, changed) = diff(&old_t, &tracked(new, req.subresource), schema);
    if changed.is_empty() && removed.is_empty() {
        return managed.to_vec();
    }
    let is_mine = |e: &Value| {
        let s = |k: &str| e.get(k).and_then(Value::as_str);
        s("manager") == Some(req.manager)
            && s("operation") == Some("Update")
            && s("apiVersion") == Some(req.api_version)
            && s("subresource") == req.subresource
    };
    let mine_set = |previous: FieldSet| -> FieldSet {
        previous.difference(&removed).cloned().chain(changed.iter().cloned()).collect()
    };
    let mut out = Vec::new();
    let mut placed = false;
    for e in managed {
        let set = from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null));
        if is_mine(e) {
            if !placed {
                out.push(entry(to_fields_v1(&mine_set(set))));
                placed = true;
            }
            continue;
        }
        let left: FieldSet = set.iter().filter(|p| !changed.contains(*p) && !removed.contains(*p)).cloned().collect();
        if left.is_empty() {
            continue;
        }
        let mut e = e.clone();
        if left.len() != set.len() {
            e["fieldsV1"] = to_fields_v1(&left);
        }
        out.push(e);
    }
    if !placed {
        let set = mine_set(FieldSet::new());
        if !set.is_empty() {
            out.push(entry(to_fields_v1(&set)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs() -> Map<String, Value> {
        json!({
            "D": {"properties": {"spec": {"$ref": "#/definitions/S"},
                "metadata": {"properties": {"name": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                "status": {"properties": {"ready": {"type": "integer"}}}}},
            "S": {"properties": {
                "containers": {"type": "array", "items": {"$ref": "#/definitions/C"},
                               "x-kubernetes-patch-merge-key": "name", "x-kubernetes-patch-strategy": "merge"},
                "args": {"type": "array", "items": {"type": "string"}}
            }},
            "C": {"properties": {"name": {"type": "string"}, "image": {"type": "string"}}}
        })
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    fn req<'a>(manager: &'a str, force: bool) -> ApplyRequest<'a> {
        ApplyRequest { manager, api_version: "apps/v1", force, now: "2024-01-01T00:00:00Z" }
    }

    fn upd<'a>(manager: &'a str, subresource: Option<&'a str>, now: &'a str) -> UpdateRequest<'a> {
        UpdateRequest { manager, api_version: "apps/v1", subresource, now }
    }

    #[test]
    fn updates_record_their_writer_as_kubernetes_does() {
        let d = defs();
        let root = d["D"].clone();
        let schema = Schema::new(&d, &root);
        // A create: everything it wrote, maps included (`.`), is the creator's.
        let created = json!({"metadata": {"name": "x", "labels": {"a": "1"}},
                             "spec": {"replicas": 1, "containers": [{"name": "web", "image": "v1"}]}});
        let mf = update(&json!({}), &created, &[], schema, &upd("kubectl-create", None, "t1"));
        assert_eq!(
            mf,
            vec![json!({"manager": "kubectl-create", "operation": "Update", "apiVersion": "apps/v1", "time": "t1",
                "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
                    "f:spec": {"f:replicas": {}, "f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:name": {}, "f:image": {}}}}}})]
        );
        // kubectl edit changes the image and a label: those become its own, the creator keeps the rest.
        let edited = json!({"metadata": {"name": "x", "labels": {"a": "2"}},
                            "spec": {"replicas": 1, "containers": [{"name": "web", "image": "v2"}]}});
        let mf2 = update(&created, &edited, &mf, schema, &upd("kubectl-edit", None, "t2"));
        assert_eq!(mf2.len(), 2);
        let sets: Vec<FieldSet> = mf2.iter().map(|e| from_fields_v1(&e["fieldsV1"])).collect();
        let image = vec![
            Elem::Field("spec".into()),
            Elem::Field("containers".into()),
            Elem::Key("{\"name\":\"web\"}".into()),
            Elem::Field("image".into()),
        ];
        assert!(!sets[0].contains(&image) && sets[1].contains(&image));
        assert_eq!(mf2[0]["time"], "t1", "the creator's entry keeps its time");
        assert_eq!((mf2[1]["manager"].as_str(), mf2[1]["time"].as_str()), (Some("kubectl-edit"), Some("t2")));
        // A write that changes nothing changes no entry.
        assert_eq!(update(&edited, &edited, &mf2, schema, &upd("kubectl-edit", None, "t3")), mf2);
        // A status write is tracked on status alone, as a subresource.
        let with_status = json!({"spec": {"replicas": 1}, "status": {"ready": 1}});
        let mf3 =
            update(&json!({"spec": {"replicas": 1}}), &with_status, &[], schema, &upd("ctrl", Some("status"), "t4"));
        assert_eq!(mf3[0]["subresource"], "status");
        assert_eq!(mf3[0]["fieldsV1"], json!({"f:status": {"f:ready": {}}}));
        // Removing the only field a manager owned drops its entry.
        let bare =
            json!({"metadata": {"name": "x"}, "spec": {"replicas": 1, "containers": [{"name": "web", "image": "v2"}]}});
        let mf4 = update(&edited, &bare, &mf2, schema, &upd("kubectl-label", None, "t5"));
        assert!(mf4.iter().all(|e| e["manager"] != "kubectl-label"), "a pure removal gives the remover nothing");
        assert!(mf4.iter().all(|e| !from_fields_v1(&e["fieldsV1"])
            .iter()
            .any(|p| p.len() > 1 && p[1] == Elem::Field("labels".into()))));
    }

    /// Every path of an object (what a create owns).
    fn all_paths(obj: &Value, schema: Schema<'_>) -> FieldSet {
        all_values(obj, schema).into_keys().collect()
    }

    /// The comparison of every path of both objects, which [`diff`] must agree with.
    fn diff_all(old: &Value, new: &Value, schema: Schema<'_>) -> (FieldSet, FieldSet) {
        let mut d = (FieldSet::new(), FieldSet::new());
        compare(&all_values(old, schema), &all_values(new, schema), &mut d);
        d
    }

    #[test]
    fn an_update_s_diff_skipping_equal_fields_equals_the_full_comparison() {
        let d = defs();
        let root = d["D"].clone();
        let s = Schema::new(&d, &root);
        let objects = [
            json!({}),
            json!({"metadata": {"labels": {"a": "1"}}}),
            json!({"metadata": {"labels": {}}, "spec": {}}),
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 1,
                   "containers": [{"name": "web", "image": "v1"}], "args": ["a"]}}),
            json!({"metadata": {"labels": {"a": "2"}}, "spec": {"replicas": 2,
                   "containers": [{"name": "web", "image": "v2"}, {"name": "side"}], "args": ["a", "b"]}}),
            json!({"metadata": {"labels": {"a": "2"}}, "spec": {"replicas": {"odd": true},
                   "containers": [{"name": "web"}, {"name": "web", "image": "x"}], "args": []}}),
            json!({"spec": {"containers": [], "free": {"m": {"k": 1}, "e": {}}}}),
            json!({"spec": {"containers": "not a list", "free": {"m": {}, "e": {"x": [1]}}}}),
            json!({"status": {"ready": 1}, "spec": {"free": {"m": {"k": 2}}}}),
        ];
        for a in &objects {
            for b in &objects {
                assert_eq!(diff(a, b, s), diff_all(a, b, s), "{a} -> {b}");
                assert_eq!(diff(a, b, Schema::none()), diff_all(a, b, Schema::none()), "{a} -> {b}, no schema");
            }
        }
    }

    #[test]
    fn a_create_s_fields_built_in_one_walk_equal_the_path_set_s() {
        let d = defs();
        let root = d["D"].clone();
        let s = Schema::new(&d, &root);
        for obj in [
            json!({}),
            json!({"apiVersion": "v1", "kind": "D", "metadata": {"name": "x", "uid": "u"}, "status": {"ready": 1}}),
            json!({"metadata": {"name": "x", "labels": {"a": "1", "b": "2"}, "annotations": {}},
                   "spec": {"replicas": 1, "containers": [{"name": "web", "image": "v1", "env": [{"name": "A"}]},
                                                          {"name": "side"}, {"name": "web", "ports": [80]}, {}],
                            "args": ["a", "b"], "empty": {}, "list": [], "nested": {"m": {"k": {}}}}}),
            json!({"spec": {"containers": [], "args": [], "free": {"a": [{"b": 1}], "c": null}}}),
        ] {
            let want = to_fields_v1(&all_paths(&strip_unmanaged(&obj), s));
            assert_eq!(created_fields_v1(&obj, s), want, "{obj}");
            assert_eq!(
                created_fields_v1(&obj, Schema::none()),
                to_fields_v1(&all_paths(&strip_unmanaged(&obj), Schema::none()))
            );
        }
    }

    #[test]
    fn field_sets_round_trip_through_fields_v1() {
        let d = defs();
        let root = d["D"].clone();
        let cfg = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 2,
            "containers": [{"name": "web", "image": "x"}], "args": ["a"]}});
        let set = field_set(&cfg, Schema::new(&d, &root));
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:replicas": {}, "f:args": {},
                   "f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:name": {}, "f:image": {}}}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_creates_updates_and_removes_dropped_fields() {
        let d = defs();
        let root = d["D"].clone();
        let s = Schema::new(&d, &root);
        let cfg1 = json!({"apiVersion": "apps/v1", "kind": "D", "metadata": {"name": "x", "labels": {"a": "1", "b": "2"}},
                          "spec": {"replicas": 1, "containers": [{"name": "web", "image": "v1"}]}});
        let o1 = apply(&json!({}), &cfg1, s, &req("m1", false)).unwrap();
        assert_eq!(o1["spec"]["replicas"], 1);
        assert_eq!(o1["metadata"]["managedFields"][0]["manager"], "m1");
        assert_eq!(o1["metadata"]["managedFields"][0]["operation"], "Apply");
        // Drop label b and change the image.
        let cfg2 = json!({"metadata": {"name": "x", "labels": {"a": "1"}},
                          "spec": {"replicas": 1, "containers": [{"name": "web", "image": "v2"}]}});
        let o2 = apply(&o1, &cfg2, s, &req("m1", false)).unwrap();
        assert_eq!(o2["metadata"]["labels"], json!({"a": "1"}));
        // Dropping the whole labels map removes it (no empty map left behind).
        let cfg3 = json!({"spec": {"replicas": 1, "containers": [{"name": "web", "image": "v2"}]}});
        let o3 = apply(&o2, &cfg3, s, &req("m1", false)).unwrap();
        assert!(o3["metadata"].get("labels").is_none(), "{o3}");
        // Dropping a keyed list element removes the element.
        let with_two =
            json!({"spec": {"containers": [{"name": "web", "image": "v2"}, {"name": "side", "image": "s"}]}});
        let o4 = apply(&o3, &with_two, s, &req("m1", false)).unwrap();
        let o5 = apply(&o4, &cfg3, s, &req("m1", false)).unwrap();
        assert_eq!(o5["spec"]["containers"], json!([{"name": "web", "image": "v2"}]));
        assert_eq!(o2["spec"]["containers"], json!([{"name": "web", "image": "v2"}]));
    }

    #[test]
    fn a_second_manager_conflicts_unless_forced() {
        let d = defs();
        let root = d["D"].clone();
        let s = Schema::new(&d, &root);
        let o1 = apply(&json!({}), &json!({"spec": {"replicas": 1}}), s, &req("m1", false)).unwrap();
        // Same value: shared ownership, no conflict.
        let o2 = apply(&o1, &json!({"spec": {"replicas": 1}}), s, &req("m2", false)).unwrap();
        assert_eq!(o2["metadata"]["managedFields"].as_array().map(Vec::len), Some(2));
        // Different value: conflict.
        let err = apply(&o2, &json!({"spec": {"replicas": 3}}), s, &req("m2", false)).unwrap_err();
        assert_eq!(conflicts_message(&err), "Apply failed with 1 conflict: conflict with \"m1\": .spec.replicas");
        // Forced: m2 takes it; m1 loses the field (and its now-empty entry).
        let o3 = apply(&o2, &json!({"spec": {"replicas": 3}}), s, &req("m2", true)).unwrap();
        assert_eq!(o3["spec"]["replicas"], 3);
        let managers: Vec<&str> = o3["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["manager"].as_str())
            .collect();
        assert_eq!(managers, vec!["m2"]);
    }

    #[test]
    fn fields_shared_with_another_manager_survive_removal() {
        let d = defs();
        let root = d["D"].clone();
        let s = Schema::new(&d, &root);
        let o1 = apply(&json!({}), &json!({"spec": {"replicas": 1, "args": ["a"]}}), s, &req("m1", false)).unwrap();
        let o2 = apply(&o1, &json!({"spec": {"replicas": 1}}), s, &req("m2", false)).unwrap();
        let o3 = apply(&o2, &json!({"spec": {"args": ["a"]}}), s, &req("m1", false)).unwrap();
        assert_eq!(o3["spec"]["replicas"], 1, "m2 still owns replicas");
        let o4 = apply(&o3, &json!({}), s, &req("m2", false)).unwrap();
        assert!(o4["spec"].get("replicas").is_none(), "nobody owns replicas any more: {o4}");
    }

    #[test]
    fn path_strings() {
        let p = vec![Elem::Field("spec".into()), Elem::Key("{\"name\":\"web\"}".into()), Elem::Field("image".into())];
        assert_eq!(path_string(&p), ".spec[name=\"web\"].image");
    }
}
