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

missing=()
for tool in curl jq python3; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
	command -v apt-get >/dev/null || die "missing ${missing[*]}, and no apt-get to install them"
	log "apt-get install ${missing[*]}"
	apt-get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
fi

exec python3 scripts/run-examples.py --bin "$1" README.md docs/examples.md
