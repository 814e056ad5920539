#!/usr/bin/env bash
# scripts/examples.sh BINARY
#
# Runs every shell block of README.md and docs/examples.md, in order, against a fresh
# service started from BINARY (where a block says `cargo run --release`), and checks the
# answers they show (scripts/run-examples.py). Installs curl and jq with apt-get when
# they are missing: the examples use them, as a reader would.
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

log() { printf 'examples: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[[ $# -eq 1 ]] || die "usage: scripts/examples.sh BINARY"
[[ -x $1 ]] || die "$1 is not an executable"

# shellcheck source=scripts/lib/packages.sh
. scripts/lib/packages.sh
missing=()
for tool in curl jq python3; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
apt_install "${missing[@]}"

exec python3 scripts/run-examples.py --bin "$1" README.md docs/examples.md
