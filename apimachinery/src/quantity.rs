//! Kubernetes resource quantities (`100m`, `1.5`, `128Mi`, `1e3`, `2G`) as numbers.
//!
//! Callers decide the unit and rounding they count in; these functions only read the
//! notation. Kubernetes keeps exact decimals; a float is precise enough for everything
//! here (scheduling sums, `kubectl top`, Docker limits).

/// A quantity in base units: `250m` → 0.25, `1Ki` → 1024, `1e3` → 1000. `None` when the
/// text is not a quantity.
pub fn parse(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with('e') || e.starts_with('E') => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(num * mult)
}

/// `Quantity.Value()`: whole base units, rounded up; 0 for text that is not a quantity.
pub fn value(s: &str) -> i64 {
    parse(s).map(|v| (v - 1e-9).ceil() as i64).unwrap_or(0)
}

/// `Quantity.MilliValue()`: thousandths of a base unit, rounded up; 0 for text that is not
/// a quantity.
pub fn milli_value(s: &str) -> i64 {
    parse(s).map(|v| (v * 1000.0 - 1e-6).ceil() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notation() {
        assert_eq!(parse("250m"), Some(0.25));
        assert_eq!(parse("1Ki"), Some(1024.0));
        assert_eq!(parse("128Mi"), Some(128.0 * 1024.0 * 1024.0));
        assert_eq!(parse("2G"), Some(2e9));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse(" 1.5 "), Some(1.5));
        assert_eq!(parse(""), None);
        assert_eq!(parse("12Q"), None);
        assert_eq!(parse("abc"), None);
    }

    #[test]
    fn rounding_is_up_like_kubernetes() {
        assert_eq!(milli_value("100m"), 100);
        assert_eq!(milli_value("0.5"), 500);
        assert_eq!(milli_value("1n"), 1);
        assert_eq!(milli_value("2"), 2000);
        assert_eq!(value("1.2"), 2);
        assert_eq!(value("64Mi"), 67108864);
        assert_eq!(value("1500m"), 2);
        assert_eq!(value("nonsense"), 0);
    }
}
