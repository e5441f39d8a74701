#!/usr/bin/env bash
# The client the official MCP conformance suite (@modelcontextprotocol/conformance) drives:
# runwarden's own CLI, as an operator would use it. The suite runs
#   client.sh SERVER_URL        with MCP_CONFORMANCE_SCENARIO naming the scenario
# and judges what reaches its server. Each run gets a fresh runwarden home (init, a config
# naming the scenario's server, loopback allowed) and does what the scenario asks of a
# client: import the catalogue (tools/list), then the calls. $RUNWARDEN_BIN is the binary.
set -euo pipefail

url="${1:?usage: client.sh SERVER_URL}"
scenario="${MCP_CONFORMANCE_SCENARIO:?the suite sets MCP_CONFORMANCE_SCENARIO}"
bin="${RUNWARDEN_BIN:?set RUNWARDEN_BIN to the runwarden binary}"

home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
cd "$home"
rw() { "$bin" --config "$home/runwarden.toml" "$@"; }

rw init >/dev/null
# The suite's servers listen on localhost; admit loopback only.
sed -i 's/^allow = \[\]$/allow = ["127.0.0.1", "::1"]/' runwarden.toml
grep -q '^allow = \["127.0.0.1", "::1"\]$' runwarden.toml || { echo "client.sh: the config template changed" >&2; exit 1; }
# M18: the auth/* scenarios put the server behind OAuth. The suite passes what a real
# operator would configure (client ids, secrets, a private key) in MCP_CONFORMANCE_CONTEXT;
# secrets go into the vault, the config names them.
context="${MCP_CONFORMANCE_CONTEXT:-{\}}"
ctx() { python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print(v if v is not None else "")' "$context" "$1"; }
auth=""
case "$scenario" in
    auth/client-credentials-basic)
        printf '%s' "$(ctx client_secret)" | rw secret put conf-client >/dev/null
        auth="auth = { oauth = { grant = \"client_credentials\", client_id = \"$(ctx client_id)\", client_secret = \"conf-client\", auth_method = \"client_secret_basic\" } }"
        ;;
    auth/client-credentials-jwt)
        printf '%s' "$(ctx private_key_pem)" | rw secret put conf-key >/dev/null
        auth="auth = { oauth = { grant = \"client_credentials\", client_id = \"$(ctx client_id)\", private_key = \"conf-key\", signing_alg = \"$(ctx signing_algorithm)\" } }"
        ;;
    auth/pre-registration)
        printf '%s' "$(ctx client_secret)" | rw secret put conf-client >/dev/null
        auth="auth = { oauth = { grant = \"authorization_code\", client_id = \"$(ctx client_id)\", client_secret = \"conf-client\" } }"
        ;;
    auth/cross-app-access-complete-flow|auth/enterprise-managed-authorization)
        # SEP-990: the user's ID token from the enterprise IdP, exchanged there for an
        # ID-JAG, then the JWT bearer grant at the MCP server's authorization server. The
        # ID token is read from a file in one scenario and from a command in the other.
        printf '%s' "$(ctx client_secret)" | rw secret put conf-client >/dev/null
        (umask 077; printf '%s\n' "$(ctx idp_id_token)" > "$home/id-token.jwt")
        source='id_token_file = "id-token.jwt"'
        [[ "$scenario" == auth/enterprise-managed-authorization ]] && source="id_token_command = [\"cat\", \"$home/id-token.jwt\"]"
        auth="auth = { oauth = { grant = \"cross_app_access\", client_id = \"$(ctx client_id)\", client_secret = \"conf-client\", $source, idp_token_endpoint = \"$(ctx idp_token_endpoint)\", idp_client_id = \"$(ctx idp_client_id)\" } }"
        ;;
    auth/wif-jwt-bearer)
        # Workload identity federation (RFC 7523): the platform's JWT in a file.
        (umask 077; printf '%s\n' "$(ctx valid_jwt)" > "$home/workload.jwt")
        auth="auth = { oauth = { grant = \"jwt_bearer\", client_id = \"$(ctx client_id)\", assertion_file = \"workload.jwt\" } }"
        ;;
    auth/*)
        # A Client ID Metadata Document URL is used where the authorization server
        # supports it (auth/basic-cimd); elsewhere the client registers itself (RFC 7591).
        auth='auth = { oauth = { grant = "authorization_code", client_metadata_url = "https://conformance-test.local/client-metadata.json" } }'
        ;;
esac
cat >> runwarden.toml <<TOML

[mcp.servers.conf]
url = "$url"
elicitation = "operator"
# A scenario that goes wrong fails in seconds, not in the default 20 s.
timeout_seconds = 8
$auth
TOML

# The operator's browser: every authorization URL the CLI prints is opened (the suite's
# authorization server answers at once with a redirect to runwarden's loopback listener).
browser() {
    while IFS= read -r line; do
        printf '%s\n' "$line" >&2
        case "$line" in
            "authorize server "*": open "*) curl -s -o /dev/null -L --max-time 10 "${line##*: open }" & ;;
        esac
    done
}

case "$scenario" in
    tools_call)
        rw mcp import conf
        rw mcp call conf add_numbers --args '{"a": 5, "b": 3}'
        ;;
    elicitation-sep1034-client-defaults)
        rw mcp import conf
        # The operator answers the server's question with nothing of their own: every field
        # takes the default the requested schema gives (SEP-1034).
        rw mcp call conf test_client_elicitation_defaults --answer '{}'
        ;;
    sse-retry)
        rw mcp import conf
        rw mcp call conf test_reconnection
        ;;
    json-schema-2020-12-preservation)
        # Echo the focal tool's input schema back exactly as it was received.
        rw --json mcp import conf > import.json
        schema="$(python3 -c '
import json, sys
report = json.load(open("import.json"))
tool = next(t for t in report["tools"] if t["remote_name"] == "json_schema_2020_12_tool")
print(json.dumps({"schema": tool["received_input_schema"]}))
')"
        rw mcp call conf json_schema_echo --args "$schema"
        ;;
    sep-2322-client-request-state)
        # M19: each tool answers input_required; the operator's answer is given up front and
        # the call is re-issued with it and the server's requestState.
        rw mcp import conf
        rw mcp call conf test_mrtr_echo_state --answer '{"confirmed": true}'
        rw mcp call conf test_mrtr_no_state --answer '{"confirmed": true}'
        rw mcp call conf test_mrtr_unrelated
        rw mcp call conf test_mrtr_no_result_type
        ;;
    http-standard-headers)
        rw mcp import conf
        rw mcp call conf test_headers
        rw mcp call conf my-hyphenated-tool
        ;;
    http-custom-headers)
        # The calls (and their arguments) come from the scenario's context.
        rw mcp import conf
        python3 -c '
import json, os
for call in json.loads(os.environ["MCP_CONFORMANCE_CONTEXT"])["toolCalls"]:
    print(call["name"])
    print(json.dumps(call["arguments"]))
' | while IFS= read -r name && IFS= read -r args; do
            rw mcp call conf "$name" --args "$args"
        done
        ;;
    http-invalid-tool-headers)
        # The import refuses every tool whose x-mcp-header is invalid; a call of one is
        # refused before anything is sent (so each of those must fail here).
        rw mcp import conf
        rw mcp call conf valid_tool --args '{"region": "us-east1"}'
        for tool in invalid_empty_header invalid_object_header invalid_array_header \
                invalid_null_header invalid_number_header invalid_duplicate_same_case \
                invalid_duplicate_diff_case invalid_space_in_name invalid_colon_in_name \
                invalid_non_ascii_name invalid_control_char_name; do
            if rw mcp call conf "$tool" --args '{}' >/dev/null 2>&1; then
                echo "client.sh: $tool was called" >&2
                exit 1
            fi
        done
        ;;
    auth/scope-step-up)
        # tools/list needs one scope, tools/call a wider one (403 insufficient_scope).
        rw mcp import conf 2> >(browser)
        rw mcp call conf test-tool 2> >(browser)
        ;;
    auth/*)
        rw mcp import conf 2> >(browser)
        ;;
    *)
        # initialize, request-metadata, json-schema-ref-no-deref and any scenario that only needs the
        # handshake and discovery: import the catalogue.
        rw mcp import conf
        ;;
esac
