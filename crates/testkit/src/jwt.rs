//! Signing keys for `private_key_jwt` client authentication (RFC 7523) and the check the
//! test authorization server makes of an assertion: RS256 and ES256 through ring.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};

/// A fixed 2048-bit RSA test key (PKCS#8), made for these tests with
/// `openssl genpkey -algorithm RSA`: ring verifies RSA signatures but cannot generate RSA
/// keys. It signs nothing but test assertions and is no secret.
const TEST_RSA_PKCS8: &str = "\
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCqervf60hvZ+x3\
zQQGrgEuMgmTs4n1e4ZpXc1Dyr2L8T5J4R/Txyy34hx2gU+feBgKoV+3TKoZxAPK\
5+5vtY9iU5pHYGwEGT8q7a0NedlNvJclbO2MFUPm61634MGwsVWkyxDRH6OWWTJk\
6pN+vI3HhlSKBn3W4DxHvxVSYEPpnCBuAytArFeoV/Ao4pRdvEymwyJbPYcz+YGM\
UkUXaHzIyydjxsfBZqU3x8xYRD19pe8Z7a29Ug3roRSp+/hw3gxkYmKDiL4VWt9x\
zZriUSLin400te8qvCKTx8p/IDFrzH792x9jhg5aBNfWtIg4dHNxey/AerLdUi1Q\
5S7DBknBAgMBAAECggEABE1UQrp8xExH6YlebHllT+WfsT8AIGuYFj5G6PWLoqWZ\
WqLtkIS/tPo7Q/r6Z+ikxAE+LvF71L+fZYuZzEQ1f0KN1kxGyDRc5Y1EPIlSebA5\
044epoDTiwHDN6UFLkYjW6UWN7jH14pJB8aVp0aZ1gBRT38KG5XitOAhE8hDHnjc\
De93MBYjpVT+NDe4QJkEacWg7qKZSm4heTCQn0BtoKT7Dh4KvZaq9JvdBpNZ4Xcv\
YJ1geJ5ZP4cPQ8OllgECNQ8M2KjNVjb5owb6c42S3t6BQtlylzccJcvtDh10meqK\
9ZjZCLe5GaRIohKb4Zf2H3TXbUw/RKMc2FLQFNlzYwKBgQDm3i7q9iAHhKuoJJsl\
ASgKtqLKF5oHXOkdhIfQ2SE6d89v+ABHBMsFfMLKJENnO4jN6f1VL83GQqe9ApsX\
8eA5rwCQ48krIq1yevET/FNrpbqYPDAfFdBSxrwfC17Yi4TL98X9NOQi6QKy6Zdb\
FyIKo8+lUu11sfx60RHbuoyFZwKBgQC9CaWw+L3WFyOey+u5tz7WKHbQ6NKX598A\
UhXDf9MvDy4SArvr74xykN3nH76eWuwB7KsQMDSBXXCDQUfz7MaiBBsEKCymu6Be\
Yz/hf5ekcILMdrKH+Z7z9Zb0LBXArxXmwRNBdz3f+2JvEWaocTFuVkeJlK/m8TqV\
7J6ogTVWlwKBgQCI0nSL24Hv8rio1cj8jUrlzod7rbEjW/TsAXdcVtJSjF7rxNal\
QDnx7paipgssSyQwpNP2gHY7YZV3duvjrP1uMkDrnZPDdLHGfwYRCiGGUpnbTxBV\
29+yrwUegOac/1KcbyNvhMEPz3hCAB4rZfJOy/ZrzFHexrUTNISY7F4LUQKBgQCC\
pd47103sXwWhRDJgokLtY/3qGF8j2X8IC7M68GcWSRmAHR+fyml47KJQkGH/s7sV\
AWqgv5AqMFgIft+pt+T4KHo7f0CM43PMiC+oO7SkU5YylX6B94Vh+kQf8S//gYJT\
fvE995lt6aF4PcCDfee56Ct87KQ9qk7hOy3UK6ifdQKBgAJR5h8C10RKEQxifMym\
oOKpFOUS2RuowPrAEwcWP69XtOvdQ9FsUwg6c0iRZGfIjhR4aarf6P9H9HRP6B58\
nihrqd2OaRBWkFxD6aA/u1CFzHY0ilS30TDLrcGvDq7mTbYGPspx3Hac62wL3qOd\
T2IDhnBSyQFjz0B3nobl7BMq";

/// The grant type URN of a JWT client assertion (RFC 7523 section 2.2).
pub const JWT_BEARER_ASSERTION: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

enum Pair {
    Rsa(RsaKeyPair),
    Ec(EcdsaKeyPair),
}

/// A key pair a test client signs its `private_key_jwt` assertions with; the authorization
/// server gets [`SigningKey::public_jwk`] at registration.
pub struct SigningKey {
    pair: Pair,
    pkcs8: Vec<u8>,
    kid: String,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("alg", &self.alg())
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The fixed RSA test key, for RS256.
    pub fn rs256() -> Self {
        let pkcs8 = STANDARD
            .decode(TEST_RSA_PKCS8.replace('\n', ""))
            .expect("the test RSA key is base64");
        let pair = RsaKeyPair::from_pkcs8(&pkcs8).expect("the test RSA key parses");
        Self {
            pair: Pair::Rsa(pair),
            pkcs8,
            kid: "testkit-rs256".into(),
        }
    }

