//! `kubectl get`: server-side Tables printed like kubectl's default printer, or whole objects
//! as json/yaml/name/jsonpath/custom-columns; label and field selectors, `-A`, `-w`.

use futures::{AsyncBufReadExt, StreamExt};
use http::Method;
use serde_json::{json, Value};

use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::print::{self, columns, jsonpath, table, Output};
use crate::resources::ApiRes;

pub const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// Display one or many resources.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE[.VERSION][.GROUP] [NAME ...] or TYPE/NAME ...
    pub args: Vec<String>,
    /// Output format: json|yaml|name|wide|jsonpath=...|custom-columns=...
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Selector (field query) to filter on.
    #[arg(long)]
    pub field_selector: Option<String>,
    /// List the requested object(s) across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// After listing/getting the requested object, watch for changes.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Watch for changes to the requested object(s), without listing/getting first.
    #[arg(long)]
    pub watch_only: bool,
    /// When printing, show all labels as the last column.
    #[arg(long)]
    pub show_labels: bool,
    /// When using the default or custom-column output format, don't print headers.
    #[arg(long)]
    pub no_headers: bool,
    /// If the requested object does not exist the command will return exit code 0.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// If present, list the resource type for the requested object(s).
    #[arg(long)]
    pub show_kind: bool,
    /// If true, keep the managedFields when printing objects in JSON or YAML format.
    #[arg(long)]
    pub show_managed_fields: bool,
    /// Return large lists in chunks rather than all at once (accepted; lists come whole).
    #[arg(long, default_value_t = 500)]
    pub chunk_size: i64,
}

/// What the positional arguments ask for: per type, the names (empty: list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub type_arg: String,
    pub names: Vec<String>,
}

/// Split `TYPE[,TYPE] [NAME…]` or `TYPE/NAME…` into requests. Pure.
pub fn parse_args(args: &[String]) -> Result<Vec<Request>> {
    let Some(first) = args.first() else {
        return Err(KubectlError::msg(
            "Required resource not specified.\nUse \"kubectl explain <resource>\" for a detailed description of that resource (e.g. kubectl explain pods).\nSee 'kubectl get -h' for help and examples",
        ));
    };
    if first.contains('/') {
        let mut out: Vec<Request> = Vec::new();
        for a in args {
            let Some((t, n)) = a.split_once('/') else {
                return Err(KubectlError::msg(format!(
                    "there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (e.g. 'kubectl get resource/<resource_name>' instead of 'kubectl get resource resource/<resource_name>'"
                )));
            };
            match out.iter_mut().find(|r| r.type_arg == t) {
                Some(r) => r.names.push(n.to_string()),
                None => out.push(Request { type_arg: t.to_string(), names: vec![n.to_string()] }),
            }
        }
        return Ok(out);
    }
    if args[1..].iter().any(|a| a.contains('/')) {
        return Err(KubectlError::msg(
            "there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (e.g. 'kubectl get resource/<resource_name>' instead of 'kubectl get resource resource/<resource_name>'",
        ));
    }
    Ok(first
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| Request { type_arg: t.to_string(), names: args[1..].to_vec() })
        .collect())
}

/// Set apiVersion/kind on list items (the API leaves them out).
pub fn with_type_meta(mut obj: Value, res: &ApiRes) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.entry("apiVersion").or_insert_with(|| Value::String(res.api_version()));
        m.entry("kind").or_insert_with(|| Value::String(res.kind.clone()));
    }
    obj
}

/// The `No resources found…` line.
pub fn no_resources_message(namespace: &str, all_namespaces: bool, namespaced: bool) -> String {
    if all_namespaces || !namespaced {
        "No resources found".to_string()
    } else {
        format!("No resources found in {namespace} namespace.")
    }
}

