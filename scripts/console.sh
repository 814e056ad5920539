#!/usr/bin/env bash
# scripts/console.sh [BINARY]: the operator console (/console/), driven in a real browser.
#
#   1. Debian's chromium, chromium-driver and python3-selenium (plus a font, for readable
#      screenshots, and curl), installed with apt-get only when missing (apt-get update
#      once first).
#   2. The service (BINARY, default target/release/quota-ledger, or env CONSOLE_BINARY) on a
#      free loopback port with an embedded SQLite database in a temp dir, in-process
#      counters, a random admin token and no client tokens; /readyz must answer 200.
#   3. scripts/console/browser_test.py against it, in headless Chromium: the CSP header,
#      sign-in, creating a policy, the budget lookup, the ledger, a recorded denial, the
#      "today" charts and an edit conflict. It prints one line per step and ends with
#      `console: N passed, M failed`; on a failure it saves a screenshot, the page source
#      and the browser log in a temp dir (kept) and prints its path.
#
# The test runs with Debian's /usr/bin/python3, the interpreter python3-selenium installs
# for (a python3 earlier on PATH, such as pyenv's, would not see it). The service is
# stopped and the temp dir removed on every exit path.
# Knobs (environment):
#   CONSOLE_SCREENSHOTS=DIR  also save policies.png, lookup.png, ledger.png, today.png and
#                            conflict.png in DIR (relative to the repo root, like BINARY)
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
readonly ROOT=$PWD
BIN=${1:-${CONSOLE_BINARY:-target/release/quota-ledger}}
[[ $BIN == /* ]] || BIN=$ROOT/$BIN
readonly BIN
readonly PYTHON=/usr/bin/python3
readonly PACKAGES=(chromium chromium-driver python3-selenium fonts-dejavu-core curl)

log() { printf 'console: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

TMP=""
SERVICE_PID=""
URL=""
TOKEN="console-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

stop_service() {
	if [[ -n $SERVICE_PID ]] && kill -0 "$SERVICE_PID" 2>/dev/null; then
		kill -TERM "$SERVICE_PID" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$SERVICE_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$SERVICE_PID" 2>/dev/null || true
		wait "$SERVICE_PID" 2>/dev/null || true
	fi
	SERVICE_PID=""
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_service
	if ((rc != 0)) && [[ -s $TMP/service.log ]]; then
		log "service log (last 20 lines):"
		tail -n 20 "$TMP/service.log" >&2 || true
	fi
	[[ -z $TMP ]] || rm -rf -- "$TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# 1. The browser and Selenium
# ---------------------------------------------------------------------------
install_packages() {
	local missing=() pkg
	for pkg in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
			missing+=("$pkg")
	done
	if ((${#missing[@]})); then
		command -v apt-get >/dev/null || die "missing ${missing[*]}, and no apt-get to install them"
		log "apt-get install ${missing[*]}"
		apt-get update -qq >&2 || die "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			"${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
	fi
	[[ -x /usr/bin/chromium ]] || die "no /usr/bin/chromium"
	[[ -x /usr/bin/chromedriver ]] || die "no /usr/bin/chromedriver"
	"$PYTHON" -c 'import selenium' 2>/dev/null || die "$PYTHON cannot import selenium"
	log "$(/usr/bin/chromium --version 2>/dev/null | head -n1), selenium $("$PYTHON" -c 'import selenium; print(selenium.__version__)')"
}

# ---------------------------------------------------------------------------
# 2. The service
# ---------------------------------------------------------------------------
start_service() {
	local port="" code=""
	env -u REDIS_URL -u REDIS_CLUSTER -u QUOTA_REDIS_PREFIX -u QUOTA_ON_STORE_ERROR \
		-u QUOTA_CLIENT_TOKENS -u QUOTA_GRPC_LISTEN -u QUOTA_LEDGER_BACKLOG_MAX \
		-u OTEL_EXPORTER_OTLP_ENDPOINT \
		QUOTA_LISTEN=127.0.0.1:0 \
		DATABASE_URL="sqlite://$TMP/db.sqlite" \
		QUOTA_ADMIN_TOKEN="$TOKEN" \
		RUST_LOG=warn \
		"$BIN" serve >"$TMP/service.log" 2>&1 &
	SERVICE_PID=$!
	# Port 0: the service picks a free port and prints it.
	for _ in $(seq 300); do
		port=$(sed -n 's/^quota-ledger listening on port \([0-9]*\).*/\1/p' "$TMP/service.log")
		[[ -n $port ]] && break
		kill -0 "$SERVICE_PID" 2>/dev/null || die "the service exited at start (see its log below)"
		sleep 0.1
	done
	[[ -n $port ]] || die "the service did not report its port within 30 s"
	URL="http://127.0.0.1:$port"
	for _ in $(seq 300); do
		code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/readyz" || true)
		[[ $code == 200 ]] && break
		kill -0 "$SERVICE_PID" 2>/dev/null || die "the service exited before it was ready"
		sleep 0.1
	done
	[[ $code == 200 ]] || die "GET /readyz answered $code, not 200, for 30 s"
	log "service at $URL (pid $SERVICE_PID)"
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
[[ -x $BIN ]] || die "no binary at ${BIN#"$ROOT"/} (build it, or pass its path)"
log "binary ${BIN#"$ROOT"/}"
install_packages
TMP=$(mktemp -d "${TMPDIR:-/tmp}/quota-ledger-console.XXXXXXXX")
start_service

args=(--url "$URL" --token "$TOKEN")
if [[ -n ${CONSOLE_SCREENSHOTS:-} ]]; then
	mkdir -p -- "$CONSOLE_SCREENSHOTS"
	args+=(--screenshots "$(cd -- "$CONSOLE_SCREENSHOTS" && pwd)")
fi
# No __pycache__ in the repo. The test's exit status is the script's.
PYTHONDONTWRITEBYTECODE=1 "$PYTHON" "$ROOT/scripts/console/browser_test.py" "${args[@]}"
