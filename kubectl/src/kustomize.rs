//! `-k DIR` and `kubectl kustomize DIR`: a kustomization built into objects, for the part of
//! kustomize people use day to day — `resources` (files and other kustomizations),
//! `configMapGenerator` / `secretGenerator` (literals, files, env files; the content-hash
//! name suffix, `generatorOptions`), `patches` (strategic merge or JSON 6902, by target) and
//! `patchesStrategicMerge` / `patchesJson6902`, `namespace`, `namePrefix` / `nameSuffix`
//! (with the references to renamed ConfigMaps, Secrets and ServiceAccounts in pod
//! templates), `commonLabels` (selectors too) and `labels`, `commonAnnotations`, `images`,
//! `replicas` — transformed in kustomize's order and printed in its legacy order.
//! Anything else in a kustomization is refused by name rather than ignored.
//!
//! The building is pure over a file reader ([`Files`]), so the rules are tested without a
//! file system; the official kubectl's embedded kustomize is the reference the end-to-end
//! test compares against.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::error::{KubectlError, Result};

/// Where a kustomization's files come from.
pub trait Files {
    fn read(&self, path: &Path) -> Result<String>;
    fn is_dir(&self, path: &Path) -> bool;
}

/// The real file system.
pub struct Disk;

impl Files for Disk {
    fn read(&self, path: &Path) -> Result<String> {
        std::fs::read_to_string(path).map_err(|e| KubectlError::msg(format!("{}: {e}", path.display())))
    }
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
}

const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The fields of a kustomization this implementation knows.
const KNOWN: &[&str] = &[
    "apiVersion",
    "kind",
    "resources",
    "bases",
    "namespace",
    "namePrefix",
    "nameSuffix",
    "commonLabels",
    "labels",
    "commonAnnotations",
    "images",
    "replicas",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
    "patchesStrategicMerge",
    "patchesJson6902",
];

/// Build the kustomization in `dir`: its objects in kustomize's output order.
pub fn build(files: &dyn Files, dir: &Path) -> Result<Vec<Value>> {
    let mut objs = build_unsorted(files, dir)?;
    // Generated names get their content hash last, once every transformer has run.
    let mut renames = Renames::new();
    for o in objs.iter_mut() {
        let hashed = o.pointer("/metadata/annotations/internal.minik8s.io~1needs-hash").is_some();
        for a in [NEEDS_HASH, ORIGINAL_NAME] {
            if let Some(m) = o.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
                m.remove(a);
            }
        }
        if o.pointer("/metadata/annotations").and_then(Value::as_object).is_some_and(|m| m.is_empty()) {
            o["metadata"].as_object_mut().map(|m| m.remove("annotations"));
        }
        if hashed {
            let old = meta(o, "name").to_string();
            let new = format!("{old}-{}", content_hash(o));
            o["metadata"]["name"] = json!(new.clone());
            renames.insert((kind(o).to_string(), old), new);
        }
    }
    fix_references(&mut objs, &renames);
    objs.sort_by_key(sort_key);
    Ok(objs)
}

/// Internal annotations while building: a generated object whose name gets the content
/// hash, and every object's name before any prefix or suffix (what generators with
/// `behavior: merge`, patches and `replicas` name it by).
const NEEDS_HASH: &str = "internal.minik8s.io/needs-hash";
const ORIGINAL_NAME: &str = "internal.minik8s.io/original-name";

fn original_name(o: &Value) -> &str {
    o.pointer("/metadata/annotations/internal.minik8s.io~1original-name")
        .and_then(Value::as_str)
        .unwrap_or(meta(o, "name"))
}

fn remember_name(o: &mut Value) {
    if o.pointer("/metadata/annotations/internal.minik8s.io~1original-name").is_none() {
        let name = json!(meta(o, "name"));
        if !o["metadata"]["annotations"].is_object() {
            o["metadata"]["annotations"] = json!({});
        }
        o["metadata"]["annotations"][ORIGINAL_NAME] = name;
    }
}

fn kustomization(files: &dyn Files, dir: &Path) -> Result<Value> {
    for name in KUSTOMIZATION_FILES {
        let p = join(dir, name);
        if let Ok(text) = files.read(&p) {
            let v: Value = serde_yaml::from_str(&text)
                .map_err(|e| KubectlError::msg(format!("invalid Kustomization {}: {e}", p.display())))?;
            return Ok(if v.is_null() { json!({}) } else { v });
        }
    }
    Err(KubectlError::msg(format!(
        "unable to find one of 'kustomization.yaml', 'kustomization.yml' or 'Kustomization' in directory '{}'",
        dir.display()
    )))
}