struct Fetched {
    res: ApiRes,
    /// Tables (table output) or objects (other outputs).
    tables: Vec<Value>,
    objects: Vec<Value>,
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let output = Output::parse(a.output.as_deref())?;
    let reqs = parse_args(&a.args)?;
    // Expand `all` (category) through discovery; everything else resolves statically first.
    let mut typed: Vec<(ApiRes, Vec<String>)> = Vec::new();
    for r in &reqs {
        if r.type_arg == "all" {
            for res in ctx.discovery().await?.iter().filter(|x| x.categories.iter().any(|c| c == "all")) {
                typed.push((res.clone(), r.names.clone()));
            }
        } else {
            typed.push((ctx.resolve(&r.type_arg).await?, r.names.clone()));
        }
    }
    let ns = if a.all_namespaces { None } else { Some(ctx.namespace.as_str()) };
    let single_object = typed.len() == 1 && typed[0].1.len() == 1 && reqs.iter().all(|r| r.type_arg != "all");
    let mut errors: Vec<KubectlError> = Vec::new();
    let mut fetched: Vec<Fetched> = Vec::new();
    if !a.watch_only {
        for (res, names) in &typed {
            let mut f = Fetched { res: res.clone(), tables: Vec::new(), objects: Vec::new() };
            let accept = if output.needs_objects() { "application/json" } else { TABLE_ACCEPT };
            if names.is_empty() {
                let path = with_query(
                    &res.collection_path(ns),
                    &[
                        ("labelSelector", a.selector.clone().unwrap_or_default()),
                        ("fieldSelector", a.field_selector.clone().unwrap_or_default()),
                        ("limit", a.chunk_size.to_string()),
                    ],
                );
                let v = fetch(ctx, &path, accept).await?;
                absorb(&mut f, v, res, output.needs_objects());
            } else {
                for n in names {
                    match fetch(ctx, &res.object_path(ns, n), accept).await {
                        Ok(v) => absorb(&mut f, v, res, output.needs_objects()),
                        Err(e) if e.is_not_found() && a.ignore_not_found => {}
                        Err(e) => errors.push(e),
                    }
                }
            }
            fetched.push(f);
        }
        print_fetched(ctx, a, &output, &fetched, ns.is_none(), single_object, &typed)?;
        // Like kubectl, errors come after whatever could be printed.
        for e in &errors {
            eprintln!("{e}");
        }
    }
    if a.watch || a.watch_only {
        let (res, names) = typed.first().ok_or_else(|| KubectlError::msg("nothing to watch"))?;
        // As kubectl: the header is printed with the first watch row unless the listing
        // already printed it.
        let printed_header = !a.watch_only && fetched.iter().flat_map(|f| &f.tables).map(row_count).sum::<usize>() > 0;
        watch(ctx, a, &output, res, names, ns, printed_header).await?;
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(KubectlError::Reported)
    }
}

async fn fetch(ctx: &Ctx, path: &str, accept: &str) -> Result<Value> {
    let text = ctx.call(Method::GET, path, accept, None).await?;
    serde_json::from_str(&text).map_err(|e| KubectlError::msg(format!("decoding {path}: {e}")))
}

fn absorb(f: &mut Fetched, v: Value, res: &ApiRes, objects: bool) {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind == "Table" {
        f.tables.push(v);
        return;
    }
    let items: Vec<Value> = match v.get("items").and_then(Value::as_array) {
        Some(items) if kind.ends_with("List") => items.iter().map(|o| with_type_meta(o.clone(), res)).collect(),
        _ => vec![with_type_meta(v, res)],
    };
    if objects {
        f.objects.extend(items);
    } else {
        f.tables.push(table::fallback_table(&items));
    }
}

fn row_count(t: &Value) -> usize {
    t.get("rows").and_then(Value::as_array).map_or(0, Vec::len)
}

