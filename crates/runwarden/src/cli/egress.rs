//! `runwarden egress test`: one guarded request, as an operator checks the policy.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::{Subcommand, ValueEnum};
use runwarden_vault::store::AuditFilter;
use runwarden_vault::{CancelFlag, Credential, EgressRequest, Method, Placement, SecretName};

use super::Context;
use crate::output;
use crate::views::audit::RowView;

/// The most `egress test` reads of a body; it never prints the body itself.
const TEST_BODY_LIMIT: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum PlacementKind {
    Bearer,
    Basic,
    Header,
    Query,
}

#[derive(Debug, Subcommand)]
pub(crate) enum EgressCommand {
    /// Send one request through the vault; print the status or the refusal, and the audit
    /// row. Exits 0 on a 2xx or 3xx answer, 1 on a 4xx or 5xx, a refusal or a failure (as
    /// the audit row says FAILED).
    Test {
        /// The target URL.
        url: String,
        /// The HTTP method.
        #[arg(long, default_value = "GET")]
        method: String,
        /// A vault secret to place on the request.
        #[arg(long, requires = "placement")]
        secret: Option<String>,
        /// Where the secret goes.
        #[arg(long, requires = "secret")]
        placement: Option<PlacementKind>,
        /// The header name, for --placement header.
        #[arg(long)]
        header: Option<String>,
        /// Text before the value, for --placement header (e.g. "Token ").
        #[arg(long)]
        prefix: Option<String>,
        /// The query parameter name, for --placement query.
        #[arg(long)]
        param: Option<String>,
        /// The total timeout in seconds.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
}

fn placement(
    kind: PlacementKind,
    header: Option<String>,
    prefix: Option<String>,
    param: Option<String>,
) -> anyhow::Result<Placement> {
    Ok(match kind {
        PlacementKind::Bearer => Placement::Bearer,
        PlacementKind::Basic => Placement::Basic,
        PlacementKind::Header => match header {
            Some(name) => Placement::Header { name, prefix },
            None => bail!("--placement header needs --header NAME"),
        },
        PlacementKind::Query => match param {
            Some(name) => Placement::Query { name },
            None => bail!("--placement query needs --param NAME"),
        },
    })
}

pub(crate) async fn run(cx: &Context, command: EgressCommand) -> anyhow::Result<ExitCode> {
    let EgressCommand::Test {
        url,
        method,
        secret,
        placement: kind,
        header,
        prefix,
        param,
        timeout,
    } = command;
    let Some(method) = Method::parse(&method) else {
        bail!("unknown method {method:?}: use GET, HEAD, POST, PUT, PATCH or DELETE");
    };
    if !(timeout.is_finite() && timeout > 0.0 && timeout <= 600.0) {
        bail!("--timeout must be between 0 and 600 seconds");
    }
    let client = cx.egress().await?;
    let correlation = format!("egress-test-{}", uuid::Uuid::now_v7());
    let mut request = EgressRequest::new(method, url)
        .timeout(Duration::from_secs_f64(timeout))
        .max_response_bytes(TEST_BODY_LIMIT)
        .actor("cli")
        .correlation(correlation.clone())
        .reason("egress test");
    if let (Some(secret), Some(kind)) = (secret, kind) {
        request = request.credential(Credential {
            secret: SecretName::new(secret)?,
            placement: placement(kind, header, prefix, param)?,
        });
    }

    let stop = CancelFlag::new();
    let on_ctrl_c = stop.clone();
    super::signals::on_interrupt(move || on_ctrl_c.cancel());
    let outcome = client.send(request, Some(&stop)).await;

    let filter = AuditFilter {
        correlation: Some(correlation),
        newest_first: true,
        limit: 1,
        ..AuditFilter::default()
    };
    let rows = client.vault().audit_list(filter).await?;
    let audit = rows.first().map(RowView::new);
    let (code, summary, json) = match &outcome {
        // The same verdict as the audit row: an error status is a failed check.
        Ok(response) if response.status >= 400 => (
            ExitCode::FAILURE,
            format!(
                "HTTP {} (an error status: the check failed)",
                response.status
            ),
            serde_json::json!({ "status": response.status, "body_bytes": response.body.len(), "truncated": response.truncated, "audit": audit }),
        ),
        Ok(response) => (
            ExitCode::SUCCESS,
            format!(
                "HTTP {} ({} body bytes read{})",
                response.status,
                response.body.len(),
                if response.truncated {
                    ", cut at 64 KiB"
                } else {
                    ""
                }
            ),
            serde_json::json!({ "status": response.status, "body_bytes": response.body.len(), "truncated": response.truncated, "audit": audit }),
        ),
        Err(e) => (
            ExitCode::FAILURE,
            e.to_string(),
            serde_json::json!({ "status": 0, "error": e.to_string(), "cancelled": e.is_cancelled(), "audit": audit }),
        ),
    };
    output::emit(cx.json, &json, || match &audit {
        Some(row) => format!("{summary}\naudit {}", row.line()),
        None => format!("{summary}\naudit: no row found (see the log)"),
    });
    Ok(code)
}