fn strings(k: &Value, field: &str) -> Vec<String> {
    k.get(field).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
}

fn parse_docs(text: &str, source: &Path) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for doc in crate::manifest::split_documents(text) {
        if doc.trim().is_empty() {
            continue;
        }
        let v: Value = serde_yaml::from_str(&doc)
            .map_err(|e| KubectlError::msg(format!("error reading {}: {e}", source.display())))?;
        match v {
            Value::Null => {}
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(m.get("items").and_then(Value::as_array).cloned().unwrap_or_default());
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

fn build_unsorted(files: &dyn Files, dir: &Path) -> Result<Vec<Value>> {
    let k = kustomization(files, dir)?;
    if let Some(m) = k.as_object() {
        if let Some(unknown) = m.keys().find(|f| !KNOWN.contains(&f.as_str())) {
            return Err(KubectlError::msg(format!("kustomization field {unknown:?} is not supported by this kubectl")));
        }
    }
    for (old, new) in [
        ("commonLabels", "labels"),
        ("bases", "resources"),
        ("patchesStrategicMerge", "patches"),
        ("patchesJson6902", "patches"),
    ] {
        if k.get(old).is_some() {
            eprintln!(
                "# Warning: '{old}' is deprecated. Please use '{new}' instead. Run 'kustomize edit fix' to update your Kustomization automatically."
            );
        }
    }
    let mut objs = Vec::new();
    for r in strings(&k, "resources").iter().chain(strings(&k, "bases").iter()) {
        let p = join(dir, r);
        if files.is_dir(&p) {
            objs.extend(build_unsorted(files, &p)?);
        } else {
            for mut o in parse_docs(&files.read(&p)?, &p)? {
                remember_name(&mut o);
                objs.push(o);
            }
        }
    }
    let options = k.get("generatorOptions").cloned().unwrap_or(json!({}));
    for (field, kind) in [("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")] {
        for g in k.get(field).and_then(Value::as_array).into_iter().flatten() {
            let mut generated = generate(files, dir, kind, g, &options)?;
            remember_name(&mut generated);
            merge_generated(&mut objs, generated, g)?;
        }
    }
    // Transformers, in kustomize's order.
    let mut patches: Vec<(Value, Option<Value>)> = Vec::new();
    for p in strings(&k, "patchesStrategicMerge") {
        let text = if p.contains('\n') { p.clone() } else { files.read(&join(dir, &p))? };
        for doc in parse_docs(&text, &join(dir, &p))? {
            patches.push((doc, None));
        }
    }
    // `patches` (either kind) and the older `patchesJson6902`: inline or from a file.
    let listed = ["patches", "patchesJson6902"].map(|f| k.get(f).and_then(Value::as_array).into_iter().flatten());
    for p in listed.into_iter().flatten() {
        let text = match (p.get("patch").and_then(Value::as_str), p.get("path").and_then(Value::as_str)) {
            (Some(inline), _) => inline.to_string(),
            (None, Some(path)) => files.read(&join(dir, path))?,
            _ => return Err(KubectlError::msg("a patch needs either `patch` or `path`")),
        };
        let parsed: Value =
            serde_yaml::from_str(&text).map_err(|e| KubectlError::msg(format!("invalid patch: {e}")))?;
        patches.push((parsed, p.get("target").cloned()));
    }
    for (patch, target) in &patches {
        apply_patch(&mut objs, patch, target.as_ref())?;
    }
    // Replica counts name objects by their names before any prefix.
    for r in k.get("replicas").and_then(Value::as_array).into_iter().flatten() {
        let (Some(name), Some(count)) = (r.get("name").and_then(Value::as_str), r.get("count")) else { continue };
        for o in objs.iter_mut().filter(|o| original_name(o) == name) {
            if o.pointer("/spec/replicas").is_some() || matches!(kind(o), "Deployment" | "StatefulSet" | "ReplicaSet") {
                o["spec"]["replicas"] = count.clone();
            }
        }
    }
    let renames = rename(&mut objs, &k);
    if let Some(ns) = k.get("namespace").and_then(Value::as_str) {
        set_namespace(&mut objs, ns);
    }
    if let Some(labels) = k.get("commonLabels").and_then(Value::as_object) {
        add_labels(&mut objs, labels, true, true);
    }
    for l in k.get("labels").and_then(Value::as_array).into_iter().flatten() {
        if let Some(pairs) = l.get("pairs").and_then(Value::as_object) {
            let selectors = l.get("includeSelectors").and_then(Value::as_bool) == Some(true);
            let templates = selectors || l.get("includeTemplates").and_then(Value::as_bool) == Some(true);
            add_labels(&mut objs, pairs, selectors, templates);
        }
    }
    if let Some(ann) = k.get("commonAnnotations").and_then(Value::as_object) {
        add_annotations(&mut objs, ann);
    }
    for i in k.get("images").and_then(Value::as_array).into_iter().flatten() {
        set_images(&mut objs, i);
    }
    fix_references(&mut objs, &renames);
    Ok(objs)
}

/// `dir/rel` with `.` and `..` resolved lexically (kustomizations name their bases `../base`).
fn join(dir: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in dir.join(rel).components() {
        match c {
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn kind(o: &Value) -> &str {
    o.get("kind").and_then(Value::as_str).unwrap_or_default()
}

fn meta<'a>(o: &'a Value, field: &str) -> &'a str {
    o.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).unwrap_or_default()
}

// ------------------------------------------------------------------ generators

fn generate(files: &dyn Files, dir: &Path, kind: &str, g: &Value, options: &Value) -> Result<Value> {
    let name = g.get("name").and_then(Value::as_str).unwrap_or_default();
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    let bad = |what: &str| KubectlError::msg(format!("{kind} generator {name:?}: {what}"));
    for env in strings(g, "envs").iter().chain(g.get("env").and_then(Value::as_str).map(String::from).iter()) {
        for line in files.read(&join(dir, env))?.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| bad(&format!("invalid env line {line:?}")))?;
            data.insert(k.to_string(), v.to_string());
        }
    }
    for lit in strings(g, "literals") {
        let (k, v) = lit.split_once('=').ok_or_else(|| bad(&format!("invalid literal {lit:?}")))?;
        let v = v.strip_prefix('"').and_then(|x| x.strip_suffix('"')).unwrap_or(v);
        data.insert(k.to_string(), v.to_string());
    }
    for f in strings(g, "files") {
        let (key, path) = match f.split_once('=') {
            Some((k, p)) => (k.to_string(), p.to_string()),
            None => {
                (Path::new(&f).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), f.clone())
            }
        };
        data.insert(key, files.read(&join(dir, &path))?);
    }
    let mut obj = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}});
    if let Some(ns) = g.get("namespace").and_then(Value::as_str) {
        obj["metadata"]["namespace"] = json!(ns);
    }
    if kind == "Secret" {
        use base64::Engine;
        let enc = |s: &String| json!(base64::engine::general_purpose::STANDARD.encode(s));
        obj["data"] = Value::Object(data.iter().map(|(k, v)| (k.clone(), enc(v))).collect());
        obj["type"] = json!(g.get("type").and_then(Value::as_str).unwrap_or("Opaque"));
    } else {
        obj["data"] = Value::Object(data.into_iter().map(|(k, v)| (k, json!(v))).collect());
    }
    let opts = |field: &str| -> Map<String, Value> {
        let mut m = options.get(field).and_then(Value::as_object).cloned().unwrap_or_default();
        m.extend(g.pointer(&format!("/options/{field}")).and_then(Value::as_object).cloned().unwrap_or_default());
        m
    };
    for field in ["labels", "annotations"] {
        let m = opts(field);
        if !m.is_empty() {
            obj["metadata"][field] = Value::Object(m);
        }
    }
    let disable = g
        .pointer("/options/disableNameSuffixHash")
        .and_then(Value::as_bool)
        .or_else(|| options.get("disableNameSuffixHash").and_then(Value::as_bool))
        .unwrap_or(false);
    if !disable {
        obj["metadata"]["annotations"][NEEDS_HASH] = json!("true");
    }
    Ok(obj)
}

