//! The commented example file `runwarden init` writes.

/// The commented file `runwarden init` writes.
pub(crate) const TEMPLATE: &str = r#"# runwarden configuration. Relative paths are relative to this file.
# Every setting here can be overridden from the environment, e.g. RUNWARDEN_DATA_DIR.

# Where the SQLite database and the master key live (RUNWARDEN_DATA_DIR).
data_dir = ".runwarden"

[store]
# The embedded SQLite database (RUNWARDEN_SQLITE_PATH). Default: <data_dir>/runwarden.db
# sqlite_path = ".runwarden/runwarden.db"
# Or a store URL instead (RUNWARDEN_DATABASE_URL, which wins over everything here):
# "sqlite:PATH", or "postgres://USER@HOST:5432/DATABASE" for many nodes on one database
# (keep a password out of this file: put the whole URL in RUNWARDEN_DATABASE_URL).
# url = "sqlite:.runwarden/runwarden.db"
# PostgreSQL only: every store call is bounded. The server cancels a statement after
# statement_timeout_seconds; the client gives up on a whole call after call_timeout_seconds
# (a link that stays open but answers nothing) and the call is retried later.
# statement_timeout_seconds = 10
# call_timeout_seconds = 20
# SQLite only: what an audit intent and a write fence survive (RUNWARDEN_DURABILITY).
# "power_cut" (the default) syncs them to disk before a request leaves. "process_crash" is
# faster but only survives runwarden being killed: after an operating-system crash or a
# power cut, audit rows may be lost and a write may be sent twice.
# durability = "power_cut"

[vault]
# The master key file, mode 0600 (RUNWARDEN_MASTER_KEY_FILE). Default: <data_dir>/master.key
# Alternatively set RUNWARDEN_MASTER_KEY to the key's 64 hex characters.
# master_key_file = ".runwarden/master.key"
# The AEAD for new secrets: "xchacha20poly1305" (default) or "aes256gcm".
algorithm = "xchacha20poly1305"
# The audit log's witness outside the database, mode 0600 (RUNWARDEN_AUDIT_ANCHOR_FILE):
# `audit verify` detects a wipe or a rollback of the log through it. Back it up with the
# database. Default: <data_dir>/audit.anchor
# audit_anchor_file = ".runwarden/audit.anchor"

# A witness the local administrator cannot rewrite silently: every advance of the anchor is
# appended to this file, opened append-only (put it on another machine's mount, or make it
# append-only with chattr +a). `audit verify --witness` checks the log against it.
# [audit]
# witness = "/mnt/audit-witness/runwarden.witness"

[egress]
# Private targets the vault may reach: exact hosts, addresses or CIDRs
# (RUNWARDEN_EGRESS_ALLOW, comma-separated). Public targets need no entry.
allow = []
# allow = ["127.0.0.1", "10.1.2.0/24", "mcp.internal.example"]
connect_timeout_seconds = 10
timeout_seconds = 30

# MCP servers (Streamable HTTP). Tools become <server>__<tool> after `runwarden mcp import`.
# [mcp.servers.tickets]
# url = "https://mcp.example.com/mcp"
# auth = { secret = "tickets-token", placement = "bearer" }  # or "basic"; "header" with
#                                      # header = "X-Api-Key" (and prefix); "query" with param
# auth = { oauth = { grant = "client_credentials", client_id = "agent", client_secret = "tickets-client" } }
#                                      # or grant = "authorization_code" and `runwarden mcp login`
#                                      # or grant = "jwt_bearer" with assertion_file (or
#                                      # assertion_command); or grant = "cross_app_access" with
#                                      # id_token_file, idp_token_endpoint, idp_client_id
# effect = "non_idempotent_write"      # the default; or "idempotent_write", "read_only"
# timeout_seconds = 20                 # one budget per operation, spent across its legs (at least 1)
# max_response_bytes = 2097152         # a longer answer is refused, its size named
# approval = "required"               # every call waits for an operator (default "none")
# approval_timeout_seconds = 86400     # then it is denied as "expired" (default 24 h)
# elicitation = "decline"              # the default; "operator" asks a person (an input decision)
# progress_extends_deadline = false    # true: progress restarts the budget (at most 600 s in all)
# protocol = "auto"                    # 2026-07-28 when served, else 2025-11-25; "2025-11-25" never probes
# [mcp.servers.tickets.tools.search]
# effect = "read_only"
# approval = "none"                    # a tool's own policy beats its server's

