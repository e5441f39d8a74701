//! OpenTelemetry traces, off unless `[telemetry] otlp_endpoint` is set: runwarden's own
//! spans (a run, its model and tool steps, each outbound call, each API request) exported
//! over OTLP/HTTP in batches. The vault adds the current span's `traceparent` to every
//! outbound request, so an MCP server's or a model server's spans join the run's trace.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;

/// The crates whose spans are exported: ours, at info and above (a dependency's internals
/// are not the operator's business, and could name what we keep out of attributes).
const TARGETS: [&str; 6] = [
    "runwarden",
    "runwarden_vault",
    "runwarden_mcp",
    "runwarden_models",
    "runwarden_runtime",
    "runwarden_store_sqlite",
];

/// A provider exporting to `<endpoint>/v1/traces` in batches, from a thread of its own.
pub(crate) fn provider(endpoint: String) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .build()
        .map_err(|e| anyhow::anyhow!("could not build the OTLP exporter for {endpoint}: {e}"))?;
    let resource = Resource::builder()
        .with_service_name("runwarden")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The layer that turns our spans into OpenTelemetry spans.
pub(crate) fn layer<S>(provider: &SdkTracerProvider) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    let targets = TARGETS.iter().fold(Targets::new(), |t, target| {
        t.with_target(*target, tracing::Level::INFO)
    });
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("runwarden"))
        .with_filter(targets)
        .boxed()
}

/// The caller's trace, from a request's `traceparent` header (W3C trace context), so an
/// API request continues the trace of whoever sent it. Nothing when the header is absent or
/// malformed.
pub(crate) fn parent_of(headers: &axum::http::HeaderMap) -> Option<opentelemetry::Context> {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;

    struct Headers<'a>(&'a axum::http::HeaderMap);
    impl opentelemetry::propagation::Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
    let context =
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Headers(headers));
    context.span().span_context().is_valid().then_some(context)
}
