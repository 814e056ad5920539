#!/usr/bin/env bash
# scripts/console.sh [BINARY]: the operator console (/console/), driven in a real browser.
#
#   1. Debian's chromium, chromium-driver and python3-selenium (plus a font, for readable
#      screenshots, and curl), installed with apt-get only when missing (apt-get update
#      once first).
#   2. The service (BINARY, default target/release/quota-ledger, or env CONSOLE_BINARY) on a
#      free loopback port with an embedded SQLite database in a temp dir, in-process
#      counters, a random admin token, no client tokens, the ledger kept for ever
#      (QUOTA_LEDGER_RETENTION_DAYS=forever, which a lifetime window needs) and webhooks
#      allowed to private addresses (QUOTA_WEBHOOK_ALLOW_PRIVATE=true, for the test's
#      receiver on 127.0.0.1); /readyz must answer 200.
#   3. scripts/console/browser_test.py against it, in headless Chromium: the CSP header,
#      sign-in, creating a policy, the budget lookup, the ledger, a recorded denial, the
#      "today" charts, an edit conflict, the velocity controls through the form's fields
#      (a day from 04:00, a per-request maximum, a month from the 15th, period changes,
#      field errors at their controls, a lifetime's "Never resets"), alert thresholds in
#      the policy form (saved, shown in the row, an error at the control), the webhooks
#      page against a receiver the test runs on 127.0.0.1 (an endpoint created with its
#      secret shown once, a test sent and delivered with a signature that verifies, the
#      secret rotated, a threshold crossing delivered, disable and delete), a lower limit
#      tried in the policy form on the last 7 days (POST /admin/backtest: the newly denied
#      count the test computes, and the policy not saved), then API keys
#      (create, the secret shown once, revoke) and an admin:read key's read-only console
#      (webhooks included). It prints one line per step
#      and ends with `console: N passed, M failed`; on a failure it saves a screenshot,
#      the page source and the browser log in a temp dir (kept) and prints its path.
#
# The test runs with Debian's /usr/bin/python3, the interpreter python3-selenium installs
# for (a python3 earlier on PATH, such as pyenv's, would not see it). The service is
# stopped and the temp dir removed on every exit path.
# Knobs (environment):
#   CONSOLE_SCREENSHOTS=DIR  also save policies.png, lookup.png, ledger.png, today.png,
#                            conflict.png, velocity.png, webhooks.png and backtest.png in DIR
#                            (relative to the repo root, like BINARY)
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
TOKEN="console-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

# shellcheck source=scripts/lib/service.sh
. "$ROOT/scripts/lib/service.sh"
# shellcheck source=scripts/lib/packages.sh
. "$ROOT/scripts/lib/packages.sh"

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
	local missing
	mapfile -t missing < <(not_installed "${PACKAGES[@]}")
	apt_install "${missing[@]}"
	[[ -x /usr/bin/chromium ]] || die "no /usr/bin/chromium"
	[[ -x /usr/bin/chromedriver ]] || die "no /usr/bin/chromedriver"
	"$PYTHON" -c 'import selenium' 2>/dev/null || die "$PYTHON cannot import selenium"
	log "$(/usr/bin/chromium --version 2>/dev/null | head -n1), selenium $("$PYTHON" -c 'import selenium; print(selenium.__version__)')"
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
[[ -x $BIN ]] || die "no binary at ${BIN#"$ROOT"/} (build it, or pass its path)"
log "binary ${BIN#"$ROOT"/}"
install_packages
TMP=$(mktemp -d "${TMPDIR:-/tmp}/quota-ledger-console.XXXXXXXX")
start_service "$TMP" QUOTA_LEDGER_RETENTION_DAYS=forever QUOTA_WEBHOOK_ALLOW_PRIVATE=true

args=(--url "$URL" --token "$TOKEN")
if [[ -n ${CONSOLE_SCREENSHOTS:-} ]]; then
	mkdir -p -- "$CONSOLE_SCREENSHOTS"
	args+=(--screenshots "$(cd -- "$CONSOLE_SCREENSHOTS" && pwd)")
fi
# No __pycache__ in the repo. The test's exit status is the script's.
PYTHONDONTWRITEBYTECODE=1 "$PYTHON" "$ROOT/scripts/console/browser_test.py" "${args[@]}"