    /// A fresh P-256 key, for ES256.
    pub fn es256() -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let document = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("a fresh P-256 key");
        let pkcs8 = document.as_ref().to_vec();
        let pair = EcdsaKeyPair::from_pkcs8(alg, &pkcs8, &rng).expect("the fresh key parses");
        Self {
            pair: Pair::Ec(pair),
            pkcs8,
            kid: format!("testkit-es256-{}", random_token(6)),
        }
    }

    /// `RS256` or `ES256`.
    pub fn alg(&self) -> &'static str {
        match self.pair {
            Pair::Rsa(_) => "RS256",
            Pair::Ec(_) => "ES256",
        }
    }

    /// The key id put in the JWK and in every JWT header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half as a JWK (RFC 7517), with `kid`, `alg` and `use`.
    pub fn public_jwk(&self) -> Value {
        match &self.pair {
            Pair::Rsa(pair) => {
                let components: signature::RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
                json!({
                    "kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig",
                    "n": URL_SAFE_NO_PAD.encode(&components.n),
                    "e": URL_SAFE_NO_PAD.encode(&components.e),
                })
            }
            Pair::Ec(pair) => {
                // An uncompressed point: 0x04, then x and y of 32 bytes each.
                let point = pair.public_key().as_ref();
                json!({
                    "kty": "EC", "crv": "P-256", "kid": self.kid, "alg": "ES256", "use": "sig",
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                    "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
                })
            }
        }
    }

    /// The private key as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), as an operator
    /// would store it in the vault.
    pub fn private_pem(&self) -> String {
        let encoded = STANDARD.encode(&self.pkcs8);
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in encoded.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        pem
    }

    /// A compact JWS over `claims` with this key (header `alg`, `kid`, `typ: JWT`).
    pub fn sign_jwt(&self, claims: &Value) -> String {
        self.sign_jwt_typed("JWT", claims)
    }

    /// A compact JWS over `claims` whose header names `typ` (`oauth-id-jag+jwt`).
    pub fn sign_jwt_typed(&self, typ: &str, claims: &Value) -> String {
        let header = json!({"alg": self.alg(), "kid": self.kid, "typ": typ});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let signature = match &self.pair {
            Pair::Rsa(pair) => {
                let mut out = vec![0u8; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut out,
                )
                .expect("RSA signing");
                out
            }
            Pair::Ec(pair) => pair
                .sign(&rng, input.as_bytes())
                .expect("ECDSA signing")
                .as_ref()
                .to_vec(),
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    /// A client assertion for `client_id` addressed to `audience` (the issuer or the token
    /// endpoint), valid for a minute, with a fresh `jti`.
    pub fn client_assertion(&self, client_id: &str, audience: &str) -> String {
        let now = unix_now();
        self.sign_jwt(&json!({
            "iss": client_id, "sub": client_id, "aud": audience,
            "iat": now, "exp": now + 60, "jti": random_token(12),
        }))
    }
}

/// Checks a compact JWS against the keys of `jwks` (RS256 or ES256; `kid` picks the key
/// when present) and answers its claims, or why it was refused.
pub(crate) fn verify_jwt(token: &str, jwks: &[Value]) -> Result<Value, String> {
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the assertion is not a compact JWS".into());
    };
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|e| e.to_string());
    let header: Value = serde_json::from_slice(&decode(header)?).map_err(|e| e.to_string())?;
    let claims_value: Value =
        serde_json::from_slice(&decode(claims)?).map_err(|e| e.to_string())?;
    let signature = decode(signature)?;
    let input = &token[..token.rfind('.').unwrap_or(0)];
    let alg = header["alg"].as_str().unwrap_or_default();
    let kid = header["kid"].as_str();
    let candidates = jwks
        .iter()
        .filter(|key| kid.is_none() || key["kid"].as_str() == kid);
    for key in candidates {
        let field = |name: &str| {
            key[name]
                .as_str()
                .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
                .unwrap_or_default()
        };
        let verified = match (alg, key["kty"].as_str()) {
            ("RS256", Some("RSA")) => signature::RsaPublicKeyComponents {
                n: field("n"),
                e: field("e"),
            }
            .verify(
                &signature::RSA_PKCS1_2048_8192_SHA256,
                input.as_bytes(),
                &signature,
            )
            .is_ok(),
            ("ES256", Some("EC")) => {
                let mut point = vec![0x04];
                point.extend(field("x"));
                point.extend(field("y"));
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(input.as_bytes(), &signature)
                    .is_ok()
            }
            _ => false,
        };
        if verified {
            return Ok(claims_value);
        }
    }
    Err(format!(
        "no registered key verifies this {alg} assertion (kid {kid:?})"
    ))
}

/// One part of a compact JWT (0: the header, 1: the claims) as JSON, unverified: what
/// picks the keys a signature is then checked with.
pub(crate) fn jwt_part(token: &str, index: usize) -> Option<Value> {
    token
        .split('.')
        .nth(index)
        .and_then(|part| URL_SAFE_NO_PAD.decode(part).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `bytes` random bytes, base64url: codes, tokens, client ids.
pub(crate) fn random_token(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut buffer).expect("system randomness");
    URL_SAFE_NO_PAD.encode(buffer)
}