fn print_fetched(
    ctx: &Ctx,
    a: &Args,
    output: &Output,
    fetched: &[Fetched],
    all_ns: bool,
    single_object: bool,
    typed: &[(ApiRes, Vec<String>)],
) -> Result<()> {
    let any_names = typed.iter().any(|(_, n)| !n.is_empty());
    let objects: Vec<Value> = fetched.iter().flat_map(|f| f.objects.iter().cloned()).collect();
    let total = objects.len() + fetched.iter().flat_map(|f| &f.tables).map(row_count).sum::<usize>();
    if total == 0 {
        if !any_names {
            let namespaced = typed.iter().all(|(r, _)| r.namespaced);
            eprintln!("{}", no_resources_message(&ctx.namespace, all_ns, namespaced));
        }
        if !matches!(output, Output::Json | Output::Yaml) || any_names {
            return Ok(());
        }
    }
    let doc = || if single_object && objects.len() == 1 { objects[0].clone() } else { print::as_list(objects.clone()) };
    match output {
        Output::Table | Output::Wide => {
            // Several requested types (or `all`) name every row with its kind.
            let several = fetched.len() > 1;
            let mut first = true;
            for f in fetched {
                let mut rows: Vec<Vec<String>> = Vec::new();
                let opts = table::TableOpts {
                    wide: *output == Output::Wide,
                    with_namespace: all_ns && f.res.namespaced,
                    show_labels: a.show_labels,
                    no_headers: a.no_headers,
                    name_prefix: (several || a.show_kind).then(|| format!("{}/", f.res.kind_group())),
                };
                for t in &f.tables {
                    let r = table::table_rows(t, &opts);
                    if rows.is_empty() {
                        rows = r;
                    } else {
                        rows.extend(r.into_iter().skip(if a.no_headers { 0 } else { 1 }));
                    }
                }
                let data_rows = rows.len() - if a.no_headers { 0 } else { rows.len().min(1) };
                if data_rows == 0 {
                    continue;
                }
                if !first {
                    println!();
                }
                first = false;
                print!("{}", table::align(&rows));
            }
        }
        Output::Json | Output::Yaml => {
            let doc = if a.show_managed_fields { doc() } else { print::omit_managed_fields(&doc()) };
            match output {
                Output::Json => print!("{}", print::to_json(&doc)),
                _ => print!("{}", print::to_yaml(&doc)),
            }
        }
        Output::Name => {
            for f in fetched {
                for o in &f.objects {
                    println!(
                        "{}/{}",
                        f.res.kind_group(),
                        o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
                    );
                }
            }
        }
        Output::JsonPath(t) => {
            let s = jsonpath::render(t, &doc())
                .map_err(|e| KubectlError::msg(format!("error executing jsonpath {t:?}: {e}")))?;
            print!("{s}");
        }
        Output::CustomColumns(spec) => {
            let cols = columns::parse_spec(spec).map_err(KubectlError::msg)?;
            let rows = columns::rows(&cols, &objects, a.no_headers).map_err(KubectlError::msg)?;
            print!("{}", table::align(&rows));
        }
    }
    Ok(())
}

