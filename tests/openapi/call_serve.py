"""Drive a live `runwarden serve` through a client generated from docs/openapi.json.

Usage: python call_serve.py CLIENT_DIR BASE_URL OPERATOR_TOKEN VIEWER_TOKEN

CLIENT_DIR holds the package `openapi-python-client generate --meta none` wrote. Every answer
must decode into the generated models with no field the document does not declare; any
mismatch raises. Prints one JSON line summarising what it saw.
"""

import json
import sys


def undeclared(model, path="answer"):
    """Fields the server sent that the document does not declare, anywhere in `model`."""
    found = []
    fields = [a.name for a in type(model).__attrs_attrs__ if a.name != "additional_properties"]
    # A model with no declared field is a free-form object (an event's payload): anything goes.
    extra = getattr(model, "additional_properties", None)
    if fields and extra:
        found.append(f"{path}: {sorted(extra)}")
    for name in fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if hasattr(type(item), "__attrs_attrs__"):
                found += undeclared(item, f"{path}.{name}[{index}]")
    return found


def typed(answer, model, what):
    """`answer` if it is a `model` with nothing undeclared, else fail saying what came back."""
    if not isinstance(answer, model):
        sys.exit(f"{what}: expected {model.__name__}, got {answer!r}")
    extra = undeclared(answer)
    if extra:
        sys.exit(f"{what}: fields the document does not declare: {extra}")
    return answer


def main():
    client_dir, base_url, operator_token, viewer_token = sys.argv[1:5]
    sys.path.insert(0, client_dir)
    from client import AuthenticatedClient
    from client.api.default import (
        audit_list,
        audit_verify,
        create_run,
        get_run,
        list_runs,
        mcp_servers,
        run_events,
    )
    from client.models import (
        AuditListResponse200,
        CreateRun,
        CreateRunMode,
        Error,
        ErrorErrorCode,
        ListRunsResponse200,
        McpServersResponse200,
        Run,
        RunEventsResponse200,
        RunStatus,
        VerifyReport,
    )

    def connect(token):
        # An answer with a status the document does not list raises.
        return AuthenticatedClient(
            base_url=base_url, token=token, raise_on_unexpected_status=True, timeout=30.0
        )

    operator, viewer = connect(operator_token), connect(viewer_token)
    body = CreateRun(agent="a", prompt="open a ticket", mode=CreateRunMode.SYNC)

    refused = typed(create_run.sync(client=viewer, body=body), Error, "start as a viewer")
    if refused.error.code != ErrorErrorCode.FORBIDDEN:
        sys.exit(f"start as a viewer: expected forbidden, got {refused.error.code}")

    started = typed(create_run.sync(client=operator, body=body), Run, "start a run")
    if started.status != RunStatus.COMPLETED:
        sys.exit(f"the sync run ended {started.status}, not completed")

    listed = typed(list_runs.sync(client=viewer), ListRunsResponse200, "list runs")
    if started.run_id not in [run.run_id for run in listed.runs]:
        sys.exit(f"list runs: {started.run_id} missing from {listed.runs}")

    one = typed(get_run.sync(started.run_id, client=viewer), Run, "get a run")
    if (one.run_id, one.status, one.created) != (started.run_id, started.status, started.created):
        sys.exit(f"get a run: {one} is not the run started: {started}")

    rows = typed(
        audit_list.sync(client=viewer, run=started.run_id), AuditListResponse200, "list audit"
    ).rows
    actions = sorted({row.action for row in rows})
    if "http_call" not in actions or any(row.secret is None for row in rows):
        sys.exit(f"list audit: expected the run's tool call with its secret's name: {rows}")

    report = typed(audit_verify.sync(client=viewer), VerifyReport, "verify audit")
    if not report.intact:
        sys.exit(f"verify audit: the chain of a fresh installation is not intact: {report}")
    servers = typed(mcp_servers.sync(client=viewer), McpServersResponse200, "MCP servers")

    events = typed(
        run_events.sync(started.run_id, client=viewer), RunEventsResponse200, "run events"
    ).events
    if not events:
        sys.exit("run events: none for a completed run")

    print(
        json.dumps(
            {
                "run_id": started.run_id,
                "status": one.status.value,
                "listed": len(listed.runs),
                "audit_actions": actions,
                "audit_rows_verified": report.rows_verified,
                "servers": [server.name for server in servers.servers],
                "event_kinds": [event.kind.value for event in events],
            }
        )
    )


if __name__ == "__main__":
    main()
