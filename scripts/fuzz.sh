#!/usr/bin/env bash
# scripts/fuzz.sh: fuzz the HTTP API against its own OpenAPI document with Schemathesis.
#
#   1. Schemathesis (pinned, from PyPI) in a virtualenv inside the repo's target/ dir
#      (target/schemathesis-venv), created on first use and reused afterwards; pip keeps no
#      cache outside the repo.
#   2. The debug binary that `cargo test` builds (target/debug/quota-ledger); it is built
#      only when absent or older than the sources.
#   3. The service on a free loopback port (port 0, read back from its output) with a fresh
#      SQLite file in a temp dir, the embedded counters, and QUOTA_ADMIN_TOKEN (also the only
#      client token, so /quota/* checks auth too); a few policies and an override are created
#      with curl so that consume/check/usage and the override routes find something.
#   4. `schemathesis run <url>/api-docs/openapi.json --checks all` with the token header on
#      every request, a bounded number of examples per operation and a hard time bound.
#
# Exits non-zero on any failure (no 5xx; every status, content type, header and body must be
# the documented one; invalid input rejected, valid input accepted, 401 without the token,
# 405 for undocumented methods, ...). The service is stopped and the temp dir removed on
# every exit path.
#
# Knobs (environment):
#   FUZZ_MAX_EXAMPLES=N  test cases per operation and phase (default 50)
#   FUZZ_TIMEOUT=N       hard bound for the Schemathesis run, in seconds (default 240)
#   FUZZ_SEED=N          reproduce a run (Schemathesis prints the seed it used)
#   FUZZ_REPORT_DIR=DIR  keep a JUnit + NDJSON report there
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
readonly ROOT=$PWD
readonly SCHEMATHESIS_VERSION=4.32.5
readonly VENV=$ROOT/target/schemathesis-venv
readonly BIN=$ROOT/target/debug/quota-ledger
readonly MAX_EXAMPLES=${FUZZ_MAX_EXAMPLES:-50}
readonly TIMEOUT=${FUZZ_TIMEOUT:-240}

log() { printf 'fuzz: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

TMP=""
TOKEN="fuzz-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
# shellcheck source=scripts/lib/service.sh
. "$ROOT/scripts/lib/service.sh"
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_service
	if ((rc != 0)) && [[ -n $TMP && -s $TMP/service.log ]]; then
		log "service log (last 40 lines):"
		tail -n 40 "$TMP/service.log" >&2 || true
	fi
	[[ -z $TMP ]] || rm -rf -- "$TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# 1. Schemathesis
# ---------------------------------------------------------------------------
if ! "$VENV/bin/schemathesis" --version 2>/dev/null | grep -qF "$SCHEMATHESIS_VERSION"; then
	if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
		command -v apt-get >/dev/null || die "Schemathesis needs python3 with venv, and there is no apt-get"
		log "installing python3 and python3-venv"
		DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			python3 python3-venv >&2
	fi
	log "installing schemathesis $SCHEMATHESIS_VERSION into ${VENV#"$ROOT"/}"
	rm -rf -- "$VENV"
	python3 -m venv "$VENV"
	PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
		"$VENV/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION" >&2
fi

# ---------------------------------------------------------------------------
# 2. The binary
# ---------------------------------------------------------------------------
if [[ ! -x $BIN ]] || [[ -n $(find src Cargo.toml Cargo.lock -newer "$BIN" -print -quit) ]]; then
	log "target/debug/quota-ledger is missing or older than the sources: cargo build"
	cargo build --bin quota-ledger >&2
fi

# ---------------------------------------------------------------------------
# 3. The service, with a few policies
# ---------------------------------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/quota-ledger-fuzz.XXXXXXXX")
start_service "$TMP" QUOTA_CLIENT_TOKENS="$TOKEN"

# admin METHOD PATH [BODY]: an authenticated JSON request that must succeed.
admin() {
	local method=$1 path=$2 body=${3:-}
	curl -sS --fail-with-body -o /dev/null -X "$method" "$URL$path" \
		-H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
		${body:+--data "$body"} >&2 ||
		die "$method $path failed"
}
# The ids and actions match the examples in the spec, so that the example phase hits them.
admin POST /admin/policies '{"id": "transfer-usd-daily", "action": "transfer",
  "measure": "amount", "unit": "USD cents", "limit": 200000,
  "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600}}'
admin POST /admin/policies '{"id": "transfers-per-day", "action": "transfer",
  "measure": "count", "limit": 1000,
  "window": {"type": "calendar", "period": "day", "timezone": "America/New_York"}}'
admin POST /admin/policies '{"id": "api-calls", "action": "api.call", "measure": "count",
  "limit": 1000, "window": {"type": "token_bucket", "seconds": 3600}}'
admin PUT /admin/policies/transfer-usd-daily/overrides/user-42 '{"limit": 500000}'

# ---------------------------------------------------------------------------
# 4. Schemathesis
# ---------------------------------------------------------------------------
args=(
	--config-file "$ROOT/scripts/fuzz.toml"
	run "$URL/api-docs/openapi.json"
	--checks all
	--header "Authorization: Bearer $TOKEN"
	--max-examples "$MAX_EXAMPLES"
	--request-timeout 10
	--generation-database none
	--no-color
)
[[ -z ${FUZZ_SEED:-} ]] || args+=(--seed "$FUZZ_SEED")
if [[ -n ${FUZZ_REPORT_DIR:-} ]]; then
	mkdir -p "$FUZZ_REPORT_DIR"
	args+=(--report "junit,ndjson" --report-dir "$(cd "$FUZZ_REPORT_DIR" && pwd)")
fi

log "schemathesis ${args[*]/$TOKEN/***}"
# Run from the temp dir: whatever Schemathesis or Hypothesis writes goes away with it.
rc=0
(cd "$TMP" && timeout --kill-after=10 "$TIMEOUT" "$VENV/bin/schemathesis" "${args[@]}") || rc=$?
if ((rc == 124 || rc == 137)); then
	die "schemathesis did not finish within ${TIMEOUT}s"
fi
kill -0 "$SERVICE_PID" 2>/dev/null || die "the service died during the run"
((rc == 0)) || die "schemathesis found failures (exit $rc)"
log "no failures"
