//! The keys ServiceAccount tokens are signed and verified with: the private key of
//! `--service-account-signing-key-file` (PKCS#8 PEM, ECDSA P-256: tokens are ES256 JWTs) and
//! the public keys of `--service-account-key-file` (PEM `PUBLIC KEY`s, for tokens a previous
//! key signed); the signing key's own public half always verifies. Each key's id (`kid`) is
//! the unpadded base64url SHA-256 of its public key's DER, as Kubernetes computes it; the
//! JWKS document (`/openid/v1/jwks`) lists them.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The DER prefix of a P-256 public key (SubjectPublicKeyInfo: id-ecPublicKey, prime256v1,
/// an uncompressed point follows).
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce,
    0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
}

/// A public key that verifies tokens.
pub struct VerifyingKey {
    pub kid: String,
    key: DecodingKey,
    /// Its JWK (`/openid/v1/jwks`).
    pub jwk: Value,
}

/// Every key of the apiserver's ServiceAccount tokens.
pub struct Keys {
    signing: EncodingKey,
    signing_kid: String,
    verifying: Vec<VerifyingKey>,
}

/// A P-256 public key from its uncompressed point (65 bytes, 0x04 ‖ X ‖ Y).
fn verifying_key(point: &[u8]) -> Result<VerifyingKey, String> {
    if point.len() != 65 || point[0] != 4 {
        return Err("not an uncompressed ECDSA P-256 public key".into());
    }
    let mut der = P256_SPKI_PREFIX.to_vec();
    der.extend_from_slice(point);
    let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(&der));
    let (x, y) = (URL_SAFE_NO_PAD.encode(&point[1..33]), URL_SAFE_NO_PAD.encode(&point[33..]));
    let key = DecodingKey::from_ec_components(&x, &y).map_err(|e| e.to_string())?;
    let jwk = json!({"use": "sig", "kty": "EC", "kid": kid, "crv": "P-256", "alg": "ES256", "x": x, "y": y});
    Ok(VerifyingKey { kid, key, jwk })
}

impl Keys {
    /// Keys from PEM text: the signing key, then extra public keys.
    pub fn from_pem(signing_pem: &str, public_pems: &[&str]) -> Result<Keys, String> {
        let pair = rcgen::KeyPair::from_pem(signing_pem).map_err(|e| {
            format!("not a PKCS#8 private key ({e}); an ECDSA P-256 key is needed, e.g. `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`")
        })?;
        if pair.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
            return Err("only ECDSA P-256 signing keys are supported (ServiceAccount tokens are ES256)".into());
        }
        let signing = EncodingKey::from_ec_der(&pair.serialize_der());
        let own = verifying_key(pair.public_key_raw())?;
        let signing_kid = own.kid.clone();
        let mut verifying = vec![own];
        for pem_text in public_pems {
            for block in pem_blocks(pem_text)? {
                let point = block.strip_prefix(&P256_SPKI_PREFIX[..]).ok_or("a public key that is not ECDSA P-256")?;
                let k = verifying_key(point)?;
                if !verifying.iter().any(|v| v.kid == k.kid) {
                    verifying.push(k);
                }
            }
        }
        Ok(Keys { signing, signing_kid, verifying })
    }

    /// Keys from files, as the flags name them.
    pub fn load(signing_key_file: &Path, key_files: &[impl AsRef<Path>]) -> Result<Keys, KeyError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| KeyError::Read { path: p.display().to_string(), source })
        };
        let signing = read(signing_key_file)?;
        let mut publics = Vec::new();
        for f in key_files {
            let text = read(f.as_ref())?;
            // A private key file also names its public key (Kubernetes accepts both).
            let text = match rcgen::KeyPair::from_pem(&text) {
                Ok(pair) => pair.public_key_pem(),
                Err(_) => text,
            };
            publics.push((f.as_ref().display().to_string(), text));
        }
        let texts: Vec<&str> = publics.iter().map(|(_, t)| t.as_str()).collect();
        Keys::from_pem(&signing, &texts).map_err(|why| KeyError::Invalid {
            path: std::iter::once(signing_key_file.display().to_string())
                .chain(publics.iter().map(|(p, _)| p.clone()))
                .collect::<Vec<_>>()
                .join(", "),
            why,
        })
    }

    pub fn sign(&self, claims: &impl serde::Serialize) -> Result<String, String> {
        let mut header = jsonwebtoken::Header::new(Algorithm::ES256);
        header.kid = Some(self.signing_kid.clone());
        jsonwebtoken::encode(&header, claims, &self.signing).map_err(|e| e.to_string())
    }

    /// The keys to try for a token whose header names `kid` (all of them without one).
    pub fn candidates<'a>(&'a self, kid: Option<&'a str>) -> impl Iterator<Item = &'a DecodingKey> + 'a {
        self.verifying.iter().filter(move |k| kid.is_none_or(|kid| k.kid == kid)).map(|k| &k.key)
    }

    /// The JWKS document.
    pub fn jwks(&self) -> Value {
        json!({"keys": self.verifying.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()})
    }
}

/// The DER bodies of a PEM text's `PUBLIC KEY` blocks.
fn pem_blocks(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut inside: Option<String> = None;
    for line in text.lines().map(str::trim) {
        match (&mut inside, line) {
            (None, "-----BEGIN PUBLIC KEY-----") => inside = Some(String::new()),
            (Some(b64), "-----END PUBLIC KEY-----") => {
                out.push(base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()).map_err(|e| e.to_string())?);
                inside = None;
            }
            (Some(b64), l) => b64.push_str(l),
            (None, _) => {}
        }
    }
    if out.is_empty() {
        return Err("no PUBLIC KEY block".into());
    }
    Ok(out)
}

/// A new ECDSA P-256 signing key, PKCS#8 PEM (for tests and `certs`-style setup).
pub fn generate_signing_key() -> Result<String, String> {
    rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map(|k| k.serialize_pem()).map_err(|e| e.to_string())
}

impl std::fmt::Debug for Keys {
    /// Key ids only: a private key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<&str> = self.verifying.iter().map(|k| k.kid.as_str()).collect();
        f.debug_struct("Keys").field("signing_kid", &self.signing_kid).field("verifying", &kids).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kid_and_jwks_describe_the_signing_key_and_extra_public_keys() {
        let a = generate_signing_key().unwrap();
        let b = generate_signing_key().unwrap();
        let b_public = rcgen::KeyPair::from_pem(&b).unwrap().public_key_pem();
        let keys = Keys::from_pem(&a, &[&b_public, &b_public]).unwrap();
        let jwks = keys.jwks();
        let list = jwks["keys"].as_array().unwrap();
        assert_eq!(list.len(), 2, "a repeated key is listed once: {jwks}");
        assert_eq!(list[0]["kid"], json!(keys.signing_kid));
        assert_eq!(list[0]["alg"], "ES256");
        assert_eq!(list[0]["kid"].as_str().unwrap().len(), 43, "base64url of a SHA-256");
        assert_eq!(keys.candidates(Some(&keys.signing_kid)).count(), 1);
        assert_eq!(keys.candidates(None).count(), 2);
        assert_eq!(keys.candidates(Some("other")).count(), 0);
    }

    #[test]
    fn unusable_keys_are_named() {
        assert!(Keys::from_pem("garbage", &[]).unwrap_err().contains("PKCS#8"));
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap().serialize_pem();
        assert!(Keys::from_pem(&ed, &[]).unwrap_err().contains("P-256"));
        let a = generate_signing_key().unwrap();
        assert!(Keys::from_pem(&a, &["no key here"]).unwrap_err().contains("no PUBLIC KEY"));
    }
}