/// A generator's object joins the others: a new one (`behavior: create`, the default), or
/// merged into / replacing one of the same name from a base.
fn merge_generated(objs: &mut Vec<Value>, generated: Value, g: &Value) -> Result<()> {
    let behavior = g.get("behavior").and_then(Value::as_str).unwrap_or("create");
    let same = |o: &Value| kind(o) == kind(&generated) && original_name(o) == meta(&generated, "name");
    match (behavior, objs.iter().position(same)) {
        ("create", None) => objs.push(generated),
        ("create", Some(_)) => {
            return Err(KubectlError::msg(format!(
                "{} {:?} already exists: use behavior merge or replace",
                kind(&generated),
                meta(&generated, "name")
            )))
        }
        ("merge", Some(i)) => {
            let data = generated["data"].as_object().cloned().unwrap_or_default();
            let existing = objs[i]["data"].as_object_mut();
            match existing {
                Some(m) => m.extend(data),
                None => objs[i]["data"] = Value::Object(data),
            }
            for field in ["labels", "annotations"] {
                if let Some(extra) = generated["metadata"][field].as_object() {
                    insert_all(&mut objs[i]["metadata"][field], extra);
                }
            }
        }
        ("replace", Some(i)) => objs[i] = generated,
        (b, None) if b == "merge" || b == "replace" => {
            return Err(KubectlError::msg(format!("no {} {:?} to {b}", kind(&generated), meta(&generated, "name"))))
        }
        (other, _) => return Err(KubectlError::msg(format!("unknown generator behavior {other:?}"))),
    }
    Ok(())
}

