//! Profiles from flags and from a `KubeSchedulerConfiguration` file (`--config`): the
//! subset MiniK8s honours is `percentageOfNodesToScore`, `parallelism` (binding
//! concurrency), `leaderElection.leaderElect`, and per profile `schedulerName` with
//! `plugins.{multiPoint,filter,score}.{enabled,disabled}` (score weights included).
//!
//! The simple placement policies are always available as the profiles `round-robin`,
//! `random` and `node-affinity-first`; `--profile` (or a config profile named after a
//! policy) makes `default-scheduler` use one of them.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::framework::{Algorithm, Profile, DEFAULT_SCORES, FILTERS};

pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
pub const POLICIES: &[&str] = &["round-robin", "random", "node-affinity-first"];

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeSchedulerConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub percentage_of_nodes_to_score: Option<u32>,
    pub parallelism: Option<usize>,
    pub leader_election: Option<LeaderElection>,
    pub profiles: Vec<ProfileConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LeaderElection {
    pub leader_elect: Option<bool>,
    pub resource_name: Option<String>,
    pub resource_namespace: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProfileConfig {
    pub scheduler_name: Option<String>,
    pub percentage_of_nodes_to_score: Option<u32>,
    pub plugins: Plugins,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Plugins {
    pub multi_point: PluginSet,
    pub filter: PluginSet,
    pub score: PluginSet,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PluginSet {
    pub enabled: Vec<PluginRef>,
    pub disabled: Vec<PluginRef>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PluginRef {
    pub name: String,
    pub weight: Option<i64>,
}

/// The scheduler's profiles by `schedulerName`.
#[derive(Debug, Clone)]
pub struct Profiles {
    pub by_name: BTreeMap<String, Profile>,
    pub parallelism: usize,
}

impl Profiles {
    pub fn get(&self, scheduler_name: &str) -> Option<&Profile> {
        self.by_name.get(scheduler_name)
    }
}

fn apply_plugins(p: &mut Profile, plugins: &Plugins) -> anyhow::Result<()> {
    let known_score = |n: &str| DEFAULT_SCORES.iter().any(|(s, _)| *s == n);
    let known_filter = |n: &str| FILTERS.contains(&n);
    for (set, filters, scores) in
        [(&plugins.multi_point, true, true), (&plugins.filter, true, false), (&plugins.score, false, true)]
    {
        for d in &set.disabled {
            if filters {
                p.filters.retain(|f| d.name != "*" && *f != d.name);
            }
            if scores {
                p.scores.retain(|(s, _)| d.name != "*" && *s != d.name);
            }
        }
        for e in &set.enabled {
            let mut known = false;
            if filters && known_filter(&e.name) {
                known = true;
                if !p.filters.contains(&e.name) {
                    p.filters.push(e.name.clone());
                }
            }
            if scores && known_score(&e.name) {
                known = true;
                let default = DEFAULT_SCORES.iter().find(|(s, _)| *s == e.name).map(|(_, w)| *w).unwrap_or(1);
                let w = e.weight.unwrap_or(default);
                match p.scores.iter_mut().find(|(s, _)| *s == e.name) {
                    Some(entry) => entry.1 = w,
                    None => p.scores.push((e.name.clone(), w)),
                }
            }
            if !known && !["PrioritySort", "DefaultBinder", "DefaultPreemption", "QueueSort"].contains(&e.name.as_str())
            {
                bail!("profile {:?}: unknown plugin {:?}", p.scheduler_name, e.name);
            }
        }
    }
    Ok(())
}

/// Build the profiles from an optional configuration file and the `--profile` flag (the
/// algorithm `default-scheduler` uses).
pub fn build(config: Option<&KubeSchedulerConfiguration>, default_algorithm: Option<&str>) -> anyhow::Result<Profiles> {
    let mut by_name = BTreeMap::new();
    let pct = config.and_then(|c| c.percentage_of_nodes_to_score).unwrap_or(0);
    if pct > 100 {
        bail!("percentageOfNodesToScore must be between 0 and 100, got {pct}");
    }
    let default_algo = match default_algorithm {
        None => Algorithm::FilterScore,
        Some(s) => Algorithm::parse(s).with_context(|| {
            format!("unknown --profile {s:?}: use default-scheduler, round-robin, random or node-affinity-first")
        })?,
    };
    let mut d = Profile::new(DEFAULT_SCHEDULER, default_algo);
    d.percentage_of_nodes_to_score = pct;
    by_name.insert(DEFAULT_SCHEDULER.to_string(), d);
    for name in POLICIES {
        let mut p = Profile::new(name, Algorithm::parse(name).unwrap_or(Algorithm::FilterScore));
        p.percentage_of_nodes_to_score = pct;
        by_name.insert(name.to_string(), p);
    }
    if let Some(cfg) = config {
        if !cfg.profiles.is_empty() {
            by_name.remove(DEFAULT_SCHEDULER);
        }
        for pc in &cfg.profiles {
            let name = pc.scheduler_name.clone().unwrap_or_else(|| DEFAULT_SCHEDULER.into());
            let algo = if name == DEFAULT_SCHEDULER {
                default_algo
            } else {
                Algorithm::parse(&name).unwrap_or(Algorithm::FilterScore)
            };
            let mut p = Profile::new(&name, algo);
            p.percentage_of_nodes_to_score = pc.percentage_of_nodes_to_score.unwrap_or(pct);
            apply_plugins(&mut p, &pc.plugins)?;
            by_name.insert(name, p);
        }
    }
    // Bindings in flight: 4 × `parallelism` (kube-scheduler binds in unbounded goroutines;
    // `parallelism` there sizes the filter/score worker pool, which a decision here does not need).
    Ok(Profiles { by_name, parallelism: 4 * config.and_then(|c| c.parallelism).unwrap_or(16).max(1) })
}

pub fn parse(text: &str) -> anyhow::Result<KubeSchedulerConfiguration> {
    let cfg: KubeSchedulerConfiguration = serde_yaml::from_str(text).context("parsing KubeSchedulerConfiguration")?;
    if let Some(kind) = &cfg.kind {
        if kind != "KubeSchedulerConfiguration" {
            bail!("config kind is {kind:?}, want KubeSchedulerConfiguration");
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_have_all_profiles() {
        let p = build(None, None).unwrap();
        assert_eq!(
            p.by_name.keys().cloned().collect::<Vec<_>>(),
            vec!["default-scheduler", "node-affinity-first", "random", "round-robin"]
        );
        assert_eq!(p.get("default-scheduler").unwrap().algorithm, Algorithm::FilterScore);
        let rr = build(None, Some("round-robin")).unwrap();
        assert_eq!(rr.get("default-scheduler").unwrap().algorithm, Algorithm::RoundRobin);
        assert!(build(None, Some("nope")).is_err());
    }

    #[test]
    fn config_file_profiles_and_plugins() {
        let cfg = parse(
            r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 50
profiles:
- schedulerName: default-scheduler
- schedulerName: no-scoring
  plugins:
    score:
      disabled: [{name: "*"}]
      enabled: [{name: NodeResourcesFit, weight: 5}]
    filter:
      disabled: [{name: NodePorts}]
"#,
        )
        .unwrap();
        let p = build(Some(&cfg), None).unwrap();
        let ns = p.get("no-scoring").unwrap();
        assert_eq!(ns.scores, vec![("NodeResourcesFit".to_string(), 5)]);
        assert!(!ns.filters.contains(&"NodePorts".to_string()));
        assert_eq!(ns.percentage_of_nodes_to_score, 50);
        assert!(p.get("default-scheduler").is_some());
        assert!(parse("kind: Pod").is_err());
        assert!(
            build(Some(&parse("profiles: [{plugins: {score: {enabled: [{name: Bogus}]}}}]").unwrap()), None).is_err()
        );
    }
}
