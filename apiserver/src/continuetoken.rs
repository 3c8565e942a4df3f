//! List continue tokens: the revision the first page was read at plus the key to start
//! from, so every page of one list is read from the same snapshot.

use base64::Engine;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    /// Always "meta.k8s.io/v1".
    pub v: String,
    pub rv: i64,
    /// The next key, relative to the list's prefix.
    pub start: String,
}

impl ContinueToken {
    pub fn new(rv: i64, start: impl Into<String>) -> Self {
        ContinueToken { v: "meta.k8s.io/v1".into(), rv, start: start.into() }
    }

    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    pub fn decode(s: &str) -> Result<Self, String> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .or_else(|_| base64::engine::general_purpose::STANDARD.decode(s))
            .map_err(|_| "continue key is not valid: illegal base64 data".to_string())?;
        let t: ContinueToken = serde_json::from_slice(&bytes).map_err(|e| format!("continue key is not valid: {e}"))?;
        if t.v != "meta.k8s.io/v1" {
            return Err(format!(
                "continue key is not valid: incorrect encoded start resourceVersion (version {})",
                t.v
            ));
        }
        if t.rv <= 0 {
            return Err(
                "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into()
            );
        }
        if t.start.is_empty() {
            return Err("continue key is not valid: encoded start key empty".into());
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = ContinueToken::new(42, "default/web-7\u{0}");
        let s = t.encode();
        assert_eq!(ContinueToken::decode(&s).unwrap(), t);
    }

    #[test]
    fn rejects_garbage() {
        assert!(ContinueToken::decode("!!!").is_err());
        assert!(ContinueToken::decode("e30").is_err()); // "{}"
        let bad = ContinueToken { v: "x".into(), rv: 1, start: "a".into() }.encode();
        assert!(ContinueToken::decode(&bad).is_err());
        let zero = ContinueToken::new(0, "a").encode();
        assert!(ContinueToken::decode(&zero).is_err());
    }
}
