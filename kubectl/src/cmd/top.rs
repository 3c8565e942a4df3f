//! `kubectl top node|pod`: CPU and memory from `metrics.k8s.io/v1beta1`, printed as
//! kubectl prints them (millicores, MiB, percentages of the node's allocatable).

use apimachinery::quantity;
use serde_json::Value;

use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::print::tabwriter::tabwrite;

/// Display resource (CPU/memory) usage.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Display resource (CPU/memory) usage of nodes.
    #[command(visible_aliases = ["nodes", "no"])]
    Node(NodeArgs),
    /// Display resource (CPU/memory) usage of pods.
    #[command(visible_aliases = ["pods", "po"])]
    Pod(PodArgs),
}

#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// NAME
    pub name: Option<String>,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// If present, print output without headers.
    #[arg(long)]
    pub no_headers: bool,
    /// If non-empty, sort nodes list using specified field. The field can be either 'cpu' or 'memory'.
    #[arg(long)]
    pub sort_by: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct PodArgs {
    /// NAME
    pub name: Option<String>,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// If present, list the requested object(s) across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// If present, print output without headers.
    #[arg(long)]
    pub no_headers: bool,
    /// If present, print usage of containers within a pod.
    #[arg(long)]
    pub containers: bool,
    /// If non-empty, sort pods list using specified field. The field can be either 'cpu' or 'memory'.
    #[arg(long)]
    pub sort_by: Option<String>,
}

/// `Quantity.MilliValue()` (rounded up).
fn milli(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_str).map(quantity::milli_value).unwrap_or(0)
}

/// (cpu millicores, memory bytes) of a usage map.
fn usage(u: Option<&Value>) -> (i64, i64) {
    let cpu = milli(u.and_then(|u| u.get("cpu")));
    let mem = u.and_then(|u| u.get("memory")).and_then(Value::as_str).map(quantity::value).unwrap_or(0);
    (cpu, mem)
}

