//! DPoP (RFC 9449) at the wire: the proof-of-possession key of an OAuth token, a fresh
//! signed proof on every request that carries the token, and the nonces the servers hand
//! out.
//!
//! This stays in the vault, below the OAuth client (`runwarden-oauth`), because the proof
//! is signed where the egress client places the token: the key is sealed beside the token
//! and the proof needs the token's hash, so both are read only at the wire. The OAuth
//! client uses the same key type, proofs and nonces for its token requests; when to use
//! DPoP and how to retry with a nonce are its business, not the vault's.
//!
//! The key is ES256 (P-256), made by `ring` when a token is first asked for and sealed in
//! the token record beside the token it binds, so a bound token keeps working after a
//! restart. Its private half is kept only in that sealed record: [`DpopKey`] prints
//! `[redacted]`, and only the public JWK and signatures go on the wire.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair};
use sha2::{Digest, Sha256};
use url::Url;
use zeroize::Zeroizing;

use crate::error::EgressError;
use crate::secret::SecretValue;

/// The one proof algorithm runwarden signs with.
pub const ALG: &str = "ES256";

/// The token type a DPoP-bound token comes back with, and the Authorization scheme it is
/// presented with (RFC 9449 §5, §7.1).
pub const SCHEME: &str = "DPoP";

/// The most nonces remembered (one per server origin); past it the oldest are forgotten.
const MAX_NONCES: usize = 256;

/// A DPoP key pair. Secret: never serialized but through [`DpopKey::sealed_form`] into the
/// sealed token record, never printed.
pub struct DpopKey {
    pkcs8: Zeroizing<Vec<u8>>,
    pair: EcdsaKeyPair,
}

impl std::fmt::Debug for DpopKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DpopKey([redacted])")
    }
}

impl DpopKey {
    /// A fresh P-256 key from the operating system's generator.
    pub fn generate() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("ring generates a P-256 key");
        Self::from_pkcs8(pkcs8.as_ref()).expect("a key ring made parses")
    }

    fn from_pkcs8(der: &[u8]) -> Option<Self> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
            .ok()?;
        Some(Self {
            pkcs8: Zeroizing::new(der.to_vec()),
            pair,
        })
    }

    /// The form kept in the sealed token record: base64url of the PKCS#8 document.
    pub fn sealed_form(&self) -> String {
        URL_SAFE_NO_PAD.encode(&*self.pkcs8)
    }

    /// The key of a sealed token record; `None` for a form this build cannot read.
    pub fn from_sealed_form(text: &str) -> Option<Self> {
        let der = Zeroizing::new(URL_SAFE_NO_PAD.decode(text).ok()?);
        Self::from_pkcs8(&der)
    }

    /// The public key as a JWK (RFC 7517), members in the order RFC 7638 hashes them.
    pub fn public_jwk(&self) -> serde_json::Value {
        // ring's public key is the uncompressed point: 0x04, then x and y, 32 bytes each.
        let point = self.pair.public_key().as_ref();
        serde_json::json!({
            "crv": "P-256",
            "kty": "EC",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        })
    }

    /// The JWK SHA-256 thumbprint (RFC 7638): the `cnf.jkt` a server binds the token to.
    /// Public; `mcp auth status` shows it.
    pub fn thumbprint(&self) -> String {
        // `public_jwk` writes its members in RFC 7638's required (lexicographic) order, and
        // serde_json keeps it whether or not its `preserve_order` is on.
        let canonical = self.public_jwk().to_string();
        URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
    }

    /// A proof JWT (RFC 9449 §4.2) for one request: `htm` its method, `htu` its URL
    /// without query and fragment, a fresh `jti`, `iat` now (Unix seconds), `ath` the
    /// SHA-256 of `access_token` when the request carries one, and the server's `nonce`
    /// when it gave one.
    pub fn proof(
        &self,
        htm: &str,
        url: &Url,
        access_token: Option<&[u8]>,
        nonce: Option<&str>,
        now_secs: i64,
    ) -> Result<String, ring::error::Unspecified> {
        let header = serde_json::json!({
            "typ": "dpop+jwt",
            "alg": ALG,
            "jwk": self.public_jwk(),
        });
        let mut claims = serde_json::json!({
            "jti": URL_SAFE_NO_PAD.encode(crate::envelope::random_bytes(16)),
            "htm": htm,
            "htu": htu(url),
            "iat": now_secs,
        });
        if let Some(token) = access_token {
            claims["ath"] = ath(token).into();
        }
        if let Some(nonce) = nonce {
            claims["nonce"] = nonce.into();
        }
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signing_input.as_bytes())?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }
}