/// kustomize's content hash of a generated ConfigMap or Secret: SHA-256 of the JSON of its
/// kind, data (binaryData when there is some; a Secret's type and stringData) and a name,
/// its first ten hex digits with 0, 1, 3, a and e replaced by g, h, k, m and t. The name is
/// always empty: kustomize looks it up under a path its lookup reads as one field name, so
/// the same data hashes alike whatever the object is called — reproduced, or names would
/// differ from the official kubectl's.
pub fn content_hash(obj: &Value) -> String {
    let mut m = Map::new();
    m.insert("kind".into(), json!(kind(obj)));
    m.insert("name".into(), json!(""));
    for extra in ["binaryData", "stringData"] {
        if let Some(v) = obj.get(extra).filter(|v| v.as_object().is_some_and(|o| !o.is_empty())) {
            if (extra == "binaryData") == (kind(obj) == "ConfigMap") {
                m.insert(extra.into(), v.clone());
            }
        }
    }
    m.insert("data".into(), obj.get("data").cloned().unwrap_or(json!({})));
    if kind(obj) == "Secret" {
        m.insert("type".into(), obj.get("type").cloned().unwrap_or(json!("")));
    }
    let text = crate::merge::go_json(&crate::print::sorted(&Value::Object(m)));
    let hex: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    hex[..10]
        .chars()
        .map(|c| match c {
            '0' => 'g',
            '1' => 'h',
            '3' => 'k',
            'a' => 'm',
            'e' => 't',
            c => c,
        })
        .collect()
}

// ------------------------------------------------------------------ patches

fn matches_target(o: &Value, t: &Value) -> bool {
    let s = |k: &str| t.get(k).and_then(Value::as_str);
    let api = o.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
    let re = |pat: &str, v: &str| regex::Regex::new(&format!("^(?:{pat})$")).is_ok_and(|r| r.is_match(v));
    s("kind").is_none_or(|k| re(k, kind(o)))
        && s("name").is_none_or(|n| re(n, meta(o, "name")) || re(n, original_name(o)))
        && s("namespace").is_none_or(|n| re(n, meta(o, "namespace")))
        && s("group").is_none_or(|g| g == group)
        && s("version").is_none_or(|v| v == version)
        && s("labelSelector").is_none_or(|sel| selector_matches(sel, o.pointer("/metadata/labels")))
}

fn selector_matches(sel: &str, labels: Option<&Value>) -> bool {
    sel.split(',').filter(|p| !p.trim().is_empty()).all(|req| {
        let have = |k: &str| labels.and_then(|l| l.get(k.trim())).and_then(Value::as_str);
        match req.split_once("!=") {
            Some((k, v)) => have(k) != Some(v.trim()),
            None => match req.split_once('=') {
                Some((k, v)) => have(k) == Some(v.trim_start_matches('=').trim()),
                None => have(req).is_some(),
            },
        }
    })
}

