//! Where a credential goes on the wire: bearer, basic, a named header or a query parameter.

use base64::Engine;
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use zeroize::Zeroizing;

use crate::error::EgressError;
use crate::secret::{SecretName, SecretValue};

/// How a secret is placed on a request (V3). Chosen where the secret is used, not
/// stored with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// `Authorization: Bearer <value>`.
    Bearer,
    /// `Authorization: Basic base64(<value>)`; the value is `user:password`.
    Basic,
    /// `<name>: <prefix><value>`.
    Header {
        /// The header name.
        name: String,
        /// Text put before the value, such as `Token `.
        prefix: Option<String>,
    },
    /// `?<name>=<value>` appended to the URL.
    Query {
        /// The parameter name.
        name: String,
    },
    /// V3, M18: `Authorization: Bearer <access token>`, where the credential names an OAuth
    /// token the OAuth client obtained and the vault keeps sealed (`oauth.<hash>`, see
    /// [`OAuthTokenRecord`](crate::OAuthTokenRecord));
    /// the token itself never leaves the vault except on this header. A DPoP-bound token
    /// goes as `Authorization: DPoP <access token>` with a fresh `DPoP` proof (RFC 9449).
    OAuth,
}

/// A secret to place on a request, by name. The caller never holds the plaintext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Which secret.
    pub secret: SecretName,
    /// Where it goes.
    pub placement: Placement,
}

/// A credential ready for the wire. Crate-private: no HTTP type leaves the vault.
pub(crate) enum Placed {
    Header(HeaderName, HeaderValue),
    Query(String, Zeroizing<String>),
}

pub(crate) fn header_value(name: &str, bytes: &[u8]) -> Result<HeaderValue, EgressError> {
    // V3: CR, LF and other control bytes would split or smuggle headers.
    if bytes
        .iter()
        .any(|&b| b == b'\r' || b == b'\n' || b == 0 || (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(EgressError::InvalidHeader {
            name: name.to_string(),
            problem: "the value contains a line break or control character",
        });
    }
    let mut value = HeaderValue::from_bytes(bytes).map_err(|_| EgressError::InvalidHeader {
        name: name.to_string(),
        problem: "the value is not a valid header value",
    })?;
    value.set_sensitive(true);
    Ok(value)
}

impl Placement {
    /// Renders the secret for the wire.
    pub(crate) fn place(&self, value: &SecretValue) -> Result<Placed, EgressError> {
        let secret = value.expose();
        match self {
            Self::Bearer | Self::OAuth => {
                let text = Zeroizing::new([b"Bearer ".as_slice(), secret].concat());
                Ok(Placed::Header(
                    AUTHORIZATION,
                    header_value("authorization", &text)?,
                ))
            }
            Self::Basic => {
                if !secret.contains(&b':') {
                    return Err(EgressError::InvalidHeader {
                        name: "authorization".into(),
                        problem: "basic placement needs the secret stored as user:password",
                    });
                }
                let encoded =
                    Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(secret));
                let text = Zeroizing::new(format!("Basic {}", encoded.as_str()));
                Ok(Placed::Header(
                    AUTHORIZATION,
                    header_value("authorization", text.as_bytes())?,
                ))
            }
            Self::Header { name, prefix } => {
                let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    EgressError::InvalidHeader {
                        name: name.clone(),
                        problem: "not a valid header name",
                    }
                })?;
                let text =
                    Zeroizing::new([prefix.as_deref().unwrap_or("").as_bytes(), secret].concat());
                Ok(Placed::Header(header, header_value(name, &text)?))
            }
            Self::Query { name } => {
                let text = std::str::from_utf8(secret).map_err(|_| EgressError::InvalidHeader {
                    name: name.clone(),
                    problem: "a query placement needs a UTF-8 secret value",
                })?;
                Ok(Placed::Query(
                    name.clone(),
                    Zeroizing::new(text.to_string()),
                ))
            }
        }
    }
}
