#!/usr/bin/env bash
# shellcheck disable=SC2317 # cleanup functions are only reached via `trap`
# with-stores.sh CMD [ARGS...]
#
# Starts PRIVATE, throw-away instances of Redis (standalone + a 3-master
# Redis Cluster) and PostgreSQL on free 127.0.0.1 ports, with all data in a
# fresh temp dir, exports their URLs, runs CMD, then stops everything and
# deletes the temp dir -- also when CMD fails or the script is interrupted.
# Exits with CMD's exit code (130/143 when interrupted by SIGINT/SIGTERM).
#
# Exported to CMD:
#   QUOTA_TEST_REDIS_URL           redis://127.0.0.1:PORT/
#   QUOTA_TEST_REDIS_PORT          PORT
#   QUOTA_TEST_REDIS_CLUSTER_URLS  redis://127.0.0.1:P1/,redis://127.0.0.1:P2/,redis://127.0.0.1:P3/
#                                  (unset when WITH_STORES_CLUSTER=0)
#   QUOTA_TEST_DATABASE_URL        postgres://postgres@127.0.0.1:PGPORT/postgres
#                                  (admin URL, trust auth; tests create their own databases)
#   QUOTA_TEST_PG_PORT             PGPORT
#   QUOTA_TEST_TMPDIR              the temp dir (deleted afterwards)
#
# Knobs (environment):
#   WITH_STORES_CLUSTER=0    do not start the Redis Cluster (saves ~2-3 s)
#   WITH_STORES_POSTGRES=0   do not start (or install) PostgreSQL; QUOTA_TEST_DATABASE_URL
#                            stays unset
#   WITH_STORES_NO_INSTALL=1 never apt-get install missing servers; fail instead
#   WITH_STORES_TIMEOUT=N    seconds to wait for each server to be ready (20)
#
# Missing redis-server / PostgreSQL server binaries are installed with apt-get
# (Debian/Ubuntu) when they are not found.
#
# Notes:
#   * Without a terminal on stdin (CI), CMD runs in its own process group so
#     that SIGINT/SIGTERM/SIGHUP can be forwarded to its whole process tree
#     (cargo and the test binaries it spawned); leftovers are SIGKILLed.
#     With a terminal, CMD stays in the foreground group (it can read the
#     terminal, e.g. `with-stores.sh bash`, and gets ^C itself); the script
#     then exits when CMD does.
#   * PostgreSQL refuses to run as root; as root the server runs as the
#     `postgres` system user (created if missing) via runuser.
set -euo pipefail

readonly STARTUP_TIMEOUT=${WITH_STORES_TIMEOUT:-20} # seconds per readiness wait

