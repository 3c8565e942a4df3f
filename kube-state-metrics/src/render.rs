//! The Prometheus text format (version 0.0.4) as this exporter writes it, and the small
//! vocabulary every kind's module builds on.
//!
//! A kind describes its metric families once, as a list of [`Gen`]erators: a family's
//! name, HELP text, type and stability, and a function from one object to that family's
//! series. [`families`] runs the generators over a kind's objects (sorted by namespace and
//! name, so the text is deterministic) and prefixes each series with the object's own
//! labels (`namespace`, `pod`, …). [`write`] renders the families: HELP and TYPE for every
//! family of a kind that has at least one object, even a family without series, as the
//! upstream exporter does; nothing at all for a kind without objects.

use common::exposition::{Kind, Writer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

/// A family's type, as the TYPE line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Gauge,
    Counter,
}

/// How settled a family's name and labels are. Upstream prefixes the HELP text of stable
/// families with `[STABLE]`; alpha families carry no marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    Alpha,
    Stable,
}

/// What a family is: everything its HELP and TYPE lines say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Type,
    pub stability: Stability,
}

/// One series of a family: its labels in order, then its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

impl Series {
    /// A series with only the object's labels.
    pub fn value(value: f64) -> Series {
        Series { labels: Vec::new(), value }
    }

