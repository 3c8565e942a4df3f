//! Durations as Kubernetes writes and reads them: the short human form of AGE columns
//! (`k8s.io/apimachinery/pkg/util/duration.HumanDuration`: "5s", "3m20s", "4h", "2d", "3y"),
//! and Go's `time.ParseDuration` syntax that flags and API fields take ("5m", "1h30m",
//! "500ms") — the one parser every binary uses.

use std::time::Duration;

/// Go's duration syntax: a sequence of decimal numbers with units (`ns`, `us`/`µs`, `ms`,
/// `s`, `m`, `h`), e.g. `5m`, `1h30m`, `1.5s`, `500ms`; `0` alone; a unit is required.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("invalid duration {s:?}"));
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            "" => return Err(format!("missing unit in duration {s:?}")),
            u => return Err(format!("unknown unit {u:?} in duration {s:?}")),
        };
        total += n * factor;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// [`parse_go_duration`], or a bare number of seconds (`30`, `1.5`): what the flags that
/// have always also taken plain seconds accept.
pub fn parse_seconds_or_go_duration(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(n) if n >= 0.0 && n.is_finite() => Ok(Duration::from_secs_f64(n)),
        _ => parse_go_duration(s),
    }
}

/// Format a number of seconds the way `duration.HumanDuration` does.
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let mins = secs / 60;
    if mins < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{mins}m") } else { format!("{mins}m{s}s") };
    }
    if mins < 180 {
        return format!("{mins}m");
    }
    let hours = mins / 60;
    if hours < 8 {
        let m = mins % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if days < 8 {
        let h = hours % 24;
        return if h == 0 { format!("{days}d") } else { format!("{days}d{h}h") };
    }
    if days < 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if years < 8 {
        let d = days % 365;
        return if d == 0 { format!("{years}y") } else { format!("{years}y{d}d") };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations() {
        assert_eq!(human_duration(-3), "0s");
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(10 * 3600), "10h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(100 * 86400), "100d");
        assert_eq!(human_duration(800 * 86400), "2y70d");
        assert_eq!(human_duration(3000 * 86400), "8y");
    }
}