log() { printf 'with-stores: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

if [[ $# -eq 0 ]]; then
	printf 'usage: %s CMD [ARGS...]\n' "${0##*/}" >&2
	exit 2
fi

# ---------------------------------------------------------------------------
# State used by cleanup (must be safe to run at any point of the startup).
# ---------------------------------------------------------------------------
TMP_ROOT=""
CHILD_PID=""
CHILD_GROUP=0 # 1: CMD leads its own process group (non-terminal mode)
FORWARD_INT=0 # 1: on SIGINT only forward it and keep waiting (terminal mode)
GOT_SIGNAL=0
PG_BIN=""
PG_DATA=""
PG_STARTED=0
REDIS_PIDFILES=() # every redis-server we started (standalone + cluster)
AS_PG=()          # command prefix to run a PostgreSQL binary (runuser when root)

# Send a signal to CMD's process group (falls back to the pid itself).
signal_child() {
	local sig=$1
	[[ -n $CHILD_PID ]] || return 0
	if ((CHILD_GROUP)); then
		kill -"$sig" -- "-$CHILD_PID" 2>/dev/null && return 0
	fi
	kill -"$sig" "$CHILD_PID" 2>/dev/null || true
}

# True if pid $1 exists and is not a zombie. (Daemonized servers are
# reparented to PID 1, which may be slow to reap them; a zombie is "gone".)
alive() {
	local stat
	kill -0 "$1" 2>/dev/null || return 1
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0 # no /proc: trust kill -0
	stat=${stat##*) }                                    # skip "pid (comm) "
	[[ ${stat%% *} != Z ]]
}

# Wait up to $2 seconds for pid $1 to go away. Returns 1 if it is still alive.
wait_gone() {
	local pid=$1 secs=$2 i
	for ((i = 0; i < secs * 10; i++)); do
		alive "$pid" || return 0
		sleep 0.1
	done
	! alive "$pid"
}

stop_child() {
	[[ -n $CHILD_PID ]] || return 0
	if alive "$CHILD_PID"; then
		signal_child TERM
		if ! wait_gone "$CHILD_PID" 10; then
			log "command did not exit after SIGTERM; sending SIGKILL"
			signal_child KILL
			wait_gone "$CHILD_PID" 5 || true
		fi
	fi
	# A command may leave background children behind in its process group.
	if ((CHILD_GROUP)); then
		kill -KILL -- "-$CHILD_PID" 2>/dev/null || true
	fi
	CHILD_PID=""
CHILD_GROUP=0 # 1: CMD leads its own process group (non-terminal mode)
FORWARD_INT=0 # 1: on SIGINT only forward it and keep waiting (terminal mode)
GOT_SIGNAL=0
}

stop_redis() {
	local pidfile pid
	for pidfile in "${REDIS_PIDFILES[@]}"; do
		[[ -s $pidfile ]] || continue
		pid=$(<"$pidfile")
		[[ $pid =~ ^[0-9]+$ ]] || continue
		kill -TERM "$pid" 2>/dev/null || continue
		if ! wait_gone "$pid" 10; then
			log "redis-server $pid did not stop; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			wait_gone "$pid" 5 || true
		fi
	done
	REDIS_PIDFILES=()
}

stop_postgres() {
	local pid=""
	[[ $PG_STARTED == 1 && -n $PG_DATA ]] || return 0
	if [[ -s $PG_DATA/postmaster.pid ]]; then
		pid=$(head -n1 "$PG_DATA/postmaster.pid")
	fi
	# The data is thrown away anyway, so an immediate shutdown is fine.
	(cd / && "${AS_PG[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -m immediate -w -t 20 stop) >/dev/null ||
		log "pg_ctl stop failed"
	# pg_ctl returns once postmaster.pid is gone; the process may linger briefly.
	if [[ $pid =~ ^[0-9]+$ ]] && ! wait_gone "$pid" 10; then
		log "postgres $pid still running; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone "$pid" 5 || true
	fi
	PG_STARTED=0
}

cleanup() {
	local rc=$?
	trap - EXIT
	trap '' INT TERM # finish cleaning up even if interrupted again
	set +e
	stop_child
	stop_redis
	stop_postgres
	if [[ -n $TMP_ROOT && -d $TMP_ROOT ]]; then
		rm -rf -- "$TMP_ROOT" || log "could not remove $TMP_ROOT"
	fi
	log "stopped stores, removed temp dir (exit $rc)"
	exit "$rc"
}

on_signal() {
	local sig=$1 code=$2
	GOT_SIGNAL=1
	if [[ $sig == INT && $FORWARD_INT == 1 && -n $CHILD_PID ]]; then
		# Terminal mode: CMD got the ^C itself; like a shell, let it decide
		# whether to exit (we exit with its status when it does).
		signal_child INT
		return 0
	fi
	log "received SIG$sig; stopping"
	if [[ -n $CHILD_PID ]]; then
		signal_child "$sig"
		# Give the command a chance to exit on its own; cleanup escalates.
		wait_gone "$CHILD_PID" 10 || true
	fi
	exit "$code" # runs cleanup via the EXIT trap
}

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

# ---------------------------------------------------------------------------
# Finding / installing the servers
# ---------------------------------------------------------------------------

# Directory holding initdb+pg_ctl: PATH first, then the highest
# /usr/lib/postgresql/*/bin. Prints nothing if not found.
find_pg_bin() {
	local initdb dir
	if initdb=$(command -v initdb) && command -v pg_ctl >/dev/null; then
		dir=$(dirname -- "$(readlink -f -- "$initdb")")
		if [[ -x $dir/pg_ctl && -x $dir/postgres ]]; then
			printf '%s\n' "$dir"
			return 0
		fi
	fi
	dir=$(
		shopt -s nullglob
		for d in /usr/lib/postgresql/*/bin; do
			[[ -x $d/initdb && -x $d/pg_ctl && -x $d/postgres ]] && printf '%s\n' "$d"
		done | sort -V | tail -n1
	)
	[[ -n $dir ]] && printf '%s\n' "$dir"
	return 0
}

apt_get() {
	local sudo=() attempt
	if [[ $(id -u) != 0 ]]; then
		command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
		sudo=(sudo)
	fi
	# DPkg::Lock::Timeout waits for a concurrent apt/dpkg; the retry loop
	# covers the lists lock of `apt-get update` and transient mirror errors.
	for attempt in 1 2 3; do
		if "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
			apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3 "$@"; then
			return 0
		fi
		log "apt-get $1 failed (attempt $attempt/3); retrying in 10 s"
		sleep 10
	done
	die "apt-get $* failed"
}

ensure_servers() {
	local need=()
	if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
		need+=(redis-server redis-tools)
	fi
	if [[ ${WITH_STORES_POSTGRES:-1} != 0 ]]; then
		PG_BIN=$(find_pg_bin)
		[[ -n $PG_BIN ]] || need+=(postgresql postgresql-client)
	fi
	# The TLS tests make their certificates with openssl; the clock tests skew one
	# instance's clock with libfaketime.
	command -v openssl >/dev/null || need+=(openssl)
	command -v faketime >/dev/null || need+=(faketime)
	((${#need[@]})) || return 0
	[[ ${WITH_STORES_NO_INSTALL:-0} != 1 ]] || die "missing: ${need[*]} (WITH_STORES_NO_INSTALL=1)"
	command -v apt-get >/dev/null || die "missing: ${need[*]}, and no apt-get to install them"
	log "installing missing packages: ${need[*]}"
	apt_get update -q
	apt_get install -y -q --no-install-recommends "${need[@]}"
	command -v redis-server >/dev/null || die "redis-server still not found after install"
	[[ ${WITH_STORES_POSTGRES:-1} != 0 ]] || return 0
	PG_BIN=$(find_pg_bin)
	[[ -n $PG_BIN ]] || die "PostgreSQL server binaries still not found after install"
}

# ---------------------------------------------------------------------------
# Free ports
# ---------------------------------------------------------------------------
USED_PORTS=" "
HAVE_PYTHON=0
if command -v python3 >/dev/null && python3 -c '' 2>/dev/null; then HAVE_PYTHON=1; fi

# True if nothing can be / is bound on 127.0.0.1:$1.
port_free() {
	local p=$1
	if ((HAVE_PYTHON)); then
		python3 - "$p" 2>/dev/null <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
EOF
	else
		# Fallback: a successful connect means someone is listening.
		if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then return 1; fi
	fi
}

# Prints a free port in [20000, 54999] not handed out before in this run.
# With "cluster", PORT+10000 (the Redis Cluster bus port) must be free too.
pick_port() {
	local want_bus=${1:-} p i
	for ((i = 0; i < 200; i++)); do
		p=$((20000 + RANDOM % 35000))
		[[ $USED_PORTS == *" $p "* || $USED_PORTS == *" $((p + 10000)) "* ]] && continue
		port_free "$p" || continue
		if [[ $want_bus == cluster ]]; then
			port_free "$((p + 10000))" || continue
		fi
		printf '%s\n' "$p"
		return 0
	done
	die "could not find a free port"
}

# pick_port runs in a command substitution (subshell), so record the result
# in the parent: reserve PORT [PORT+10000].
reserve() { USED_PORTS+="$* "; }

# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------
wait_redis() {
	local port=$1 logfile=$2 i
	for ((i = 0; i < STARTUP_TIMEOUT * 10; i++)); do
		if [[ $(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; then
			return 0
		fi
		sleep 0.1
	done
	log "redis-server on port $port did not answer PING within ${STARTUP_TIMEOUT}s; log:"
	tail -n 20 "$logfile" >&2 2>/dev/null || true
	die "redis-server failed to start"
}

# start_redis PORT DIR [extra redis-server args...]
start_redis() {
	local port=$1 dir=$2
	shift 2
	mkdir -p "$dir"
	REDIS_PIDFILES+=("$dir/redis.pid")
	redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
		--save '' --appendonly no --daemonize yes \
		--dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
		"$@" ||
		die "redis-server failed to start on port $port (see $dir/redis.log)"
	wait_redis "$port" "$dir/redis.log"
}

# ---------------------------------------------------------------------------
# Redis Cluster: 3 masters, no replicas, each on a free port P whose bus port
# P+10000 is free too (hence ports < 55000).
# ---------------------------------------------------------------------------
start_redis_cluster() {
	local ports=() urls=() p i state create_log="$TMP_ROOT/redis-cluster/create.log"
	mkdir -p "$TMP_ROOT/redis-cluster"
	for i in 1 2 3; do
		p=$(pick_port cluster)
		reserve "$p" "$((p + 10000))"
		ports+=("$p")
		urls+=("redis://127.0.0.1:$p/")
	done
	for p in "${ports[@]}"; do
		start_redis "$p" "$TMP_ROOT/redis-cluster/$p" \
			--cluster-enabled yes --cluster-config-file "nodes-$p.conf" \
			--cluster-node-timeout 5000
	done
	if ! redis-cli --cluster create "127.0.0.1:${ports[0]}" "127.0.0.1:${ports[1]}" \
		"127.0.0.1:${ports[2]}" --cluster-replicas 0 --cluster-yes >"$create_log" 2>&1; then
		cat "$create_log" >&2
		die "redis-cli --cluster create failed"
	fi
	for p in "${ports[@]}"; do
		for ((i = 0; ; i++)); do
			state=$(redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | tr -d '\r' |
				sed -n 's/^cluster_state://p')
			[[ $state == ok ]] && break
			((i < STARTUP_TIMEOUT * 10)) ||
				die "redis cluster node $p not ok after ${STARTUP_TIMEOUT}s (cluster_state=${state:-?})"
			sleep 0.1
		done
	done
	export QUOTA_TEST_REDIS_CLUSTER_URLS
	QUOTA_TEST_REDIS_CLUSTER_URLS=$(
		IFS=,
		printf '%s' "${urls[*]}"
	)
	log "redis cluster: ${ports[*]} (3 masters)"
}

# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------
start_postgres() {
	local port root sock i
	port=$(pick_port)
	reserve "$port"
	root=$TMP_ROOT/pg
	sock=$root/sock
	PG_DATA=$root/data
	mkdir -p "$root" "$sock"

	if [[ $(id -u) == 0 ]]; then
		if ! id -u postgres >/dev/null 2>&1; then
			log "creating system user 'postgres' (PostgreSQL refuses to run as root)"
			useradd --system --user-group --no-create-home --home-dir /nonexistent \
				--shell /usr/sbin/nologin postgres
		fi
		chown -R postgres: "$root"
		AS_PG=(runuser -u postgres --)
		"${AS_PG[@]}" test -x "$root" ||
			die "user postgres cannot access $root (check permissions of ${TMP_ROOT%/*})"
	fi

	# cd / : the postgres user may not be able to access the current directory.
	if ! (cd / && "${AS_PG[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -A trust -U postgres \
		--no-sync -E UTF8 --locale=C) >"$root/initdb.log" 2>&1; then
		cat "$root/initdb.log" >&2
		die "initdb failed"
	fi
	# Settings go into postgresql.conf rather than `pg_ctl -o` (no quoting issues).
	cat >>"$PG_DATA/postgresql.conf" <<EOF

# --- with-stores.sh: throw-away test instance ---
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$sock'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 300
EOF
	PG_STARTED=1
	if ! (cd / && "${AS_PG[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$root/postgres.log" \
		-w -t "$STARTUP_TIMEOUT" start) >"$root/pg_ctl.log" 2>&1; then
		cat "$root/pg_ctl.log" >&2
		tail -n 30 "$root/postgres.log" >&2 2>/dev/null || true
		die "PostgreSQL failed to start"
	fi
	for ((i = 0; ; i++)); do
		if [[ -x $PG_BIN/pg_isready ]]; then
			"$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres && break
		elif command -v psql >/dev/null; then
			psql -qAt -h 127.0.0.1 -p "$port" -U postgres -d postgres -c 'select 1' >/dev/null 2>&1 && break
		else
			break # pg_ctl -w already waited for "ready"
		fi
		((i < STARTUP_TIMEOUT * 10)) || die "PostgreSQL on port $port not ready after ${STARTUP_TIMEOUT}s"
		sleep 0.1
	done
	export QUOTA_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
	export QUOTA_TEST_PG_PORT=$port
	log "postgres: 127.0.0.1:$port ($("$PG_BIN/postgres" --version), $PG_BIN)"
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
ensure_servers

TMP_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/with-stores.XXXXXXXX")
chmod 755 "$TMP_ROOT" # the postgres user must be able to traverse it
export QUOTA_TEST_TMPDIR=$TMP_ROOT
log "temp dir: $TMP_ROOT"

redis_port=$(pick_port)
reserve "$redis_port"
start_redis "$redis_port" "$TMP_ROOT/redis"
export QUOTA_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/"
export QUOTA_TEST_REDIS_PORT=$redis_port
log "redis: 127.0.0.1:$redis_port ($(redis-server --version | cut -d' ' -f3 | sed 's/^v=//'))"

if [[ ${WITH_STORES_CLUSTER:-1} != 0 ]]; then
	start_redis_cluster
fi

if [[ ${WITH_STORES_POSTGRES:-1} != 0 ]]; then
	start_postgres
fi

log "running: $*"
# CMD runs in the background and we `wait` for it, because bash defers traps
# while a foreground command runs (SIGTERM would only be handled after CMD
# ended). `<&0` keeps stdin (background jobs otherwise get /dev/null).
if [[ -t 0 ]]; then
	# Terminal: stay in the terminal's foreground process group so CMD can
	# read the terminal (e.g. `with-stores.sh bash`) and gets ^C directly.
	# Async commands start with SIGINT/SIGQUIT ignored; undo that.
	FORWARD_INT=1
	(
		trap - INT QUIT
		exec "$@"
	) <&0 &
	CHILD_PID=$!
else
	# No terminal (CI): own process group (set -m) so that a signal can be
	# forwarded to CMD's whole process tree (cargo and its test binaries).
	set -m
	"$@" <&0 &
	CHILD_PID=$!
	set +m
	CHILD_GROUP=1
fi
interrupted=0
while :; do
	GOT_SIGNAL=0
	rc=0
	wait "$CHILD_PID" || rc=$?
	# A trapped signal that did not end the script interrupts `wait`: wait again.
	((GOT_SIGNAL)) || break
	interrupted=1
done
# After an interrupted `wait`, bash may not report CMD's real status any more
# (bash 5.2 gives -1 when CMD exited right at the ^C, even if it caught it and
# exited with its own code): report 128+SIGINT then.
if ((interrupted && (rc < 0 || rc > 255 || rc == 127))); then rc=130; fi
exit "$rc" # cleanup (EXIT trap) also kills anything CMD left in its process group
