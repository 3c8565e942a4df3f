//! `resourceVersion` as clients send it — in query parameters (`?resourceVersion=`), in
//! bodies (`metadata.resourceVersion` as a precondition) — parsed in one place: the decimal
//! storage revision, or nothing when empty.

use storage::Revision;

use crate::error::{ApiError, ApiResult};

/// `""` → None; a non-negative integer → that revision; anything else → 400.
pub fn parse(s: &str) -> ApiResult<Option<Revision>> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<Revision>()
        .ok()
        .filter(|r| *r >= 0)
        .map(Some)
        .ok_or_else(|| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

/// The 504 for a resourceVersion the store has not reached (Kubernetes' wording).
pub fn too_large(requested: Revision, current: Revision) -> ApiError {
    ApiError::timeout(format!("Too large resource version: {requested}, current: {current}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_parse_and_bad_ones_are_a_400() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("0").unwrap(), Some(0));
        assert_eq!(parse("42").unwrap(), Some(42));
        for bad in ["-1", "x", "1.5", " 1"] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
            assert!(e.message.contains("invalid resource version"), "{}", e.message);
        }
        assert_eq!(too_large(9, 3).code, 504);
    }
}
