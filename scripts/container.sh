#!/usr/bin/env bash
# shellcheck disable=SC2317 # cleanup functions are only reached via `trap`
# scripts/container.sh BINARY: the service in a container image, against real stores.
#
# Run inside scripts/with-stores.sh (it needs QUOTA_TEST_REDIS_URL and
# QUOTA_TEST_DATABASE_URL), as root:
#
#   WITH_STORES_CLUSTER=0 bash scripts/with-stores.sh bash scripts/container.sh target/debug/quota-ledger
#
#   1. Debian's podman, runc and debootstrap (plus curl, and python3 and jq for the
#      examples), installed with apt-get only when missing (apt-get update once first).
#   2. A base image, localhost/debian:bookworm-slim, imported from a Debian bookworm
#      minbase root file system (debootstrap, with ca-certificates) -- CI cannot pull the
#      public images. The root file system's tarball is cached in
#      target/container/bookworm-minbase.tar, so that a second run skips debootstrap.
#   3. localhost/quota-ledger:ci, a single-stage image FROM that base that COPYs BINARY.
#      Its Containerfile is generated from the runtime stage of ./Containerfile (the
#      base image replaced, its apt-get step dropped, COPY --from=build replaced by the
#      binary), so it has the same user, working directory, environment and entrypoint.
#   4. The image run with the embedded default (no stores) and a named volume on its
#      working directory: /readyz answers 200, it runs as a non-root user, and its SQLite
#      file is created on the volume.
#   5. The image run on the stores (--network host, a database of its own): /readyz
#      answers 200, then a smoke test with curl: a policy of 2 SMS a day, and 3 consumes
#      answered 200, 200, 429. SIGTERM must stop it with exit status 0.
#   6. If scripts/run-examples.py exists: the README's examples against the image
#      (run-examples.py --serve "podman … run … localhost/quota-ledger:ci" README.md).
#
# Podman runs with a private configuration and storage in a temp dir (CONTAINERS_CONF,
# CONTAINERS_STORAGE_CONF): it does not touch the machine's own images and containers,
# and everything it made is removed on every exit path. Exits non-zero on any failure.
# Knobs (environment):
#   CONTAINER_STORAGE_DRIVER=overlay|vfs  podman's storage driver (default overlay,
#                                         vfs if overlay does not work here)
#   CONTAINER_NO_CACHE=1                  rebuild the root file system (no cached tarball)
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
readonly ROOT=$PWD
# shellcheck source=scripts/lib/packages.sh
. "$ROOT/scripts/lib/packages.sh"
if [[ $# -ne 1 ]]; then
	printf 'usage: %s BINARY\n' "${0##*/}" >&2
	exit 2
fi
BIN=$1
[[ $BIN == /* ]] || BIN=$ROOT/$BIN
readonly BIN
readonly PACKAGES=(podman runc debootstrap curl)
readonly CACHE_DIR=$ROOT/target/container
readonly ROOTFS_TAR=$CACHE_DIR/bookworm-minbase.tar
readonly BASE_IMAGE=localhost/debian:bookworm-slim
readonly IMAGE=localhost/quota-ledger:ci
readonly EXAMPLES_NAME=quota-ledger-examples
readonly READY_TIMEOUT=60 # seconds

log() { printf 'container: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

TMP=""
CONTAINERS=() # every container name we started
CURRENT=""    # the one running now
TOKEN="container-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"

# Podman, always with runc and the private configuration (CONTAINERS_CONF etc., below).
pod() { podman --runtime runc "$@"; }

now_ms() { echo $(($(date +%s%N) / 1000000)); }
# since START_MS: seconds since START_MS (a now_ms), with one decimal
since() {
	local ms=$(($(now_ms) - $1))
	printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100))
}
# timed LABEL CMD...: runs CMD and logs how long it took. CMD runs as a plain statement, so
# that `set -e` stays in force inside it: never call `timed … || …`.
timed() {
	local label=$1 start
	shift
	start=$(now_ms)
	"$@"
	log "$label: $(since "$start")"
}

cleanup() {
	local rc=$? name
	trap - EXIT ERR
	trap '' INT TERM # finish cleaning up even if interrupted again
	set +e
	if [[ -n $TMP && -n ${CONTAINERS_CONF:-} ]] && command -v podman >/dev/null; then
		for name in "${CONTAINERS[@]}" "$EXAMPLES_NAME"; do
			pod rm -f -t 0 "$name" >/dev/null 2>&1
		done
		pod rmi -a -f >/dev/null 2>&1
	fi
	if [[ -n $TMP && -d $TMP ]]; then
		# Anything podman left mounted in the temp dir (it must not be deleted through).
		grep -F " $TMP/" /proc/mounts | cut -d' ' -f2 | sort -r | xargs -r -n1 umount -l 2>/dev/null
		rm -rf -- "$TMP" || log "could not remove $TMP"
	fi
	if ((rc != 0)); then log "FAILED (exit $rc)"; fi
	exit "$rc"
}
trap cleanup EXIT
set -E # the ERR trap in functions too: name the command that failed
trap 'log "error: line $LINENO: \`$BASH_COMMAND\` failed"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# 1. Packages
# ---------------------------------------------------------------------------
install_packages() {
	local missing
	mapfile -t missing < <(not_installed "${PACKAGES[@]}")
	# The examples' runner, and what the examples use.
	command -v python3 >/dev/null || missing+=(python3)
	command -v jq >/dev/null || missing+=(jq)
	apt_install "${missing[@]}"
}

# ---------------------------------------------------------------------------
# 2. Podman's private configuration and storage
# ---------------------------------------------------------------------------
setup_podman() {
	local driver=${CONTAINER_STORAGE_DRIVER:-overlay}
	export CONTAINERS_CONF=$TMP/containers.conf
	export CONTAINERS_STORAGE_CONF=$TMP/storage.conf
	# No ulimits to copy into containers (a sandbox may refuse to raise them), cgroupfs
	# rather than systemd (CI has no systemd session), and logs and events in files.
	cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$TMP/libpod"

[network]
network_config_dir = "$TMP/networks"
EOF
	write_storage_conf "$driver"
	if ! pod info >"$TMP/podman-info.log" 2>&1; then
		if [[ $driver == overlay && -z ${CONTAINER_STORAGE_DRIVER:-} ]]; then
			log "podman cannot use the overlay driver here; falling back to vfs:"
			tail -n 3 "$TMP/podman-info.log" >&2
			rm -rf -- "$TMP/storage" "$TMP/run" "$TMP/libpod" # its database names the driver
			driver=vfs
			write_storage_conf "$driver"
			pod info >"$TMP/podman-info.log" 2>&1 || {
				cat "$TMP/podman-info.log" >&2
				die "podman info failed"
			}
		else
			cat "$TMP/podman-info.log" >&2
			die "podman info failed"
		fi
	fi
	log "$(podman --version), $(runc --version | head -n1), storage driver $driver"
}

write_storage_conf() {
	cat >"$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "$1"
graphroot = "$TMP/storage"
runroot = "$TMP/run"
EOF
}

# ---------------------------------------------------------------------------
# 3. The base image: Debian bookworm minbase, from debootstrap (cached tarball)
# ---------------------------------------------------------------------------
make_rootfs_tar() {
	local rootfs=$TMP/rootfs
	mkdir -p "$CACHE_DIR"
	log "debootstrap --variant=minbase bookworm (log: $TMP/debootstrap.log)"
	if ! debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" \
		>"$TMP/debootstrap.log" 2>&1; then
		tail -n 30 "$TMP/debootstrap.log" >&2
		die "debootstrap failed"
	fi
	# Slim it like the official bookworm-slim: no package caches, lists or docs.
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
		"$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
	tar --numeric-owner -C "$rootfs" -cf "$ROOTFS_TAR.part" . || die "tar of the root file system failed"
	mv -f "$ROOTFS_TAR.part" "$ROOTFS_TAR"
	rm -rf -- "$rootfs"
}

base_image() {
	if [[ ${CONTAINER_NO_CACHE:-0} == 1 || ! -s $ROOTFS_TAR ]]; then
		timed "debootstrap" make_rootfs_tar
	else
		log "root file system from the cache: ${ROOTFS_TAR#"$ROOT"/}"
	fi
	timed "podman import" pod import -q - "$BASE_IMAGE" <"$ROOTFS_TAR" >/dev/null
}

# ---------------------------------------------------------------------------
# 4. The CI image: ./Containerfile's runtime stage with BINARY copied in
# ---------------------------------------------------------------------------
# Prints the Containerfile of the CI image, derived from the last stage of ./Containerfile.
ci_containerfile() {
	awk -v base="$BASE_IMAGE" '
		# Join continuation lines into whole instructions; comments and blank lines go.
		/^[[:space:]]*(#|$)/ { next }
		{ line = cont ? line " " $0 : $0 }
		/\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, "", line); cont = 1; next }
		{ cont = 0; n++; ins[n] = line }
		END {
			for (i = 1; i <= n; i++) if (toupper(ins[i]) ~ /^FROM /) last = i
			if (!last) exit 1
			print "FROM " base
			for (i = last + 1; i <= n; i++) {
				s = ins[i]; gsub(/[[:space:]]+/, " ", s)
				if (s ~ /^RUN .*apt-get/) continue # ca-certificates: in the base already
				if (s ~ /^COPY --from=build /) { k = split(s, a, " "); print "COPY quota-ledger " a[k]; continue }
				print s
			}
		}
	' "$ROOT/Containerfile"
}

build_image() {
	local ctx=$TMP/context
	mkdir -p "$ctx"
	ci_containerfile >"$ctx/Containerfile" || die "no runtime stage found in ./Containerfile"
	grep -q '^COPY quota-ledger ' "$ctx/Containerfile" ||
		die "./Containerfile's runtime stage has no COPY --from=build of the binary"
	log "the CI image's Containerfile (from ./Containerfile's runtime stage):"
	sed 's/^/    /' "$ctx/Containerfile" >&2
	ln -f -- "$BIN" "$ctx/quota-ledger" 2>/dev/null || cp -- "$BIN" "$ctx/quota-ledger"
	timed "podman build" pod build -q --network none --layers=false -t "$IMAGE" "$ctx" >/dev/null
}

# ---------------------------------------------------------------------------
# 5. Running it
# ---------------------------------------------------------------------------
# run_container NAME [podman run args...]: starts the image in the background on the host's
# network (QUOTA_LISTEN=127.0.0.1:0: it logs the port it took), waits until GET /readyz
# answers 200; sets URL.
run_container() {
	local name=$1 port="" code="" start
	shift
	start=$(now_ms)
	CONTAINERS+=("$name")
	CURRENT=$name
	pod run -d --name "$name" --network host \
		-e QUOTA_LISTEN=127.0.0.1:0 -e QUOTA_ADMIN_TOKEN="$TOKEN" -e RUST_LOG=info \
		"$@" "$IMAGE" >/dev/null || die "podman run $name failed"
	while (($(now_ms) - start < READY_TIMEOUT * 1000)); do
		if [[ -z $port ]]; then
			port=$(pod logs "$name" 2>&1 | sed -n 's/^quota-ledger listening on port \([0-9]*\).*/\1/p' | head -n1) || true
		fi
		if [[ -n $port ]]; then
			code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz" || true)
			[[ $code == 200 ]] && break
		fi
		[[ $(pod inspect -f '{{.State.Running}}' "$name" 2>/dev/null) == true ]] ||
			container_failed "$name" "exited before it was ready"
		sleep 0.1
	done
	[[ $code == 200 ]] ||
		container_failed "$name" "GET /readyz did not answer 200 within ${READY_TIMEOUT} s (last: ${code:-no port})"
	URL="http://127.0.0.1:$port"
	log "$name ready at $URL after $(since "$start")"
}

container_failed() {
	log "container $1 (last 40 log lines):"
	pod logs --tail 40 "$1" >&2 2>&1 || true
	die "container $1: $2"
}

# stop_container NAME: SIGTERM; it must exit with status 0 within 20 s.
stop_container() {
	local name=$1 status
	pod stop -t 20 "$name" >/dev/null || container_failed "$name" "podman stop failed"
	status=$(pod inspect -f '{{.State.ExitCode}}' "$name")
	[[ $status == 0 ]] || container_failed "$name" "exited with status $status after SIGTERM"
	pod rm "$name" >/dev/null || true
}

# expect_status WANT DESCRIPTION CURL_ARGS...
expect_status() {
	local want=$1 what=$2 got
	shift 2
	got=$(curl -s -o "$TMP/body" -w '%{http_code}' "$@" || true)
	if [[ $got != "$want" ]]; then
		log "the answer's body:"
		cat "$TMP/body" >&2 2>/dev/null && echo >&2
		container_failed "$CURRENT" "$what: HTTP $got, expected $want"
	fi
	log "$what: $got"
}

# The embedded default, as docs/container.md runs it: a named volume on the working
# directory, which the non-root user must be able to write.
embedded_check() {
	local name=quota-ledger-ci-embedded-$$ uid
	run_container "$name" -v "quota-ledger-ci-data-$$:/var/lib/quota-ledger"
	uid=$(pod exec "$name" id -u) || container_failed "$name" "podman exec id -u failed"
	[[ $uid != 0 ]] || container_failed "$name" "runs as root"
	pod exec "$name" test -s /var/lib/quota-ledger/quota-ledger.db ||
		container_failed "$name" "no /var/lib/quota-ledger/quota-ledger.db (the working directory's SQLite file)"
	log "$name: uid $uid, /var/lib/quota-ledger/quota-ledger.db on the volume"
	stop_container "$name"
}

# psql from PATH or from the PostgreSQL with-stores.sh runs.
find_psql() {
	local p
	if p=$(command -v psql); then
		printf '%s\n' "$p"
		return 0
	fi
	p=$(
		shopt -s nullglob
		printf '%s\n' /usr/lib/postgresql/*/bin/psql | sort -V | tail -n1
	)
	[[ -n $p && -x $p ]] || die "no psql on PATH nor in /usr/lib/postgresql/*/bin"
	printf '%s\n' "$p"
}

stores_smoke_test() {
	local name=quota-ledger-ci-stores-$$ db=quota_ledger_container_$$ psql admin
	local json=(-H 'Content-Type: application/json')
	psql=$(find_psql)
	"$psql" "$QUOTA_TEST_DATABASE_URL" -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $db" >/dev/null ||
		die "CREATE DATABASE $db failed"
	run_container "$name" -e REDIS_URL="$QUOTA_TEST_REDIS_URL" \
		-e DATABASE_URL="${QUOTA_TEST_DATABASE_URL%/*}/$db"
	admin=(-H "Authorization: Bearer $TOKEN" "${json[@]}")
	expect_status 201 "POST /admin/policies sms-daily" "${admin[@]}" -X POST "$URL/admin/policies" \
		-d '{"id":"sms-daily","action":"sms.send","measure":"count","limit":2,"window":{"type":"calendar","period":"day","timezone":"UTC"}}'
	for want in 200 200 429; do
		expect_status "$want" "POST /quota/consume sms.send u1" "${json[@]}" -X POST "$URL/quota/consume" \
			-d '{"action":"sms.send","subject":"u1"}'
	done
	stop_container "$name"
}

# ---------------------------------------------------------------------------
# 6. The README's examples against the image
# ---------------------------------------------------------------------------
run_examples() {
	[[ -f $ROOT/scripts/run-examples.py ]] || {
		log "no scripts/run-examples.py: skipping the README's examples"
		return 0
	}
	python3 "$ROOT/scripts/run-examples.py" --serve \
		"podman --runtime runc run --rm --name $EXAMPLES_NAME --network host -e QUOTA_LISTEN -e QUOTA_ADMIN_TOKEN $IMAGE" \
		README.md || die "the README's examples failed against the image"
	pod rm -f -t 0 "$EXAMPLES_NAME" >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
[[ -x $BIN ]] || die "no binary at ${BIN#"$ROOT"/} (build it, or pass its path)"
[[ -n ${QUOTA_TEST_REDIS_URL:-} && -n ${QUOTA_TEST_DATABASE_URL:-} ]] ||
	die "QUOTA_TEST_REDIS_URL / QUOTA_TEST_DATABASE_URL unset: run me inside scripts/with-stores.sh"
[[ $(id -u) == 0 ]] || die "run me as root (podman with runc and host networking)"
START=$(now_ms)
log "binary ${BIN#"$ROOT"/} ($(du -m "$BIN" | cut -f1) MB)"
timed "packages" install_packages
TMP=$(mktemp -d "${TMPDIR:-/tmp}/quota-ledger-container.XXXXXXXX")
setup_podman
base_image
build_image
timed "embedded default (no stores)" embedded_check
timed "on Redis + PostgreSQL (smoke test)" stores_smoke_test
timed "README examples" run_examples
log "passed in $(since "$START")"
