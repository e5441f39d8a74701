//! The request on the wire: the HTTP client that connects only to vetted addresses, the
//! request built with the credential placed, and the transfer that reads the answer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::{DpopKey, EgressClient, dpop};
use crate::audit::audit_error_text;
use crate::delivery::Delivery;
use crate::error::EgressError;
use crate::guard::VettedTarget;
use crate::message::{CompleteFn, EgressRequest, HeadObserver};
use crate::placement::Placed;
use crate::secret::SecretValue;

/// Addresses the guard vetted, by host; the only answers reqwest's connector gets.
pub(super) type PinTable = Arc<RwLock<HashMap<String, Vec<IpAddr>>>>;

/// reqwest's resolver: answers only from the pin table, never from DNS (V4: no second
/// lookup, so a rebinding name cannot swap the address between check and connect).
struct PinnedResolver {
    pins: PinTable,
}

impl Resolve for PinnedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let found = self
            .pins
            .read()
            .ok()
            .and_then(|pins| pins.get(name.as_str()).cloned());
        Box::pin(async move {
            match found {
                Some(ips) => {
                    Ok(Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0))) as Addrs)
                }
                None => Err("the host was not vetted by the egress guard".into()),
            }
        })
    }
}

/// The HTTP client every call goes through: no proxy from the environment, no redirect
/// followed, and names answered only from the pin table.
pub(super) fn http_client(connect_timeout: Duration, pins: PinTable) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy() // V4: never a proxy from the environment
        .redirect(reqwest::redirect::Policy::none()) // V4: a 3xx is returned, never chased
        .connect_timeout(connect_timeout)
        .dns_resolver(Arc::new(PinnedResolver { pins }))
        .build()
        .expect("a client with a static configuration always builds")
}

/// A finished transfer.
pub(super) struct Transfer {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
    pub(super) truncated: bool,
    pub(super) location: Option<String>,
}

impl EgressClient {
    /// Builds the wire request: the caller's headers, the placed credential (with its
    /// DPoP proof when the token is bound), the pinned addresses, the total timeout.
    pub(super) fn build(
        &self,
        request: &EgressRequest,
        target: &VettedTarget,
        secret: Option<&SecretValue>,
        dpop_key: Option<&DpopKey>,
    ) -> Result<reqwest::Request, EgressError> {
        let mut url = target.url.clone();
        let mut headers = caller_headers(request)?;
        // O5: the server's spans join the run's trace (only when traces are exported).
        if let Some(traceparent) = crate::trace::traceparent()
            && let Ok(value) = HeaderValue::from_str(&traceparent)
        {
            headers.insert(HeaderName::from_static("traceparent"), value);
        }
        if let (Some(credential), Some(secret)) = (&request.credential, secret) {
            match credential.placement.place(secret)? {
                Placed::Header(name, value) => {
                    headers.insert(name, value);
                }
                Placed::Query(name, value) => {
                    url.query_pairs_mut().append_pair(&name, &value);
                }
            }
            // RFC 9449: a bound token goes with a fresh proof of its key for this request.
            if let Some(key) = dpop_key {
                let nonce = self.vault.dpop_nonces.get(&target.url);
                let placed = dpop::wire_headers(
                    key,
                    request.method.as_str(),
                    &target.url,
                    secret,
                    nonce.as_deref(),
                )?;
                for (name, value) in placed {
                    headers.insert(name, value);
                }
            }
        }
        if !target.ip_literal {
            let key = target.url.host_str().unwrap_or_default().to_string();
            if let Ok(mut pins) = self.pins.write() {
                pins.insert(key, target.addrs.clone());
            }
        }
        let timeout = request
            .timeout
            .unwrap_or(self.config.default_timeout)
            .max(Duration::from_millis(1));
        let mut builder = self
            .http
            .request(request.method.to_reqwest(), url)
            .headers(headers)
            .timeout(timeout);
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        builder.build().map_err(|e| EgressError::Transport {
            host: target.host.clone(),
            detail: describe_reqwest(e),
            delivery: Delivery::NotSent,
        })
    }
}

/// The caller's headers, each checked: a bad name or a value with a line break is refused.
fn caller_headers(request: &EgressRequest) -> Result<HeaderMap, EgressError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &request.headers {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| EgressError::InvalidHeader {
                name: name.clone(),
                problem: "not a valid header name",
            })?;
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(EgressError::InvalidHeader {
                name: name.clone(),
                problem: "the value contains a line break",
            });
        }
        let value = HeaderValue::from_str(value).map_err(|_| EgressError::InvalidHeader {
            name: name.clone(),
            problem: "not a valid header value",
        })?;
        headers.append(header, value);
    }
    Ok(headers)
}

/// One line describing a reqwest error without its URL (which may carry a query secret).
pub(super) fn describe_reqwest(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    audit_error_text(&text)
}

/// Sends the request and reads the body up to `limit` bytes.
pub(super) async fn transfer(
    http: reqwest::Client,
    request: reqwest::Request,
    limit: usize,
    mut complete: Option<CompleteFn>,
    on_head: Option<HeadObserver>,
) -> Result<Transfer, reqwest::Error> {
    let mut response = http.execute(request).await?;
    let status = response.status().as_u16();
    if let Some(observe) = on_head {
        observe(status);
    }
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    if (300..400).contains(&status) {
        // Raw here: the scrubber cuts the secret out before the target is parsed and cut
        // to host and path (V9), since parsing would re-encode or lowercase its forms.
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        return Ok(Transfer {
            status,
            headers,
            body: Vec::new(),
            truncated: false,
            location,
        });
    }
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
        if let Some(complete) = complete.as_mut()
            && complete(&body)
        {
            break;
        }
    }
    Ok(Transfer {
        status,
        headers,
        body,
        truncated,
        location: None,
    })
}