/// `htu`: the request URL without query and fragment (RFC 9449 §4.2).
fn htu(url: &Url) -> String {
    let mut bare = url.clone();
    bare.set_query(None);
    bare.set_fragment(None);
    bare.to_string()
}

/// `ath`: base64url of the SHA-256 of the access token (RFC 9449 §4.2).
fn ath(access_token: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(access_token))
}

/// The headers of a request that presents a DPoP-bound token: `Authorization: DPoP
/// <token>` and `DPoP: <proof>`, a fresh proof of `key` for a `method` request to `url`
/// with the server's `nonce` (RFC 9449 §7.1).
pub(crate) fn wire_headers(
    key: &DpopKey,
    method: &str,
    url: &Url,
    token: &SecretValue,
    nonce: Option<&str>,
) -> Result<[(HeaderName, HeaderValue); 2], EgressError> {
    let refused = |problem| EgressError::InvalidHeader {
        name: "dpop".into(),
        problem,
    };
    let proof = key
        .proof(
            method,
            url,
            Some(token.expose()),
            nonce,
            chrono::Utc::now().timestamp(),
        )
        .map_err(|_| refused("the DPoP proof could not be signed"))?;
    let text = Zeroizing::new([b"DPoP ".as_slice(), token.expose()].concat());
    let authorization = crate::placement::header_value("authorization", &text)?;
    let proof = HeaderValue::from_str(&proof)
        .map_err(|_| refused("the proof is not a valid header value"))?;
    Ok([
        (AUTHORIZATION, authorization),
        (HeaderName::from_static("dpop"), proof),
    ])
}

/// The nonce each server last gave (RFC 9449 §8, §9), by origin: the token endpoint's for
/// token requests, the MCP server's for requests that carry a token. Kept in memory:
/// nonces are short-lived, and a server that wants one again says so.
#[derive(Debug, Default)]
pub struct Nonces {
    by_origin: Mutex<HashMap<String, String>>,
}

