#!/usr/bin/env bash
# scripts/previous-release.sh: builds the last release's binary, to run beside this tree's
# (the mixed-version test: tests/api/mixed_version.rs), and prints its path.
#
# The release is the one `RELEASE` names: `<version> <commit>`. A git tag may not travel
# with a clone; that file does. Its tree is checked out in a git worktree under
# target/previous-release/ (once per commit) and built into this tree's target directory,
# so the dependencies' build is shared, with the package and binary renamed
# `quota-ledger-release-<commit>`: cargo identifies a package of a workspace by its name,
# version and relative path, which every worktree shares, and would otherwise take one
# tree's build for another's. Nothing else of the release is changed; its library keeps
# its crate name.
#
# Run it before `cargo test` (scripts/test.sh does): cargo holds the target directory
# while tests run. Exits non-zero, saying why, when the release cannot be built.
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
readonly ROOT=$PWD
readonly TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
log() { printf 'previous-release: %s\n' "$*" >&2; }

read -r version commit _ <RELEASE || {
	log "RELEASE must hold '<version> <commit>'"
	exit 1
}
if ! git cat-file -e "${commit}^{commit}" 2>/dev/null; then
	log "commit $commit of release $version is not in this clone; fetching it from origin"
	git fetch --quiet origin "$commit" >&2 || {
		log "cannot fetch $commit (a shallow clone without its origin?): clone with its history"
		exit 1
	}
fi
readonly NAME=quota-ledger-release-${commit:0:12}
readonly TREE=$ROOT/target/previous-release/$version-${commit:0:12}
if [[ ! -f $TREE/Cargo.toml ]]; then
	log "checking out $version ($commit) in $TREE"
	rm -rf "$TREE"
	git worktree prune
	git worktree add --detach --force "$TREE" "$commit" >&2
	sed -i -e "0,/^name = \"quota-ledger\"\$/s//name = \"$NAME\"/" \
		-e "/^\\[\\[bin\\]\\]\$/,/^path/s/^name = \"quota-ledger\"\$/name = \"$NAME\"/" \
		-e "s/^quota-ledger = { path = \"\\.\"/quota-ledger = { package = \"$NAME\", path = \".\"/" \
		-e "s/^\\[lib\\]\$/[lib]\\nname = \"quota_ledger\"/" \
		"$TREE/Cargo.toml"
	sed -i -e "s/^name = \"quota-ledger\"\$/name = \"$NAME\"/" \
		-e "s/^ \"quota-ledger\"\\(,\\?\\)\$/ \"$NAME\"\\1/" "$TREE/Cargo.lock"
fi
log "building $version ($commit)"
CARGO_TARGET_DIR=$TARGET cargo build --quiet --locked --manifest-path "$TREE/Cargo.toml" \
	--bin "$NAME" >&2
printf '%s\n' "$TARGET/debug/$NAME"