fn name_of(o: &Value) -> String {
    o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// The `kubectl top node` table (tab-separated, every cell tab-terminated as kubectl writes
/// it): metrics sorted by name (or by `--sort-by` cpu|memory, descending), then nodes
/// without metrics as `<unknown>`.
pub fn node_table(metrics: &[Value], nodes: &[Value], no_headers: bool, sort_by: Option<&str>) -> String {
    let mut rows: Vec<(String, i64, i64)> = metrics
        .iter()
        .map(|m| {
            let (c, mem) = usage(m.get("usage"));
            (name_of(m), c, mem)
        })
        .collect();
    sort_rows(&mut rows, sort_by);
    let mut out = String::new();
    if !no_headers {
        out.push_str("NAME\tCPU(cores)\tCPU(%)\tMEMORY(bytes)\tMEMORY(%)\t\n");
    }
    for (name, cpu, mem) in &rows {
        let alloc = nodes.iter().find(|n| &name_of(n) == name).and_then(|n| n.pointer("/status/allocatable"));
        out.push_str(&format!("{name}\t{cpu}m\t"));
        if let Some(a) = alloc.filter(|a| a.get("cpu").is_some()) {
            let total = milli(a.get("cpu"));
            out.push_str(&format!("{}%\t", percent(*cpu, total)));
        }
        out.push_str(&format!("{}Mi\t", mem / (1024 * 1024)));
        if let Some(a) = alloc.filter(|a| a.get("memory").is_some()) {
            let (_, total) = usage(Some(a));
            out.push_str(&format!("{}%\t", percent(*mem, total)));
        }
        out.push('\n');
    }
    for n in nodes {
        let name = name_of(n);
        if !rows.iter().any(|(r, _, _)| *r == name) {
            out.push_str(&format!("{name}\t<unknown>\t<unknown>\t<unknown>\t<unknown>\t\n"));
        }
    }
    out
}

fn percent(used: i64, total: i64) -> i64 {
    if total <= 0 {
        return 0;
    }
    (used as f64 / total as f64 * 100.0) as i64
}

fn sort_rows(rows: &mut [(String, i64, i64)], sort_by: Option<&str>) {
    match sort_by {
        Some("cpu") => rows.sort_by_key(|r| std::cmp::Reverse(r.1)),
        Some("memory") => rows.sort_by_key(|r| std::cmp::Reverse(r.2)),
        _ => rows.sort_by(|a, b| a.0.cmp(&b.0)),
    }
}

/// (namespace, name, cpu millicores, memory bytes, per container (name, cpu, memory)).
type PodRow = (String, String, i64, i64, Vec<(String, i64, i64)>);

/// The `kubectl top pod` table: a pod's usage is the sum of its containers'.
pub fn pod_table(
    metrics: &[Value],
    all_namespaces: bool,
    containers: bool,
    no_headers: bool,
    sort_by: Option<&str>,
) -> String {
    let mut pods: Vec<PodRow> = metrics
        .iter()
        .map(|m| {
            let cs: Vec<(String, i64, i64)> = m
                .get("containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| {
                    let (cpu, mem) = usage(c.get("usage"));
                    (c.get("name").and_then(Value::as_str).unwrap_or_default().to_string(), cpu, mem)
                })
                .collect();
            let ns = m.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_string();
            (ns, name_of(m), cs.iter().map(|c| c.1).sum(), cs.iter().map(|c| c.2).sum(), cs)
        })
        .collect();
    match sort_by {
        Some("cpu") => pods.sort_by_key(|p| std::cmp::Reverse(p.2)),
        Some("memory") => pods.sort_by_key(|p| std::cmp::Reverse(p.3)),
        _ => pods.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1))),
    }
    let mut out = String::new();
    if !no_headers {
        if all_namespaces {
            out.push_str("NAMESPACE\t");
        }
        if containers {
            out.push_str("POD\t");
        }
        out.push_str("NAME\tCPU(cores)\tMEMORY(bytes)\t\n");
    }
    for (ns, name, cpu, mem, cs) in &pods {
        let lines: Vec<(String, i64, i64)> = if containers { cs.clone() } else { vec![(name.clone(), *cpu, *mem)] };
        for (n, c, m) in lines {
            if all_namespaces {
                out.push_str(&format!("{ns}\t"));
            }
            if containers {
                out.push_str(&format!("{name}\t"));
            }
            out.push_str(&format!("{n}\t{c}m\t{}Mi\t\n", m / (1024 * 1024)));
        }
    }
    out
}

async fn metrics_available(ctx: &Ctx) -> Result<bool> {
    let groups = ctx.get("/apis").await?;
    Ok(groups.get("groups").and_then(Value::as_array).into_iter().flatten().any(|g| {
        g.get("name").and_then(Value::as_str) == Some("metrics.k8s.io")
            && g.get("versions").and_then(Value::as_array).into_iter().flatten().any(|v| v["version"] == "v1beta1")
    }))
}