fn apply_patch(objs: &mut [Value], patch: &Value, target: Option<&Value>) -> Result<()> {
    if let Some(ops) = patch.as_array() {
        // JSON 6902: applies to every target match.
        let t = target.ok_or_else(|| KubectlError::msg("a JSON 6902 patch needs a target"))?;
        let ops: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone()))
            .map_err(|e| KubectlError::msg(format!("invalid JSON patch: {e}")))?;
        for o in objs.iter_mut().filter(|o| matches_target(o, t)) {
            json_patch::patch(o, &ops).map_err(|e| KubectlError::msg(format!("applying a JSON patch: {e}")))?;
        }
        return Ok(());
    }
    // Strategic merge: to the target matches, or to the object the patch names.
    let mut hit = false;
    for o in objs.iter_mut() {
        let selected = match target {
            Some(t) => matches_target(o, t),
            None => kind(o) == kind(patch) && original_name(o) == meta(patch, "name"),
        };
        if selected {
            let mut p = patch.clone();
            if target.is_some() || meta(o, "name") != meta(patch, "name") {
                // The target decides; the patch's own identity does not rename the object.
                if let Some(m) = p.as_object_mut() {
                    m.remove("apiVersion");
                    m.remove("kind");
                    if let Some(md) = m.get_mut("metadata").and_then(Value::as_object_mut) {
                        md.remove("name");
                        md.remove("namespace");
                    }
                }
            }
            *o = strategic_merge(o, &p);
            hit = true;
        }
    }
    if !hit {
        return Err(KubectlError::msg(format!(
            "no resource matches strategic merge patch \"{}\" {}",
            kind(patch),
            meta(patch, "name")
        )));
    }
    Ok(())
}

/// A strategic merge patch with the built-in kinds' list keys: maps merge, `null` deletes,
/// lists merged by key element-wise (`$patch: delete` removes an element), other lists
/// replaced.
fn strategic_merge(orig: &Value, patch: &Value) -> Value {
    match (orig, patch) {
        (Value::Object(o), Value::Object(p)) => {
            let mut out = o.clone();
            for (k, pv) in p {
                if pv.is_null() {
                    out.remove(k);
                    continue;
                }
                let merged = match (o.get(k), pv) {
                    (Some(ov @ Value::Object(_)), Value::Object(_)) => strategic_merge(ov, pv),
                    (Some(Value::Array(oa)), Value::Array(pa)) => {
                        match crate::merge::merge_key(k, pa.first().or(oa.first())) {
                            Some(key) => {
                                let mut items = oa.clone();
                                for pi in pa {
                                    let pos = items.iter().position(|x| x.get(key) == pi.get(key));
                                    let delete = pi.get("$patch").and_then(Value::as_str) == Some("delete");
                                    match (pos, delete) {
                                        (Some(i), true) => {
                                            items.remove(i);
                                        }
                                        (Some(i), false) => items[i] = strategic_merge(&items[i], pi),
                                        (None, false) => items.push(pi.clone()),
                                        (None, true) => {}
                                    }
                                }
                                Value::Array(items)
                            }
                            None => pv.clone(),
                        }
                    }
                    _ => pv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, p) => p.clone(),
    }
}

// ------------------------------------------------------------------ names, namespaces, labels

/// Kinds that are not namespaced (kustomize leaves their namespace alone).
fn cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "CustomResourceDefinition"
            | "PersistentVolume"
            | "StorageClass"
            | "PriorityClass"
            | "IngressClass"
            | "RuntimeClass"
            | "MutatingWebhookConfiguration"
            | "ValidatingWebhookConfiguration"
            | "APIService"
            | "Node"
            | "CSIDriver"
            | "CSINode"
            | "VolumeAttachment"
    )
}

/// Names changed by namePrefix/nameSuffix and generator hashes: (kind, old) → new.
type Renames = BTreeMap<(String, String), String>;

fn rename(objs: &mut [Value], k: &Value) -> Renames {
    let prefix = k.get("namePrefix").and_then(Value::as_str).unwrap_or_default();
    let suffix = k.get("nameSuffix").and_then(Value::as_str).unwrap_or_default();
    let mut renames = Renames::new();
    if prefix.is_empty() && suffix.is_empty() {
        return renames;
    }
    for o in objs.iter_mut() {
        if matches!(kind(o), "Namespace" | "CustomResourceDefinition") {
            continue;
        }
        let old = meta(o, "name").to_string();
        let new = format!("{prefix}{old}{suffix}");
        o["metadata"]["name"] = json!(new.clone());
        renames.insert((kind(o).to_string(), old), new);
    }
    renames
}