async fn watch(
    ctx: &Ctx,
    a: &Args,
    output: &Output,
    res: &ApiRes,
    names: &[String],
    ns: Option<&str>,
    printed_header: bool,
) -> Result<()> {
    let mut field_selector = a.field_selector.clone().unwrap_or_default();
    if let [name] = names {
        field_selector = format!("metadata.name={name}");
    }
    // Start from the current state so only changes are shown.
    let list = ctx
        .get(&with_query(&res.collection_path(ns), &[("limit", "1".into()), ("fieldSelector", field_selector.clone())]))
        .await?;
    let rv = list.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let path = with_query(
        &res.collection_path(ns),
        &[
            ("watch", "true".into()),
            ("resourceVersion", rv),
            ("labelSelector", a.selector.clone().unwrap_or_default()),
            ("fieldSelector", field_selector),
        ],
    );
    let tables = matches!(output, Output::Table | Output::Wide);
    let accept = if tables { TABLE_ACCEPT } else { "application/json" };
    let mut lines = ctx.stream_accept(&path, accept).await?.lines();
    let mut state = WatchTables { columns: None, printed_header: printed_header || a.no_headers };
    while let Some(line) = lines.next().await {
        let line = line.map_err(|e| KubectlError::msg(format!("watch: {e}")))?;
        let Ok(ev) = serde_json::from_str::<Value>(&line) else { continue };
        let ty = ev.get("type").and_then(Value::as_str).unwrap_or_default();
        if ty == "BOOKMARK" {
            continue;
        }
        if ty == "ERROR" {
            let msg = ev.pointer("/object/message").and_then(Value::as_str).unwrap_or("watch error");
            return Err(KubectlError::msg(msg.to_string()));
        }
        let obj = ev.get("object").cloned().unwrap_or(Value::Null);
        if tables {
            let t = if obj.get("kind").and_then(Value::as_str) == Some("Table") {
                obj
            } else {
                table::fallback_table(&[with_type_meta(obj, res)])
            };
            let opts = table::TableOpts {
                wide: *output == Output::Wide,
                with_namespace: ns.is_none() && res.namespaced,
                show_labels: a.show_labels,
                no_headers: false,
                name_prefix: None,
            };
            print!("{}", state.event_text(t, &opts));
        } else {
            let obj = with_type_meta(obj, res);
            let obj = if a.show_managed_fields { obj } else { print::omit_managed_fields(&obj) };
            let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
            match output {
                Output::Json => print!("{}", print::to_json(&obj)),
                Output::Yaml => print!("---\n{}", print::to_yaml(&obj)),
                Output::Name => println!("{}/{name}", res.kind_group()),
                Output::JsonPath(t) => print!("{}", jsonpath::render(t, &obj).map_err(KubectlError::msg)?),
                Output::CustomColumns(spec) => {
                    let cols = columns::parse_spec(spec).map_err(KubectlError::msg)?;
                    print!("{}", table::align(&columns::rows(&cols, &[obj], true).map_err(KubectlError::msg)?));
                }
                Output::Table | Output::Wide => {}
            }
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
    Ok(())
}

/// Watch events as Tables: the server sends the column definitions only with the first
/// event (later ones reuse them); the header is printed once, with the first row.
struct WatchTables {
    columns: Option<Value>,
    printed_header: bool,
}

impl WatchTables {
    fn event_text(&mut self, mut t: Value, opts: &table::TableOpts) -> String {
        match t.get("columnDefinitions").and_then(Value::as_array) {
            Some(c) if !c.is_empty() => self.columns = Some(Value::Array(c.clone())),
            _ => t["columnDefinitions"] = self.columns.clone().unwrap_or(json!([])),
        }
        let opts = table::TableOpts { no_headers: self.printed_header, ..opts.clone() };
        let rows = table::table_rows(&t, &opts);
        if row_count(&t) > 0 {
            self.printed_header = true;
        }
        table::align(&rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_forms() {
        assert_eq!(parse_args(&s(&["po"])).unwrap(), vec![Request { type_arg: "po".into(), names: vec![] }]);
        assert_eq!(
            parse_args(&s(&["po,svc", "a"])).unwrap(),
            vec![
                Request { type_arg: "po".into(), names: s(&["a"]) },
                Request { type_arg: "svc".into(), names: s(&["a"]) }
            ]
        );
        assert_eq!(
            parse_args(&s(&["po/a", "svc/b", "po/c"])).unwrap(),
            vec![
                Request { type_arg: "po".into(), names: s(&["a", "c"]) },
                Request { type_arg: "svc".into(), names: s(&["b"]) }
            ]
        );
        assert!(parse_args(&[]).is_err());
        assert!(parse_args(&s(&["po", "svc/b"])).is_err());
    }

    #[test]
    fn watch_tables_reuse_the_first_columns() {
        let cols = json!([{"name": "Name", "type": "string", "format": "name", "priority": 0},
            {"name": "Status", "type": "string", "priority": 0}, {"name": "IP", "type": "string", "priority": 1}]);
        let ev = |name: &str, status: &str, with_cols: bool| {
            json!({"kind": "Table", "columnDefinitions": if with_cols { cols.clone() } else { Value::Null },
                "rows": [{"cells": [name, status, "10.0.0.1"], "object": {"metadata": {"name": name}}}]})
        };
        let mut w = WatchTables { columns: None, printed_header: false };
        let opts = table::TableOpts::default();
        assert_eq!(w.event_text(ev("p1", "Pending", true), &opts), "NAME   STATUS\np1     Pending\n");
        assert_eq!(w.event_text(ev("p1", "Running", false), &opts), "p1    Running\n");
        let wide = table::TableOpts { wide: true, ..Default::default() };
        assert_eq!(w.event_text(ev("p2", "Running", false), &wide), "p2    Running   10.0.0.1\n");
        // After a non-empty listing the header is not repeated.
        let mut w = WatchTables { columns: None, printed_header: true };
        assert_eq!(w.event_text(ev("p1", "Pending", true), &opts), "p1    Pending\n");
    }

    #[test]
    fn messages() {
        assert_eq!(no_resources_message("default", false, true), "No resources found in default namespace.");
        assert_eq!(no_resources_message("default", true, true), "No resources found");
        assert_eq!(no_resources_message("default", false, false), "No resources found");
    }
}
