//! The Prometheus text exposition format (`text/plain; version=0.0.4`), written directly
//! for exporters whose series are computed at scrape time from state they already hold
//! (the kubelet's container metrics, kube-state-metrics): registering and unregistering a
//! metric object per container or per API object would cost more than the numbers.
//!
//! A [`Writer`] takes families one at a time: `family` writes the `# HELP` and `# TYPE`
//! lines, `sample` one series. Label values are escaped as the format requires (backslash,
//! double quote, newline); help texts escape backslash and newline.

use std::fmt::Write as _;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// Text being written.
#[derive(Default)]
pub struct Writer {
    out: String,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// Start a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = write!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        self
    }

    /// One sample of the family started last: `name{labels} value [timestamp_ms]`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64, timestamp_ms: Option<i64>) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape_label_value(&mut self.out, v);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        self.out.push_str(&format_value(value));
        if let Some(ts) = timestamp_ms {
            let _ = write!(self.out, " {ts}");
        }
        self.out.push('\n');
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A value as Go's Prometheus client writes it: the shortest `%g` — fixed notation for
/// decimal exponents from -4 to 5, otherwise `d.ddde+XX` (so a Unix timestamp reads
/// `1.7e+09`, 128 MiB `1.34217728e+08`).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` is the shortest representation that reads back the same, like Go's.
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((e.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut out = String::with_capacity(24);
    if negative {
        out.push('-');
    }
    if !(-4..6).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.unsigned_abs());
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', int_len - digits.len()));
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
        out.push_str(&digits);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut w = Writer::new();
        w.family("kube_pod_info", "Information about pod.\nSecond line \\ here", Kind::Gauge)
            .sample("kube_pod_info", &[("namespace", "default"), ("pod", "a\"b\\c\nd")], 1.0, None)
            .family("container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", Kind::Counter)
            .sample("container_cpu_usage_seconds_total", &[("cpu", "total")], 1.25, Some(1_700_000_000_123))
            .sample("up", &[], f64::INFINITY, None)
            .sample("x", &[], 1_700_000_000.0, None);
        assert_eq!(
            w.finish(),
            "# HELP kube_pod_info Information about pod.\\nSecond line \\\\ here\n\
             # TYPE kube_pod_info gauge\n\
             kube_pod_info{namespace=\"default\",pod=\"a\\\"b\\\\c\\nd\"} 1\n\
             # HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{cpu=\"total\"} 1.25 1700000000123\n\
             up +Inf\n\
             x 1.7e+09\n"
        );
    }

    #[test]
    fn values_print_as_go_does() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (0.25, "0.25"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (100.0, "100"),
            (999999.0, "999999"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (1_700_000_000.0, "1.7e+09"),
            (1_712_345_678.0, "1.712345678e+09"),
            (134217728.0, "1.34217728e+08"),
            (-2.5, "-2.5"),
            (1e21, "1e+21"),
            (1.5e-7, "1.5e-07"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
        ];
        for (v, want) in cases {
            assert_eq!(format_value(*v), *want, "{v}");
        }
    }
}