fn set_namespace(objs: &mut [Value], ns: &str) {
    for o in objs.iter_mut() {
        if !cluster_scoped(kind(o)) {
            o["metadata"]["namespace"] = json!(ns);
        }
        // Bindings name their ServiceAccount subjects in the kustomization's namespace.
        if matches!(kind(o), "RoleBinding" | "ClusterRoleBinding") {
            for s in o.get_mut("subjects").and_then(Value::as_array_mut).into_iter().flatten() {
                if s.get("kind").and_then(Value::as_str) == Some("ServiceAccount") {
                    s["namespace"] = json!(ns);
                }
            }
        }
    }
}

/// The pod template of a workload, if it has one.
fn template_path(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job" | "ReplicationController" => {
            Some("/spec/template")
        }
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

fn insert_all(target: &mut Value, pairs: &Map<String, Value>) {
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(m) = target.as_object_mut() {
        for (k, v) in pairs {
            m.insert(k.clone(), v.clone());
        }
    }
}

fn add_labels(objs: &mut [Value], labels: &Map<String, Value>, selectors: bool, templates: bool) {
    for o in objs.iter_mut() {
        let k = kind(o).to_string();
        insert_all(&mut o["metadata"]["labels"], labels);
        if selectors {
            match k.as_str() {
                "Service" => insert_all(&mut o["spec"]["selector"], labels),
                "ReplicationController" => insert_all(&mut o["spec"]["selector"], labels),
                "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" => {
                    insert_all(&mut o["spec"]["selector"]["matchLabels"], labels)
                }
                "PodDisruptionBudget" => insert_all(&mut o["spec"]["selector"]["matchLabels"], labels),
                _ => {}
            }
        }
        if templates {
            if let Some(t) = template_path(&k).and_then(|p| o.pointer_mut(p)) {
                insert_all(&mut t["metadata"]["labels"], labels);
            }
            if k == "CronJob" {
                if let Some(jt) = o.pointer_mut("/spec/jobTemplate") {
                    insert_all(&mut jt["metadata"]["labels"], labels);
                }
            }
        }
    }
}

fn add_annotations(objs: &mut [Value], ann: &Map<String, Value>) {
    for o in objs.iter_mut() {
        insert_all(&mut o["metadata"]["annotations"], ann);
        if let Some(t) = template_path(kind(o)).and_then(|p| o.pointer_mut(p)) {
            insert_all(&mut t["metadata"]["annotations"], ann);
        }
    }
}

/// `images:` — a container image named `name` (with any tag or digest) gets `newName`,
/// `newTag` or `digest`.
fn set_images(objs: &mut [Value], rule: &Value) {
    let Some(name) = rule.get("name").and_then(Value::as_str) else { return };
    let s = |k: &str| rule.get(k).and_then(Value::as_str).map(String::from);
    let new_tag = rule.get("newTag").map(|t| t.as_str().map(String::from).unwrap_or_else(|| t.to_string()));
    fn containers(v: &mut Value, f: &mut dyn FnMut(&mut Value)) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if matches!(k.as_str(), "containers" | "initContainers") {
                        for c in x.as_array_mut().into_iter().flatten() {
                            f(c);
                        }
                    } else {
                        containers(x, f);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| containers(x, f)),
            _ => {}
        }
    }
    for o in objs.iter_mut() {
        containers(o, &mut |c| {
            let Some(image) = c.get("image").and_then(Value::as_str) else { return };
            let (repo, digest) = match image.split_once('@') {
                Some((r, d)) => (r, Some(d)),
                None => (image, None),
            };
            let (repo, tag) = match repo.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
                Some((r, t)) => (r, Some(t)),
                None => (repo, None),
            };
            if repo != name {
                return;
            }
            let repo = s("newName").unwrap_or_else(|| repo.to_string());
            let out = match (s("digest"), &new_tag) {
                (Some(d), _) => format!("{repo}@{d}"),
                (None, Some(t)) => format!("{repo}:{t}"),
                (None, None) => match (tag, digest) {
                    (_, Some(d)) => format!("{repo}@{d}"),
                    (Some(t), None) => format!("{repo}:{t}"),
                    (None, None) => repo,
                },
            };
            c["image"] = json!(out);
        });
    }
}

