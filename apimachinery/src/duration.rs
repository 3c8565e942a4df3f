//! Kubernetes' short human durations (`k8s.io/apimachinery/pkg/util/duration.HumanDuration`),
//! as printed in AGE columns: "5s", "3m20s", "4h", "2d", "3y".

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
