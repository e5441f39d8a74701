//! A real OTLP/HTTP receiver on 127.0.0.1: accepts `POST /v1/traces` (protobuf) and decodes
//! the spans with the protocol's own types, for tests of trace export.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;

use crate::{HttpReply, TestServer};

/// One exported span, flattened for assertions.
#[derive(Debug, Clone)]
pub struct ExportedSpan {
    /// The span's name.
    pub name: String,
    /// The trace id, 32 hex characters.
    pub trace_id: String,
    /// The span id, 16 hex characters.
    pub span_id: String,
    /// The parent's span id, empty for a root.
    pub parent_span_id: String,
    /// Attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// Event names with their attributes as text.
    pub events: Vec<String>,
}

/// The receiver.
pub struct OtlpReceiver {
    server: TestServer,
    spans: Vec<ExportedSpan>,
}

impl OtlpReceiver {
    /// Starts listening; every POST is answered 200 with an empty export response.
    pub async fn start() -> Self {
        let server =
            TestServer::start(|_| HttpReply::typed(200, "application/x-protobuf", Vec::new()))
                .await;
        Self {
            server,
            spans: Vec::new(),
        }
    }

    /// The collector base URL to configure (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        self.server.url("").trim_end_matches('/').to_string()
    }

    /// Every span received so far (decoding the requests that arrived since the last call).
    pub fn spans(&mut self) -> &[ExportedSpan] {
        for request in self.server.drain_requests() {
            self.decode(&request);
        }
        &self.spans
    }

    /// Waits until a span named `name` has arrived, or panics after `within`.
    pub async fn wait_for(&mut self, name: &str, within: Duration) -> ExportedSpan {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(span) = self.spans().iter().find(|s| s.name == name) {
                return span.clone();
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "no span {name:?} within {within:?}: {:#?}",
                self.spans
            );
            // Each export is one request: wait for the next one.
            let request = self.server.next_request(left).await;
            self.decode(&request);
        }
    }

    fn decode(&mut self, request: &crate::HttpRequest) {
        assert_eq!(request.target, "/v1/traces", "the OTLP/HTTP traces path");
        let export = ExportTraceServiceRequest::decode(request.body.as_slice())
            .expect("an OTLP protobuf export request");
        for resource in export.resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let pairs =
                        |attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>| {
                            attributes
                                .into_iter()
                                .map(|kv| (kv.key, text(kv.value.and_then(|v| v.value))))
                                .collect::<BTreeMap<String, String>>()
                        };
                    self.spans.push(ExportedSpan {
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: pairs(span.attributes),
                        events: span
                            .events
                            .into_iter()
                            .map(|e| format!("{} {:?}", e.name, pairs(e.attributes)))
                            .collect(),
                    });
                }
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(s)) => s,
        Some(AnyValue::IntValue(n)) => n.to_string(),
        Some(AnyValue::DoubleValue(n)) => n.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