/// Point the references in pod templates and pods (volumes, envFrom, env valueFrom,
/// imagePullSecrets, serviceAccountName) at the renamed ConfigMaps, Secrets and
/// ServiceAccounts.
fn fix_references(objs: &mut [Value], renames: &Renames) {
    let renamed = |k: &str, n: &str| renames.get(&(k.to_string(), n.to_string())).cloned();
    fn set(v: &mut Value, field: &str, kind: &str, renamed: &dyn Fn(&str, &str) -> Option<String>) {
        if let Some(new) = v.get(field).and_then(Value::as_str).and_then(|n| renamed(kind, n)) {
            v[field] = json!(new);
        }
    }
    fn pod_spec(spec: &mut Value, renamed: &dyn Fn(&str, &str) -> Option<String>) {
        set(spec, "serviceAccountName", "ServiceAccount", renamed);
        for v in spec.get_mut("volumes").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(cm) = v.get_mut("configMap") {
                set(cm, "name", "ConfigMap", renamed);
            }
            if let Some(s) = v.get_mut("secret") {
                set(s, "secretName", "Secret", renamed);
            }
            for src in v.pointer_mut("/projected/sources").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(cm) = src.get_mut("configMap") {
                    set(cm, "name", "ConfigMap", renamed);
                }
                if let Some(s) = src.get_mut("secret") {
                    set(s, "name", "Secret", renamed);
                }
            }
        }
        for s in spec.get_mut("imagePullSecrets").and_then(Value::as_array_mut).into_iter().flatten() {
            set(s, "name", "Secret", renamed);
        }
        for field in ["containers", "initContainers"] {
            for c in spec.get_mut(field).and_then(Value::as_array_mut).into_iter().flatten() {
                for e in c.get_mut("envFrom").and_then(Value::as_array_mut).into_iter().flatten() {
                    if let Some(r) = e.get_mut("configMapRef") {
                        set(r, "name", "ConfigMap", renamed);
                    }
                    if let Some(r) = e.get_mut("secretRef") {
                        set(r, "name", "Secret", renamed);
                    }
                }
                for e in c.get_mut("env").and_then(Value::as_array_mut).into_iter().flatten() {
                    if let Some(r) = e.pointer_mut("/valueFrom/configMapKeyRef") {
                        set(r, "name", "ConfigMap", renamed);
                    }
                    if let Some(r) = e.pointer_mut("/valueFrom/secretKeyRef") {
                        set(r, "name", "Secret", renamed);
                    }
                }
            }
        }
    }
    for o in objs.iter_mut() {
        let k = kind(o).to_string();
        if k == "Pod" {
            if let Some(spec) = o.get_mut("spec") {
                pod_spec(spec, &renamed);
            }
        } else if let Some(spec) = template_path(&k).and_then(|p| o.pointer_mut(&format!("{p}/spec"))) {
            pod_spec(spec, &renamed);
        }
        if matches!(k.as_str(), "RoleBinding" | "ClusterRoleBinding") {
            for s in o.get_mut("subjects").and_then(Value::as_array_mut).into_iter().flatten() {
                if s.get("kind").and_then(Value::as_str) == Some("ServiceAccount") {
                    set(s, "name", "ServiceAccount", &renamed);
                }
            }
        }
    }
}

// ------------------------------------------------------------------ order

/// kustomize's legacy order: these kinds first, in this order, the webhook configurations
/// last, everything else between; then by group/version/kind, namespace and name.
const ORDER_FIRST: &[&str] = &[
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
];
const ORDER_LAST: &[&str] = &["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"];

fn sort_key(o: &Value) -> (i64, String, String, String) {
    let k = kind(o);
    let rank = match (ORDER_FIRST.iter().position(|x| *x == k), ORDER_LAST.iter().position(|x| *x == k)) {
        (Some(i), _) => i as i64 - ORDER_FIRST.len() as i64,
        (None, Some(i)) => 1 + i as i64,
        _ => 0,
    };
    let api = o.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let (group, version) = api.rsplit_once('/').unwrap_or(("~G", api));
    let gvk = format!("{group}_{version}_{k}");
    (rank, gvk, meta(o, "namespace").to_string(), meta(o, "name").to_string())
}