# Agents: a model and the imported tools it may call (patterns: exact or prefix*).
# [agents.helper]
# provider = "openai"                  # any OpenAI-compatible base_url; or "anthropic", "scripted"
# model = "gpt-4o-mini"
# base_url = "https://api.openai.com/v1"
# api_key_secret = "openai"            # a vault secret; placed at the wire, never read here
# system = "You are a careful helpdesk agent."
# tools = ["tickets__search", "tickets__create", "files__*"]
# max_rounds = 20
# timeout_seconds = 120                # per model call
# max_tokens = 4096                    # output limit per model call (the default)
# max_output_tokens_total = 50000      # budgets per run; a run request may only lower them
# max_wall_seconds = 600               # from the run's creation
# max_tool_calls = 50
# approve = ["tickets__create"]        # these tools wait for an operator's approval
# approval_timeout_seconds = 3600
# (provider = "anthropic" may leave out api_key_secret for a server that needs no key, and
#  may set anthropic_version = "2023-06-01", the header it sends; that is the default)
# (provider = "scripted" takes script = "plan.json" instead of model and key)

# Workers (`runwarden worker`, `runwarden serve`) for queued runs.
[worker]
lease_seconds = 30          # a dead worker's run is recovered within this
heartbeat_seconds = 10      # leases are renewed in the background, calls in flight too
concurrency = 4
max_requeues = 3            # retries of retryable failures and stale reclaims, together
# status_refresh_seconds = 1 # re-read runs with a call in flight (cancels also wake them)

# The HTTP API (`runwarden serve`) against slow or idle clients.
# [serve]
# max_connections = 1024           # default: half the open-file limit, at most 4096
# max_connections_per_client = 256 # from one address (IPv6: its /64); default a quarter of the cap
# header_read_timeout_seconds = 10 # a request's head must arrive within this
# body_read_timeout_seconds = 30   # and its body within this
# idle_timeout_seconds = 60        # a keep-alive connection with no request is closed
# tls_cert = "tls/cert.pem"        # HTTPS: the certificate chain (PEM, leaf first) ...
# tls_key = "tls/key.pem"          # ... and its private key (PEM); both or neither

# The MCP gateway at /mcp: other agents call these tools through runwarden with an API
# token (docs/gateway.md). A token not listed here cannot use it.
# [gateway.tokens.ide]
# tools = ["github__*"]            # what that token's clients see and may call

# Who may read /metrics (Prometheus/OpenMetrics text).
# [metrics]
# require_token = true             # false: /metrics on the API port needs no token
# listen = "127.0.0.1:9464"        # or a port of its own serving /metrics alone, no token

# OpenTelemetry traces over OTLP/HTTP: a run, its steps, each outbound call, API requests.
# [telemetry]
# otlp_endpoint = "http://127.0.0.1:4318"
# record_arguments = false         # true puts each tool call's arguments on its span

# The web console at / (sign in with an API token).
# [console]
# session_hours = 12               # how long a sign-in lasts (1 to 720)

# Cedar policies over every tool call and model call: allow, deny, or wait for an
# operator's approval (docs/policy.md). Without this section no policy is evaluated.
# [policy]
# files = ["policies/*.cedar"]      # checked at start and on SIGHUP: `runwarden policy validate`

# Log lines on stderr; the level comes from RUNWARDEN_LOG (default warn).
# [log]
# format = "text"                  # or "json": one object per line (--log-format overrides)
"#;
