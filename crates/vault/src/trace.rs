//! W3C trace context for outbound calls (O5): when this process exports traces, every
//! request the vault sends carries the current span's `traceparent`, so the server's spans
//! join the run's trace. Without an exporter the current span has no valid context and
//! nothing is added.

use opentelemetry::trace::TraceContextExt as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// `00-<trace id>-<span id>-<flags>` of the current span, when it has a valid context.
pub fn traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_nothing_is_added() {
        let span = tracing::info_span!("outbound_call");
        let _entered = span.enter();
        assert_eq!(traceparent(), None);
    }
}
