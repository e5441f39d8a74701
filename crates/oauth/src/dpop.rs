//! DPoP (RFC 9449) in the OAuth flows: whether a server's tokens are bound to a key, the
//! proof on each token request, and sending a request again with a server's new nonce.
//! The key, the proofs and the nonces themselves are the vault's (`runwarden_vault::dpop`),
//! since the proof on a request that carries the token is signed at the wire.

use runwarden_vault::dpop::{ALG, DpopKey};
use runwarden_vault::{CancellationSignal, EgressRequest, EgressResponse};
use url::Url;

use crate::challenge::Challenge;
use crate::client::{OAuthClient, now_ms};
use crate::discovery::ServerMetadata;
use crate::error::OAuthError;
use crate::record::{TokenErrorResponse, one_line};

/// The error a server answers when a proof lacks its current nonce (RFC 9449 §8, §9).
pub(crate) const USE_NONCE: &str = "use_dpop_nonce";

/// Whether to bind the tokens of a server to a DPoP key: `setting` is the configuration's
/// `dpop` (`None`: unset), `advertised` the authorization server's
/// `dpop_signing_alg_values_supported`. Unset, DPoP is used when the server offers ES256;
/// `true` asks for it from any server that does not rule ES256 out; `false` never.
pub(crate) fn wanted(setting: Option<bool>, advertised: Option<&[String]>) -> Result<bool, String> {
    let offers_es256 = advertised.is_some_and(|algs| algs.iter().any(|a| a == ALG));
    match (setting, advertised) {
        (Some(false), _) => Ok(false),
        (None, _) => Ok(offers_es256),
        (Some(true), Some(algs)) if !offers_es256 => Err(format!(
            "dpop = true, but the authorization server takes DPoP proofs signed with {} only and runwarden signs {ALG}; set dpop = false or let the server accept {ALG}",
            if algs.is_empty() {
                "no algorithm".to_string()
            } else {
                algs.iter()
                    .map(|a| one_line(a))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
        (Some(true), _) => Ok(true),
    }
}

/// How many times one request is sent again with a new nonce before its answer stands.
const NONCE_RETRIES: usize = 2;

/// True when `response` refuses a request for want of a DPoP nonce and names one that
/// `tried` (the nonces this request was already sent again with) lacks; the nonce is added.
fn wants_new_nonce(response: &EgressResponse, refused: bool, tried: &mut Vec<String>) -> bool {
    let Some(nonce) = response.header("dpop-nonce") else {
        return false;
    };
    if !refused || tried.len() >= NONCE_RETRIES || tried.iter().any(|t| t == nonce) {
        return false;
    }
    tried.push(nonce.to_string());
    true
}

impl OAuthClient {
    /// The DPoP key a new authorization binds its token to, when DPoP is used with this
    /// authorization server (see [`wanted`]).
    pub(crate) fn dpop_key_for(
        &self,
        metadata: &ServerMetadata,
    ) -> Result<Option<DpopKey>, OAuthError> {
        let advertised = metadata.dpop_signing_alg_values_supported.as_deref();
        match wanted(self.settings.dpop, advertised) {
            Ok(true) => Ok(Some(DpopKey::generate())),
            Ok(false) => Ok(None),
            Err(problem) => Err(OAuthError::Config {
                server: self.server.clone(),
                problem,
            }),
        }
    }

    /// A token request with a fresh proof of `key`; a `use_dpop_nonce` refusal that names
    /// a new nonce sends it again with that nonce (RFC 9449 §8), once per nonce.
    pub(crate) async fn send_with_proof(
        &self,
        metadata: &ServerMetadata,
        key: &DpopKey,
        request: impl Fn() -> EgressRequest,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<EgressResponse, OAuthError> {
        let url = Url::parse(&metadata.token_endpoint).map_err(|_| OAuthError::Metadata {
            server: self.server.clone(),
            problem: "the token_endpoint is not a URL".into(),
        })?;
        let nonces = self.vault().dpop_nonces();
        let mut tried = Vec::new();
        loop {
            let nonce = nonces.get(&url);
            let proof = key
                .proof("POST", &url, None, nonce.as_deref(), now_ms() / 1000)
                .map_err(|_| OAuthError::Config {
                    server: self.server.clone(),
                    problem: "cannot sign the DPoP proof".into(),
                })?;
            let response = self
                .send(request().header("dpop", proof), "token", signal)
                .await?;
            if let Some(nonce) = response.header("dpop-nonce") {
                nonces.remember(&url, nonce);
            }
            let refused = response.status == 400
                && serde_json::from_slice::<TokenErrorResponse>(&response.body)
                    .is_ok_and(|e| e.error == USE_NONCE);
            if !wants_new_nonce(&response, refused, &mut tried) {
                return Ok(response);
            }
        }
    }

    /// RFC 9449 §9: true when the MCP server's answer refuses the request for want of a
    /// DPoP nonce and names one this request has not been sent with; the caller sends it
    /// again (the egress client remembered the nonce when the answer came). `tried` is the
    /// request's own list, empty at first.
    pub fn retry_with_dpop_nonce(
        &self,
        response: &EgressResponse,
        tried: &mut Vec<String>,
    ) -> bool {
        let challenge = Challenge::parse(response.header("www-authenticate").unwrap_or(""));
        let refused = response.status == 401 && challenge.error.as_deref() == Some(USE_NONCE);
        wants_new_nonce(response, refused, tried)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpop_is_used_when_offered_or_asked_for_and_never_when_turned_off() {
        let es = vec!["ES256".to_string(), "RS256".to_string()];
        let rs = vec!["RS256".to_string()];
        assert_eq!(wanted(None, Some(&es)), Ok(true));
        assert_eq!(wanted(None, Some(&rs)), Ok(false));
        assert_eq!(wanted(None, None), Ok(false));
        assert_eq!(wanted(Some(false), Some(&es)), Ok(false));
        assert_eq!(wanted(Some(true), None), Ok(true));
        let refused = wanted(Some(true), Some(&rs)).unwrap_err();
        assert!(
            refused.contains("RS256") && refused.contains("dpop = false"),
            "{refused}"
        );
    }

    fn answer(status: u16, nonce: Option<&str>) -> EgressResponse {
        EgressResponse {
            status,
            headers: nonce
                .map(|n| vec![("dpop-nonce".to_string(), n.to_string())])
                .unwrap_or_default(),
            body: Vec::new(),
            truncated: false,
            audit_id: None,
        }
    }

    #[test]
    fn a_request_is_sent_again_once_per_new_nonce_and_never_endlessly() {
        let mut tried = Vec::new();
        assert!(
            !wants_new_nonce(&answer(400, None), true, &mut tried),
            "no nonce named"
        );
        assert!(
            !wants_new_nonce(&answer(200, Some("a")), false, &mut tried),
            "not refused"
        );
        assert!(wants_new_nonce(&answer(400, Some("a")), true, &mut tried));
        assert!(
            !wants_new_nonce(&answer(400, Some("a")), true, &mut tried),
            "a again"
        );
        assert!(wants_new_nonce(&answer(400, Some("b")), true, &mut tried));
        assert!(
            !wants_new_nonce(&answer(400, Some("c")), true, &mut tried),
            "a server that changes its nonce on every answer is not followed for ever"
        );
        assert_eq!(tried, ["a", "b"]);
    }
}
