//! Kubernetes' rules for names, label keys and label values, as pure functions (the
//! apiserver validates objects with them; label selectors check their keys and values).
//!
//! Each `*_errors` function returns `None` when the value is valid, otherwise the message
//! Kubernetes gives (without the field path, which the caller adds).

pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
pub const DNS1123_LABEL_MAX: usize = 63;

fn is_alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

/// RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn dns1123_label_errors(s: &str) -> Option<String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    if !is_label(s) {
        return Some("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".into());
    }
    None
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn dns1123_subdomain_errors(s: &str) -> Option<String> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!("must be no more than {DNS1123_SUBDOMAIN_MAX} characters"));
    }
    if s.is_empty() || !s.split('.').all(is_label) {
        return Some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into());
    }
    None
}

/// RFC 1035 label: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters (Service names).
pub fn dns1035_label_errors(s: &str) -> Option<String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!("must be no more than {DNS1123_LABEL_MAX} characters"));
    }
    if !is_label(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        return Some("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".into());
    }
    None
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Qualified name (label and annotation keys): `[prefix/]name`.
pub fn qualified_name_errors(s: &str) -> Option<String> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("prefix part must be non-empty".into());
        }
        if let Some(m) = dns1123_subdomain_errors(p) {
            return Some(format!("prefix part {m}"));
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Some("name part must be no more than 63 characters".into());
    }
    if !is_qualified_name_part(name) {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

/// Label values: empty, or at most 63 characters of `[A-Za-z0-9_.-]` starting and ending
/// alphanumerically.
pub fn label_value_errors(s: &str) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    if !is_qualified_name_part(s) {
        return Some("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into());
    }
    None
}
