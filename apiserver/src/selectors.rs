//! Label and field selectors: parsing (Kubernetes' string syntax) and matching. Pure.
//!
//! Label selectors are `apimachinery::labels`, the one implementation every component
//! shares; this module names them as the apiserver uses them and adds field selectors.

pub use apimachinery::labels::{labels_of, Selector as LabelSelector, SelectorError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    pub field: String,
    pub value: String,
    pub negate: bool,
}

/// A field selector: `metadata.name=x,status.phase!=Running`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector::default());
        }
        for part in split_unescaped(s, ',') {
            let (field, value, negate) = if let Some((f, v)) = split_op(&part, "!=") {
                (f, v, true)
            } else if let Some((f, v)) = split_op(&part, "==") {
                (f, v, false)
            } else if let Some((f, v)) = split_op(&part, "=") {
                (f, v, false)
            } else {
                return Err(SelectorError(format!("invalid selector: '{s}'; can't understand '{part}'")));
            };
            let field = field.trim().to_string();
            if field.is_empty() {
                return Err(SelectorError(format!("invalid selector: '{s}'; empty field name")));
            }
            requirements.push(FieldRequirement { field, value: unescape(&value), negate });
        }
        Ok(FieldSelector { requirements })
    }

    /// The value `metadata.name=<v>` pins, if any (lets a list read one key).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.requirements.iter().find(|r| r.field == field && !r.negate).map(|r| r.value.as_str())
    }

    /// Match using `get` to read a field's value as a string (None = unsupported field, which
    /// the caller has rejected before).
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let v = get(&r.field).unwrap_or_default();
            (v == r.value) != r.negate
        })
    }
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

/// Split at the first unescaped occurrence of `op`.
fn split_op(s: &str, op: &str) -> Option<(String, String)> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i..].starts_with(op) {
            // `=` must not be the second char of `!=` or `==`
            return Some((s[..i].to_string(), s[i + op.len()..].to_string()));
        }
        i += 1;
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse("metadata.name=x,status.phase!=Running").unwrap();
        assert_eq!(f.exact("metadata.name"), Some("x"));
        fn obj(name: &'static str, phase: &'static str) -> impl Fn(&str) -> Option<String> {
            move |field: &str| match field {
                "metadata.name" => Some(name.to_string()),
                "status.phase" => Some(phase.to_string()),
                _ => None,
            }
        }
        assert!(f.matches(obj("x", "Pending")));
        assert!(!f.matches(obj("x", "Running")));
        assert!(!f.matches(obj("y", "Pending")));
        let f = FieldSelector::parse("spec.nodeName==").unwrap();
        assert_eq!(f.requirements[0].value, "");
        let f = FieldSelector::parse(r"metadata.name=a\,b").unwrap();
        assert_eq!(f.requirements.len(), 1);
        assert_eq!(f.requirements[0].value, "a,b");
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