/// The objects of `-k DIR` for the other commands.
pub fn read(dir: &str) -> Result<Vec<crate::manifest::Manifest>> {
    let objs = build(&Disk, &PathBuf::from(dir))?;
    Ok(objs.into_iter().map(|obj| crate::manifest::Manifest { source: dir.to_string(), obj }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Mem(HashMap<PathBuf, String>);

    impl Files for Mem {
        fn read(&self, path: &Path) -> Result<String> {
            self.0.get(path).cloned().ok_or_else(|| KubectlError::msg(format!("{}: not found", path.display())))
        }
        fn is_dir(&self, path: &Path) -> bool {
            self.0.keys().any(|p| p.starts_with(path) && p != path)
        }
    }

    fn fs(files: &[(&str, &str)]) -> Mem {
        Mem(files.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect())
    }

    const DEPLOY: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: web\n        image: nginx:1.25\n        envFrom: [{configMapRef: {name: settings}}]\n";

    #[test]
    fn an_overlay_renames_relabels_patches_and_generates() {
        let files = fs(&[
            ("base/kustomization.yaml", "resources: [deploy.yaml, svc.yaml]\n"),
            ("base/deploy.yaml", DEPLOY),
            ("base/svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports: [{port: 80}]\n"),
            (
                "prod/kustomization.yaml",
                "resources: [../base]\nnamespace: prod\nnamePrefix: prod-\ncommonLabels: {env: prod}\n\
                 images: [{name: nginx, newTag: '1.27'}]\nreplicas: [{name: web, count: 3}]\n\
                 configMapGenerator: [{name: settings, literals: [LEVEL=debug]}]\n\
                 patches:\n- target: {kind: Deployment}\n  patch: |\n    - op: add\n      path: /spec/template/spec/containers/0/args\n      value: [--fast]\n",
            ),
        ]);
        let objs = build(&files, Path::new("prod")).unwrap();
        let kinds: Vec<&str> = objs.iter().map(kind).collect();
        assert_eq!(kinds, ["ConfigMap", "Service", "Deployment"], "legacy order");
        let cm = &objs[0];
        let cm_name = meta(cm, "name");
        assert!(cm_name.starts_with("prod-settings-") && cm_name.len() == "prod-settings-".len() + 10, "{cm_name}");
        assert_eq!(cm["metadata"]["namespace"], "prod");
        let d = &objs[2];
        assert_eq!(meta(d, "name"), "prod-web");
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(d["spec"]["selector"]["matchLabels"], json!({"app": "web", "env": "prod"}));
        assert_eq!(d["spec"]["template"]["metadata"]["labels"]["env"], "prod");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "nginx:1.27");
        assert_eq!(c["args"], json!(["--fast"]));
        assert_eq!(c["envFrom"][0]["configMapRef"]["name"], cm_name, "references follow the generated name");
        assert_eq!(objs[1]["spec"]["selector"], json!({"app": "web", "env": "prod"}));
    }

    #[test]
    fn strategic_patches_merge_containers_by_name() {
        let files = fs(&[
            (
                "k/kustomization.yaml",
                "resources: [d.yaml]\npatchesStrategicMerge:\n- |\n  apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: web}\n  spec:\n    template:\n      spec:\n        containers:\n        - name: web\n          resources: {limits: {memory: 64Mi}}\n",
            ),
            ("k/d.yaml", DEPLOY),
        ]);
        let objs = build(&files, Path::new("k")).unwrap();
        let c = &objs[0]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            (c["image"].as_str(), c["resources"]["limits"]["memory"].as_str()),
            (Some("nginx:1.25"), Some("64Mi"))
        );
    }

    #[test]
    fn unknown_fields_and_missing_kustomizations_are_errors() {
        let err = build(&fs(&[("k/kustomization.yaml", "helmCharts: []\n")]), Path::new("k")).unwrap_err();
        assert!(err.to_string().contains("\"helmCharts\" is not supported"), "{err}");
        let err = build(&fs(&[("x/a.yaml", "")]), Path::new("k")).unwrap_err();
        assert!(err.to_string().contains("unable to find one of 'kustomization.yaml'"), "{err}");
    }

    #[test]
    fn the_content_hash_is_kustomize_s() {
        // What the official kubectl's kustomize names a generated ConfigMap `cm` with a=1.
        let a = json!({"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}});
        assert_eq!(content_hash(&a), "h29d89cmmt");
        let b = json!({"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "2"}});
        assert_eq!(content_hash(&a).len(), 10);
        assert_eq!(content_hash(&a), content_hash(&a.clone()));
        assert_ne!(content_hash(&a), content_hash(&b));
        assert!(!content_hash(&a).contains(['0', '1', '3', 'a', 'e']));
    }
}