    /// A series with `labels` after the object's.
    pub fn with(labels: &[(&'static str, &str)], value: f64) -> Series {
        Series { labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(), value }
    }
}

/// A family and its series, ready to be written.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub desc: Desc,
    pub series: Vec<Series>,
}

/// One family of a kind: its description and how an object becomes series.
pub struct Gen<K> {
    pub desc: Desc,
    pub series: fn(&K) -> Vec<Series>,
}

/// Shorthands for a kind's generator lists.
pub fn gauge<K>(name: &'static str, help: &'static str, series: fn(&K) -> Vec<Series>) -> Gen<K> {
    Gen { desc: Desc { name, help, kind: Type::Gauge, stability: Stability::Stable }, series }
}

/// An alpha gauge (no `[STABLE]` in its HELP).
pub fn alpha<K>(name: &'static str, help: &'static str, series: fn(&K) -> Vec<Series>) -> Gen<K> {
    Gen { desc: Desc { name, help, kind: Type::Gauge, stability: Stability::Alpha }, series }
}

/// A stable counter.
pub fn counter<K>(name: &'static str, help: &'static str, series: fn(&K) -> Vec<Series>) -> Gen<K> {
    Gen { desc: Desc { name, help, kind: Type::Counter, stability: Stability::Stable }, series }
}

/// Run `gens` over `objects`: one family per generator, in the generators' order; within
/// a family, the objects sorted by namespace and name, each series prefixed by
/// `own_labels(object)`. No families at all when there are no objects.
pub fn families<K, F>(objects: &[&K], gens: &[Gen<K>], own_labels: F) -> Vec<Family>
where
    K: k8s_openapi::Metadata<Ty = ObjectMeta>,
    F: Fn(&K) -> Vec<(&'static str, String)>,
{
    if objects.is_empty() {
        return Vec::new();
    }
    let mut sorted: Vec<&K> = objects.to_vec();
    sorted.sort_by(|a, b| {
        let key = |o: &K| (o.metadata().namespace.clone(), o.metadata().name.clone());
        key(a).cmp(&key(b))
    });
    let own: Vec<Vec<(&'static str, String)>> = sorted.iter().map(|o| own_labels(o)).collect();
    gens.iter()
        .map(|g| {
            let mut series = Vec::new();
            for (o, own) in sorted.iter().zip(&own) {
                for s in (g.series)(o) {
                    let mut labels = own.clone();
                    labels.extend(s.labels);
                    series.push(Series { labels, value: s.value });
                }
            }
            Family { desc: g.desc, series }
        })
        .collect()
}

/// Append `families` to `out` in the text format (through the project's one writer,
/// `common::exposition`).
pub fn write(out: &mut String, families: &[Family]) {
    let mut w = Writer::new();
    for f in families {
        let d = &f.desc;
        let kind = match d.kind {
            Type::Gauge => Kind::Gauge,
            Type::Counter => Kind::Counter,
        };
        if d.stability == Stability::Stable {
            w.family(d.name, &format!("[STABLE] {}", d.help), kind);
        } else {
            w.family(d.name, d.help, kind);
        }
        for s in &f.series {
            let labels: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            w.sample(d.name, &labels, s.value, None);
        }
    }
    out.push_str(&w.finish());
}

// Conventions shared by the kinds.

/// 1 for true, 0 for false.
pub fn bool_value(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Seconds since the epoch of an API timestamp.
pub fn unix(t: &Time) -> f64 {
    t.0.as_second() as f64
}

/// One series of value `unix(t)` when `t` is set, none otherwise.
pub fn timestamp(t: Option<&Time>) -> Vec<Series> {
    t.map(|t| vec![Series::value(unix(t))]).unwrap_or_default()
}

/// One series of `v` when it is set, none otherwise.
pub fn optional<N: Into<f64>>(v: Option<N>) -> Vec<Series> {
    v.map(|v| vec![Series::value(v.into())]).unwrap_or_default()
}

/// One series of `v`.
pub fn one<N: Into<f64>>(v: N) -> Vec<Series> {
    vec![Series::value(v.into())]
}

/// A condition's status as three series, `true`, `false`, `unknown`, the current one 1.
/// `prefix` comes before the status label (`condition` name, `reason`, …); `status_label`
/// is `status` for most kinds and `condition` where upstream names it so.
pub fn condition_series(prefix: &[(&'static str, &str)], status_label: &'static str, status: &str) -> Vec<Series> {
    ["true", "false", "unknown"]
        .into_iter()
        .map(|s| {
            let mut labels: Vec<(&'static str, &str)> = prefix.to_vec();
            labels.push((status_label, s));
            Series::with(&labels, bool_value(status.eq_ignore_ascii_case(s)))
        })
        .collect()
}

/// `kube_*_owner` series: one per owner reference with `owner_kind`, `owner_name` and
/// `owner_is_controller`, or one of empty values when there is none.
pub fn owner_series(owners: Option<&Vec<OwnerReference>>) -> Vec<Series> {
    match owners {
        Some(owners) if !owners.is_empty() => owners
            .iter()
            .map(|o| {
                let controller = if o.controller == Some(true) { "true" } else { "false" };
                Series::with(
                    &[("owner_kind", &o.kind), ("owner_name", &o.name), ("owner_is_controller", controller)],
                    1.0,
                )
            })
            .collect(),
        _ => vec![Series::with(&[("owner_kind", ""), ("owner_name", ""), ("owner_is_controller", "")], 1.0)],
    }
}

/// The object's name and namespace (empty when unset).
pub fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// See [`name_of`].
pub fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_written_with_their_labels() {
        let f = Family {
            desc: Desc { name: "x", help: "line\\one\ntwo \"q\"", kind: Type::Gauge, stability: Stability::Alpha },
            series: vec![Series::with(&[("k", "v\"1"), ("j", "")], 2.0)],
        };
        let mut out = String::new();
        write(&mut out, &[f]);
        assert_eq!(out, "# HELP x line\\\\one\\ntwo \"q\"\n# TYPE x gauge\nx{k=\"v\\\"1\",j=\"\"} 2\n");
    }

    #[test]
    fn stable_help_and_bare_series() {
        let f = Family {
            desc: Desc { name: "y_total", help: "h", kind: Type::Counter, stability: Stability::Stable },
            series: vec![Series::value(3.0)],
        };
        let mut out = String::new();
        write(&mut out, &[f]);
        assert_eq!(out, "# HELP y_total [STABLE] h\n# TYPE y_total counter\ny_total 3\n");
    }

    #[test]
    fn conditions_and_owners() {
        let s = condition_series(&[("condition", "Ready")], "status", "True");
        assert_eq!(s.iter().map(|s| s.value).collect::<Vec<_>>(), [1.0, 0.0, 0.0]);
        assert_eq!(s[2].labels, [("condition", "Ready".to_string()), ("status", "unknown".to_string())]);
        let none = owner_series(None);
        assert_eq!(none[0].labels.len(), 3);
        assert!(none[0].labels.iter().all(|(_, v)| v.is_empty()));
    }
}