fn sort_flag(s: &Option<String>) -> Result<Option<&str>> {
    match s.as_deref() {
        None | Some("") => Ok(None),
        Some(v @ ("cpu" | "memory")) => Ok(Some(v)),
        Some(other) => Err(KubectlError::msg(format!("--sort-by accepts only cpu or memory, got {other:?}"))),
    }
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    if !metrics_available(ctx).await? {
        return Err(KubectlError::msg("Metrics API not available"));
    }
    match &a.what {
        What::Node(n) => {
            let sort = sort_flag(&n.sort_by)?;
            let sel = n.selector.clone().unwrap_or_default();
            let (metrics, nodes) = match &n.name {
                Some(name) => (
                    vec![ctx.get(&format!("/apis/metrics.k8s.io/v1beta1/nodes/{name}")).await?],
                    vec![ctx.get(&format!("/api/v1/nodes/{name}")).await?],
                ),
                None => {
                    let m = ctx
                        .get(&with_query("/apis/metrics.k8s.io/v1beta1/nodes", &[("labelSelector", sel.clone())]))
                        .await?;
                    let nodes = ctx.get(&with_query("/api/v1/nodes", &[("labelSelector", sel)])).await?;
                    (items(&m), items(&nodes))
                }
            };
            if metrics.is_empty() {
                return Err(KubectlError::msg("metrics not available yet"));
            }
            print!("{}", tabwrite(&node_table(&metrics, &nodes, n.no_headers, sort), 3));
        }
        What::Pod(p) => {
            let sort = sort_flag(&p.sort_by)?;
            let sel = p.selector.clone().unwrap_or_default();
            let ns = &ctx.namespace;
            let metrics = match &p.name {
                Some(name) => {
                    vec![ctx.get(&format!("/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{name}")).await?]
                }
                None => {
                    let path = if p.all_namespaces {
                        "/apis/metrics.k8s.io/v1beta1/pods".to_string()
                    } else {
                        format!("/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods")
                    };
                    items(&ctx.get(&with_query(&path, &[("labelSelector", sel.clone())])).await?)
                }
            };
            if metrics.is_empty() {
                // Pods without metrics yet, or no pods at all.
                let pods_path =
                    if p.all_namespaces { "/api/v1/pods".to_string() } else { format!("/api/v1/namespaces/{ns}/pods") };
                let pods = ctx.get(&with_query(&pods_path, &[("labelSelector", sel), ("limit", "1".into())])).await?;
                if !items(&pods).is_empty() {
                    return Err(KubectlError::msg("metrics not available yet"));
                }
                if p.all_namespaces {
                    eprintln!("No resources found");
                } else {
                    eprintln!("No resources found in {ns} namespace.");
                }
                return Ok(());
            }
            print!("{}", tabwrite(&pod_table(&metrics, p.all_namespaces, p.containers, p.no_headers, sort), 3));
        }
    }
    Ok(())
}

fn items(list: &Value) -> Vec<Value> {
    list.get("items").and_then(Value::as_array).cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_lines_as_kubectl_prints_them() {
        let metrics = vec![
            json!({"metadata": {"name": "n2"}, "usage": {"cpu": "1500000n", "memory": "2Gi"}}),
            json!({"metadata": {"name": "n1"}, "usage": {"cpu": "250m", "memory": "1536Ki"}}),
        ];
        let nodes = vec![
            json!({"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "2", "memory": "4Gi"}}}),
            json!({"metadata": {"name": "n2"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}),
            json!({"metadata": {"name": "n3"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}),
        ];
        let t = tabwrite(&node_table(&metrics, &nodes, false, None), 3);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "NAME   CPU(cores)   CPU(%)      MEMORY(bytes)   MEMORY(%)   ");
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["n1", "250m", "12%", "1Mi", "0%"]);
        assert_eq!(lines[2].split_whitespace().collect::<Vec<_>>(), ["n2", "2m", "0%", "2048Mi", "25%"]);
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["n3", "<unknown>", "<unknown>", "<unknown>", "<unknown>"]
        );
        let by_mem = node_table(&metrics, &nodes, true, Some("memory"));
        assert!(by_mem.starts_with("n2\t"), "{by_mem}");
    }

    #[test]
    fn pod_lines_sum_containers() {
        let metrics = vec![json!({"metadata": {"name": "p", "namespace": "d"}, "containers": [
            {"name": "a", "usage": {"cpu": "100m", "memory": "10Mi"}},
            {"name": "b", "usage": {"cpu": "1m", "memory": "1Mi"}}]})];
        assert_eq!(
            pod_table(&metrics, false, false, false, None),
            "NAME\tCPU(cores)\tMEMORY(bytes)\t\np\t101m\t11Mi\t\n"
        );
        assert_eq!(pod_table(&metrics, true, true, true, None), "d\tp\ta\t100m\t10Mi\t\nd\tp\tb\t1m\t1Mi\t\n");
        assert_eq!(milli(Some(&json!("1234567n"))), 2);
    }
}
