//! The small cryptography of OAuth clients: PKCE (RFC 7636, S256), `state`, and the signed
//! client assertion of `private_key_jwt` (RFC 7523 §2.2, ES256 or RS256 with `ring`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, RsaKeyPair};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// The algorithm of a `private_key_jwt` client assertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SigningAlg {
    /// ECDSA on P-256 with SHA-256.
    #[default]
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
}

impl SigningAlg {
    /// The JOSE name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Es256 => "ES256",
            Self::Rs256 => "RS256",
        }
    }

    /// Parses a JOSE name, case-insensitively.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Es256, Self::Rs256]
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(text))
    }
}

/// `n` random bytes from the operating system's generator, base64url without padding.
pub(crate) fn random_token(n: usize) -> Zeroizing<String> {
    let mut bytes = Zeroizing::new(vec![0u8; n]);
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random generator works");
    Zeroizing::new(URL_SAFE_NO_PAD.encode(&*bytes))
}

/// A PKCE pair: the verifier kept by the client and its S256 challenge (RFC 7636 §4).
pub(crate) struct Pkce {
    pub(crate) verifier: Zeroizing<String>,
    pub(crate) challenge: String,
}

impl Pkce {
    pub(crate) fn new() -> Self {
        // 32 random bytes give a 43-character verifier, the minimum length and 256 bits.
        let verifier = random_token(32);
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        Self {
            verifier,
            challenge,
        }
    }
}

/// Why a private key could not sign.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyProblem {
    #[error("the private key is not PEM (expected -----BEGIN PRIVATE KEY-----)")]
    NotPem,
    #[error(
        "the private key is not a {alg} key in PKCS#8 form (convert it with `openssl pkcs8 -topk8 -nocrypt`)"
    )]
    Rejected { alg: &'static str },
    #[error("signing failed")]
    Signing,
}

/// The DER inside a PEM block, and its label.
fn pem_der(pem: &[u8]) -> Result<(String, Zeroizing<Vec<u8>>), KeyProblem> {
    let text = std::str::from_utf8(pem).map_err(|_| KeyProblem::NotPem)?;
    let mut label = None;
    let mut body = Zeroizing::new(String::new());
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("-----BEGIN ") {
            label = Some(rest.trim_end_matches('-').to_string());
        } else if line.starts_with("-----END ") {
            break;
        } else if label.is_some() {
            body.push_str(line);
        }
    }
    let label = label.ok_or(KeyProblem::NotPem)?;
    let der = base64::engine::general_purpose::STANDARD
        .decode(body.as_bytes())
        .map_err(|_| KeyProblem::NotPem)?;
    Ok((label, Zeroizing::new(der)))
}

/// A signed JWT client assertion (RFC 7523 §3): `iss` and `sub` are the client id, `aud`
/// the authorization server's issuer, a fresh `jti`, five minutes of life.
pub(crate) fn client_assertion(
    pem: &[u8],
    alg: SigningAlg,
    client_id: &str,
    audience: &str,
    now_secs: i64,
) -> Result<Zeroizing<String>, KeyProblem> {
    let header = serde_json::json!({ "alg": alg.as_str(), "typ": "JWT" });
    let claims = serde_json::json!({
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now_secs,
        "exp": now_secs + 300,
        "jti": random_token(16).as_str(),
    });
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let (label, der) = pem_der(pem)?;
    let rng = SystemRandom::new();
    let signature = match alg {
        SigningAlg::Es256 => {
            let key =
                EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
                    .map_err(|_| KeyProblem::Rejected { alg: "P-256" })?;
            key.sign(&rng, signing_input.as_bytes())
                .map_err(|_| KeyProblem::Signing)?
                .as_ref()
                .to_vec()
        }
        SigningAlg::Rs256 => {
            let key = if label == "RSA PRIVATE KEY" {
                RsaKeyPair::from_der(&der)
            } else {
                RsaKeyPair::from_pkcs8(&der)
            }
            .map_err(|_| KeyProblem::Rejected { alg: "RSA" })?;
            let mut out = vec![0u8; key.public().modulus_len()];
            key.sign(
                &signature::RSA_PKCS1_SHA256,
                &rng,
                signing_input.as_bytes(),
                &mut out,
            )
            .map_err(|_| KeyProblem::Signing)?;
            out
        }
    };
    Ok(Zeroizing::new(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pkce_challenge_is_the_s256_of_the_verifier() {
        let pkce = Pkce::new();
        assert_eq!(pkce.verifier.len(), 43);
        let expected = URL_SAFE_NO_PAD.encode(Sha256::digest(pkce.verifier.as_bytes()));
        assert_eq!(pkce.challenge, expected);
        assert_ne!(Pkce::new().verifier.as_str(), pkce.verifier.as_str());
    }

    #[test]
    fn an_es256_assertion_verifies_with_the_public_key() {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref())
        );
        let jwt =
            client_assertion(pem.as_bytes(), SigningAlg::Es256, "c1", "http://as", 100).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let key = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        use ring::signature::KeyPair;
        let public = signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            key.public_key().as_ref(),
        );
        let signed = format!("{}.{}", parts[0], parts[1]);
        public
            .verify(
                signed.as_bytes(),
                &URL_SAFE_NO_PAD.decode(parts[2]).unwrap(),
            )
            .expect("the signature verifies");
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], "c1");
        assert_eq!(claims["sub"], "c1");
        assert_eq!(claims["aud"], "http://as");
    }

    #[test]
    fn a_key_that_is_not_pem_is_refused_with_what_to_do() {
        let error = client_assertion(b"not a key", SigningAlg::Es256, "c", "a", 0).unwrap_err();
        assert!(error.to_string().contains("BEGIN PRIVATE KEY"));
    }
}
