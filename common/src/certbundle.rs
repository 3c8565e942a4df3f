//! The certificates every control-plane machine of a cluster shares, sealed for the trip to
//! a joining one (kubeadm's `--upload-certs` and `--certificate-key`): the files
//! ([`crate::pki::SHARED_FILES`]) are encrypted with AES-256-GCM under a 32-byte key that
//! only the join command carries, and stored in a Secret that a bootstrap token may read.
//! Whoever reads the Secret without the key learns nothing; a wrong key or a changed blob
//! fails to open instead of yielding wrong files.

use std::collections::BTreeMap;

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

/// What the sealed text says it is, authenticated with it (so a blob of another kind or
/// version does not open as this one).
const AAD: &[u8] = b"minik8s control-plane certificates v1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BundleError {
    #[error("the certificate key is 64 hexadecimal digits (32 bytes), as the join command prints it")]
    BadKey,
    #[error("the sealed certificates are not base64 of a nonce and a ciphertext")]
    Malformed,
    #[error("the certificate key does not open the cluster's certificates (wrong key, or they were uploaded again with a new one)")]
    WrongKey,
    #[error("a file name {0:?} that is not one of the shared certificates")]
    UnexpectedFile(String),
}

/// A new random key, as the 64 hex digits the join command carries.
pub fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn key(hex: &str) -> Result<LessSafeKey, BundleError> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BundleError::BadKey);
    }
    let bytes: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| BundleError::BadKey)?;
    UnboundKey::new(&AES_256_GCM, &bytes).map(LessSafeKey::new).map_err(|_| BundleError::BadKey)
}

/// `files` (name → contents) sealed under `hex_key`: base64 of a random nonce followed by
/// the ciphertext and its tag.
pub fn seal(files: &BTreeMap<String, String>, hex_key: &str) -> Result<String, BundleError> {
    let key = key(hex_key)?;
    let nonce_bytes: [u8; NONCE_LEN] = rand::random();
    let mut data = serde_json::to_vec(files).map_err(|_| BundleError::Malformed)?;
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce_bytes), Aad::from(AAD), &mut data)
        .map_err(|_| BundleError::Malformed)?;
    let mut out = nonce_bytes.to_vec();
    out.extend_from_slice(&data);
    Ok(base64::engine::general_purpose::STANDARD.encode(out))
}

/// The files of a [`seal`]ed text, checked to be shared certificates only.
pub fn open(sealed: &str, hex_key: &str) -> Result<BTreeMap<String, String>, BundleError> {
    let key = key(hex_key)?;
    let raw = base64::engine::general_purpose::STANDARD.decode(sealed.trim()).map_err(|_| BundleError::Malformed)?;
    if raw.len() < NONCE_LEN {
        return Err(BundleError::Malformed);
    }
    let (nonce, rest) = raw.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| BundleError::Malformed)?;
    let mut data = rest.to_vec();
    let plain = key.open_in_place(nonce, Aad::from(AAD), &mut data).map_err(|_| BundleError::WrongKey)?;
    let files: BTreeMap<String, String> = serde_json::from_slice(plain).map_err(|_| BundleError::Malformed)?;
    if let Some(name) = files.keys().find(|n| !crate::pki::SHARED_FILES.contains(&n.as_str())) {
        return Err(BundleError::UnexpectedFile(name.clone()));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> BTreeMap<String, String> {
        [("ca.crt", "CERT"), ("ca.key", "KEY"), ("etcd-ca.key", "EKEY")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn what_is_sealed_opens_with_its_key_only() {
        let k = new_key();
        assert_eq!(k.len(), 64);
        let sealed = seal(&files(), &k).unwrap();
        assert!(
            !sealed.contains("KEY")
                && !String::from_utf8_lossy(&base64::engine::general_purpose::STANDARD.decode(&sealed).unwrap())
                    .contains("EKEY")
        );
        assert_eq!(open(&sealed, &k).unwrap(), files());
        assert_ne!(seal(&files(), &k).unwrap(), sealed, "a fresh nonce each time");
        assert_eq!(open(&sealed, &new_key()), Err(BundleError::WrongKey));
    }

    #[test]
    fn bad_keys_and_tampered_or_foreign_blobs_are_refused() {
        let k = new_key();
        assert_eq!(seal(&files(), "abc"), Err(BundleError::BadKey));
        assert_eq!(open("x", &"zz".repeat(32)), Err(BundleError::BadKey));
        assert_eq!(open("%%%", &k), Err(BundleError::Malformed));
        assert_eq!(open("AAAA", &k), Err(BundleError::Malformed));
        let mut raw = base64::engine::general_purpose::STANDARD.decode(seal(&files(), &k).unwrap()).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        assert_eq!(open(&base64::engine::general_purpose::STANDARD.encode(raw), &k), Err(BundleError::WrongKey));
        let mut other = files();
        other.insert("../../etc/passwd".into(), "x".into());
        let sealed = seal(&other, &k).unwrap();
        assert_eq!(open(&sealed, &k), Err(BundleError::UnexpectedFile("../../etc/passwd".into())));
    }
}
