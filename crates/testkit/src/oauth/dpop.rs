//! DPoP (RFC 9449) as the test authorization server and its protected resources check it:
//! a proof's header (`typ`, `alg`, `jwk`), its signature by the embedded key, its claims
//! (`jti` never seen before, `htm`, `htu`, `iat`, `ath`, `nonce`), and the key's RFC 7638
//! thumbprint that binds a token.

use std::collections::HashSet;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::{Value, json};

use super::{IssuedToken, State, json_reply, oauth_error};
use crate::jwt::unix_now;
use crate::server::{HttpReply, HttpRequest};

/// How far a proof's `iat` may be from now, in seconds.
const IAT_WINDOW: i64 = 300;

/// A proof that checked out.
#[derive(Debug, Clone)]
pub(crate) struct Proof {
    /// The RFC 7638 thumbprint of the proof's key (`cnf.jkt` of the token it binds).
    pub(crate) jkt: String,
    /// The nonce the proof carries.
    pub(crate) nonce: Option<String>,
}

/// Checks the `DPoP` header `proof` of a `method` request to `url` (without query), which
/// carries `access_token` when one is presented; `seen` holds every `jti` so far (a proof
/// used twice is refused). Answers the proof, or what is wrong with it.
pub(crate) fn check(
    proof: Option<&str>,
    method: &str,
    url: &str,
    access_token: Option<&str>,
    seen: &mut HashSet<String>,
) -> Result<Proof, String> {
    let proof = proof.ok_or("no DPoP proof")?;
    let mut parts = proof.split('.');
    let (Some(header), Some(claims), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the proof is not a compact JWS".into());
    };
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|e| e.to_string());
    let header: Value = serde_json::from_slice(&decode(header)?).map_err(|e| e.to_string())?;
    let claims: Value = serde_json::from_slice(&decode(claims)?).map_err(|e| e.to_string())?;
    if header["typ"] != "dpop+jwt" {
        return Err(format!("typ is {}, not dpop+jwt", header["typ"]));
    }
    if header["alg"] != "ES256" {
        return Err(format!("alg is {}, not ES256", header["alg"]));
    }
    let jwk = &header["jwk"];
    if jwk.get("d").is_some() {
        return Err("the jwk carries the private key".into());
    }
    if jwk["kty"] != "EC" || jwk["crv"] != "P-256" {
        return Err(format!("the jwk is not a P-256 key: {jwk}"));
    }
    let (x, y) = (
        jwk["x"].as_str().ok_or("the jwk has no x")?,
        jwk["y"].as_str().ok_or("the jwk has no y")?,
    );
    let mut point = vec![4u8];
    point.extend(decode(x)?);
    point.extend(decode(y)?);
    let input = &proof[..proof.rfind('.').unwrap_or(0)];
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
        .verify(input.as_bytes(), &decode(sig)?)
        .map_err(|_| "the signature does not verify with the embedded jwk")?;
    let jti = claims["jti"].as_str().ok_or("no jti")?;
    if !seen.insert(jti.to_string()) {
        return Err(format!("jti {jti} was used before (a replayed proof)"));
    }
    if claims["htm"] != method {
        return Err(format!("htm is {}, not {method}", claims["htm"]));
    }
    if claims["htu"] != url {
        return Err(format!("htu is {}, not {url}", claims["htu"]));
    }
    let iat = claims["iat"].as_i64().ok_or("no numeric iat")?;
    if (unix_now() as i64 - iat).abs() > IAT_WINDOW {
        return Err(format!("iat {iat} is over {IAT_WINDOW} s from now"));
    }
    match access_token {
        Some(token) => {
            let expected = URL_SAFE_NO_PAD.encode(ring::digest::digest(
                &ring::digest::SHA256,
                token.as_bytes(),
            ));
            if claims["ath"] != expected.as_str() {
                return Err("ath is not the SHA-256 of the presented token".into());
            }
        }
        None if claims.get("ath").is_some() => {
            return Err("ath in a proof that presents no token".into());
        }
        None => {}
    }
    let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
    Ok(Proof {
        jkt: URL_SAFE_NO_PAD.encode(ring::digest::digest(
            &ring::digest::SHA256,
            canonical.as_bytes(),
        )),
        nonce: claims["nonce"].as_str().map(str::to_string),
    })
}

/// The DPoP key a token request binds its token to (RFC 9449 section 5): `None` without
/// `dpop` or without a proof (unless one is required); a bad proof or a stale nonce is
/// refused.
pub(super) fn token_request_proof(
    state: &mut State,
    request: &HttpRequest,
) -> Result<Option<String>, HttpReply> {
    let proof = request.header("dpop");
    if !state.knobs.dpop || (proof.is_none() && !state.knobs.dpop_required) {
        return Ok(None);
    }
    let url = format!("{}/token", state.issuer);
    let checked = check(proof, "POST", &url, None, &mut state.dpop_jtis);
    let proof =
        checked.map_err(|problem| oauth_error(state, 400, "invalid_dpop_proof", &problem))?;
    state.counters.dpop_token_proofs += 1;
    if state.knobs.dpop_nonces && proof.nonce.as_deref() != Some(state.dpop_nonce_as.as_str()) {
        state.counters.dpop_nonce_challenges += 1;
        let nonce = state.dpop_nonce_as.clone();
        return Err(oauth_error(
            state,
            400,
            "use_dpop_nonce",
            "the authorization server requires a DPoP nonce",
        )
        .with_header("dpop-nonce", &nonce));
    }
    Ok(Some(proof.jkt))
}

/// RFC 9449 section 7: a bound token is taken only with the DPoP scheme and a valid proof
/// of its key carrying the resource's current nonce; a DPoP-scheme token must be bound.
pub(super) fn resource_proof_refusal(
    state: &mut State,
    issued: Option<&IssuedToken>,
    scheme: Option<&str>,
    proof: Option<&Result<Proof, String>>,
    challenge: &str,
) -> Option<HttpReply> {
    let issued = issued?;
    let dpop_scheme = scheme.is_some_and(|s| s.eq_ignore_ascii_case("dpop"));
    let refuse = |error: &str| {
        Some(json_reply(401, json!({"error": error})).with_header("www-authenticate", challenge))
    };
    let Some(jkt) = &issued.jkt else {
        return if dpop_scheme {
            refuse("invalid_token")
        } else {
            None
        };
    };
    if !dpop_scheme {
        return refuse("invalid_token");
    }
    let proof = match proof {
        Some(Ok(proof)) if &proof.jkt == jkt => proof,
        _ => return refuse("invalid_dpop_proof"),
    };
    if state.knobs.dpop_nonces && proof.nonce.as_deref() != Some(state.dpop_nonce_rs.as_str()) {
        state.counters.dpop_nonce_challenges += 1;
        let value = challenge.replace("invalid_dpop_proof", "use_dpop_nonce");
        return Some(
            json_reply(401, json!({"error": "use_dpop_nonce"}))
                .with_header("www-authenticate", &value)
                .with_header("dpop-nonce", &state.dpop_nonce_rs),
        );
    }
    None
}