impl Nonces {
    /// The nonce of the server at `url`, if it gave one.
    pub fn get(&self, url: &Url) -> Option<String> {
        let map = self.by_origin.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&url.origin().ascii_serialization()).cloned()
    }

    /// Remembers the `DPoP-Nonce` the server at `url` answered with.
    pub fn remember(&self, url: &Url, nonce: &str) {
        // A nonce is an opaque token of visible ASCII (RFC 9449 §8.1); anything else is
        // not put into a proof.
        if nonce.is_empty()
            || nonce.len() > 1024
            || !nonce.bytes().all(|b| (0x21..0x7f).contains(&b))
        {
            return;
        }
        let mut map = self.by_origin.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_NONCES {
            map.clear();
        }
        map.insert(url.origin().ascii_serialization(), nonce.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::UnparsedPublicKey;

    fn decode(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn a_resource_proof_carries_its_claims_and_verifies_with_the_embedded_jwk() {
        let key = DpopKey::generate();
        let url = Url::parse("https://mcp.example/mcp?session=1#frag").unwrap();
        let proof = key
            .proof("POST", &url, Some(b"the-token"), Some("n-1"), 1_700_000_000)
            .unwrap();
        let parts: Vec<&str> = proof.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header = decode(parts[0]);
        assert_eq!(header["typ"], "dpop+jwt");
        assert_eq!(header["alg"], "ES256");
        assert!(
            header["jwk"].get("d").is_none(),
            "no private part: {header}"
        );
        let claims = decode(parts[1]);
        assert_eq!(claims["htm"], "POST");
        assert_eq!(claims["htu"], "https://mcp.example/mcp");
        assert_eq!(claims["iat"], 1_700_000_000);
        assert_eq!(claims["nonce"], "n-1");
        assert_eq!(
            claims["ath"],
            URL_SAFE_NO_PAD.encode(Sha256::digest(b"the-token"))
        );
        assert!(claims["jti"].as_str().is_some_and(|j| j.len() >= 16));
        // The signature verifies with the key the header carries, rebuilt from x and y.
        let jwk = &header["jwk"];
        let mut point = vec![4u8];
        point.extend(URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap());
        point.extend(URL_SAFE_NO_PAD.decode(jwk["y"].as_str().unwrap()).unwrap());
        let public = UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point);
        let signed = format!("{}.{}", parts[0], parts[1]);
        public
            .verify(
                signed.as_bytes(),
                &URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
            )
            .expect("the proof verifies with its jwk");
        let tampered = format!("{}.{}x", parts[0], parts[1]);
        assert!(
            public
                .verify(
                    tampered.as_bytes(),
                    &URL_SAFE_NO_PAD.decode(parts[2]).unwrap()
                )
                .is_err()
        );
    }

    #[test]
    fn a_token_request_proof_has_no_ath_and_every_proof_a_fresh_jti() {
        let key = DpopKey::generate();
        let url = Url::parse("https://as.example/token").unwrap();
        let a = decode(
            key.proof("POST", &url, None, None, 1)
                .unwrap()
                .split('.')
                .nth(1)
                .unwrap(),
        );
        let b = decode(
            key.proof("POST", &url, None, None, 1)
                .unwrap()
                .split('.')
                .nth(1)
                .unwrap(),
        );
        assert!(a.get("ath").is_none() && a.get("nonce").is_none(), "{a}");
        assert_ne!(a["jti"], b["jti"]);
    }

    #[test]
    fn the_sealed_form_round_trips_and_the_key_never_prints() {
        let key = DpopKey::generate();
        let sealed = key.sealed_form();
        // The PKCS#8 prefix of every P-256 key in this form: the leak scans look for it.
        assert!(sealed.starts_with(PKCS8_P256_SIGIL), "{sealed}");
        let back = DpopKey::from_sealed_form(&sealed).unwrap();
        assert_eq!(back.thumbprint(), key.thumbprint());
        assert_eq!(format!("{key:?}"), "DpopKey([redacted])");
        assert!(DpopKey::from_sealed_form("not a key").is_none());
    }

    /// The base64url of the fixed PKCS#8 header of a P-256 key as ring makes it.
    const PKCS8_P256_SIGIL: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg";

    #[test]
    fn the_thumbprint_is_rfc_7638s() {
        // The required members of an EC key, sorted, no whitespace (RFC 7638 §3.2).
        let key = DpopKey::generate();
        let jwk = key.public_jwk();
        let canonical = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            jwk["x"].as_str().unwrap(),
            jwk["y"].as_str().unwrap()
        );
        assert_eq!(
            key.thumbprint(),
            URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
        );
    }

    #[test]
    fn nonces_are_kept_per_origin_and_odd_ones_dropped() {
        let nonces = Nonces::default();
        let a = Url::parse("https://a.example/mcp").unwrap();
        let a_token = Url::parse("https://a.example/token").unwrap();
        let b = Url::parse("https://b.example/mcp").unwrap();
        nonces.remember(&a, "n1");
        assert_eq!(nonces.get(&a_token).as_deref(), Some("n1"));
        assert_eq!(nonces.get(&b), None);
        nonces.remember(&b, "bad nonce\r\n");
        assert_eq!(nonces.get(&b), None);
    }
}
