//! Kubernetes' name suffixes, from one alphabet without vowels (no words by chance) and
//! without characters easily confused (`0`/`o`, `1`/`l`, `3`/`e`): the 5 random characters of
//! `generateName` (and of the pods a ReplicaSet names), and the hash encoding of
//! `pod-template-hash`.

use rand::Rng;

/// The characters of generated names.
pub const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The suffix `generateName` gets: 5 random characters of [`ALPHANUMS`].
pub fn random_suffix() -> String {
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHANUMS[rng.random_range(0..ALPHANUMS.len())] as char).collect()
}

/// Each byte of `s` as a character of [`ALPHANUMS`] (a hash's decimal digits become a name
/// part that cannot spell words).
pub fn safe_encode_string(s: &str) -> String {
    s.bytes().map(|b| ALPHANUMS[b as usize % ALPHANUMS.len()] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_five_characters_of_the_alphabet() {
        let seen: std::collections::HashSet<String> = (0..200).map(|_| random_suffix()).collect();
        for s in &seen {
            assert_eq!(s.len(), 5);
            assert!(s.bytes().all(|c| ALPHANUMS.contains(&c)), "{s}");
        }
        // 27^5 possibilities: 200 draws all but never collide.
        assert!(seen.len() > 190);
    }

    #[test]
    fn safe_encoding_is_kubernetes() {
        // '0' is byte 48: 48 % 27 = 21 → '4'; '9' is 57 → 3 → 'f'.
        assert_eq!(safe_encode_string("0123456789"), "456789bcdf");
        assert_eq!(safe_encode_string(""), "");
    }
}
