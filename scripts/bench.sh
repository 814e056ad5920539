#!/usr/bin/env bash
# scripts/bench.sh: the consume path's throughput, latency and memory, in one table.
#
# The entry point of the benchmark harness, scripts/bench/bench.py (Python 3.9+, standard
# library only; its modules are in scripts/bench/): this wrapper makes sure python3 is
# there (apt-get install python3 when it is missing, unless BENCH_NO_INSTALL=1), then runs
# the harness with the same arguments and environment.
#
# The harness: a redis-benchmark baseline, the service's consume rows on Redis and
# embedded (wrk, and Envoy's ShouldRateLimit over gRPC), the overload rows, Redis memory
# per subject, restart to first consume, the outage budget, the idle Redis load and
# counters verify, the alert rows, and a peer: Limitador's own library behind actix-web
# (scripts/bench/limitador/, a cargo project that only the bench builds) on Redis and in
# memory, with the exactness of each under a burst; then one table with each target beside
# the measured figure. It installs what is missing (wrk, redis-server, redis-tools) with
# apt-get, builds the release binary, the gRPC load generator and the Limitador peer with
# cargo, and stops everything it started on exit.
#
# Knobs (environment; `scripts/bench.sh --help` describes each): BENCH_DURATION,
# BENCH_WARMUP, BENCH_CONNECTIONS, BENCH_FLOOD_CONNECTIONS, BENCH_THREADS, BENCH_SUBJECTS,
# BENCH_MEMORY_SUBJECTS, BENCH_MODES, BENCH_GRPC, BENCH_GRPC_CONNECTIONS, BENCH_NO_BUILD,
# BENCH_BINARY, BENCH_NO_INSTALL, BENCH_OUT, BENCH_IDLE_SECONDS, BENCH_AUTH, BENCH_ALERTS,
# BENCH_SETTINGS,
# BENCH_LIMITADOR, BENCH_LEVELS, BENCH_LEDGER_ENTRIES, BENCH_POSTGRES (0: no private Postgres, started
# otherwise through scripts/with-stores.sh for the Postgres ingest row), BENCH_DOCS.
#
# docs/benchmarks.md: a full run (none of the knobs that shape the measurement set) rewrites
# it once the table is printed: a line naming the date and the machine, then the table.
# BENCH_DOCS=1 rewrites it after any run, BENCH_DOCS=0 never.
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

die() {
	printf 'bench: error: %s\n' "$*" >&2
	exit 1
}

if ! command -v python3 >/dev/null; then
	[[ ${BENCH_NO_INSTALL:-0} != 1 ]] || die "missing: python3 (BENCH_NO_INSTALL=1)"
	command -v apt-get >/dev/null || die "missing: python3, and no apt-get to install it"
	sudo=()
	[[ $(id -u) == 0 ]] || sudo=(sudo)
	printf 'bench: installing python3\n' >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 \
		install -y -q --no-install-recommends python3
fi

harness=(python3 -B scripts/bench/bench.py "$@")
case " $* " in *" --help "* | *" -h "*) exec "${harness[@]}" ;; esac

# The results page (docs/benchmarks.md): after a run that printed its table, the harness
# writes it (BENCH_DOCS_FILE) under the line naming the date and machine made here.
docs=${BENCH_DOCS:-}
if [[ -z $docs ]]; then
	docs=1
	for knob in BENCH_DURATION BENCH_WARMUP BENCH_CONNECTIONS BENCH_FLOOD_CONNECTIONS \
		BENCH_THREADS BENCH_SUBJECTS BENCH_MEMORY_SUBJECTS BENCH_MODES BENCH_GRPC \
		BENCH_GRPC_CONNECTIONS BENCH_AUTH BENCH_ALERTS BENCH_SETTINGS BENCH_LIMITADOR BENCH_LEVELS BENCH_LEDGER_ENTRIES \
		BENCH_POSTGRES BENCH_IDLE_SECONDS; do
		[[ -z ${!knob+set} ]] || docs=0
	done
fi
if [[ $docs == 1 ]]; then
	cpu=$(sed -n '/^model name/{s/^[^:]*:[[:space:]]*//p;q;}' /proc/cpuinfo 2>/dev/null) || cpu=
	cores=$(nproc 2>/dev/null) || cores='?'
	export BENCH_DOCS_FILE=docs/benchmarks.md
	export BENCH_DOCS_HEADER="Measured $(date -u +%F) (UTC) on ${cores} cores, ${cpu:-CPU model unknown}, $(uname -sr)."
else
	unset BENCH_DOCS_FILE BENCH_DOCS_HEADER
fi

if [[ ${BENCH_POSTGRES:-1} != 0 && -z ${QUOTA_TEST_DATABASE_URL:-} ]]; then
	# The Postgres ingest row's private Postgres (no Redis Cluster; the harness starts its
	# own Redis): scripts/with-stores.sh starts it, installing it when missing, forwards
	# signals to the harness and stops it on exit.
	no_install=0
	[[ ${BENCH_NO_INSTALL:-0} != 1 ]] || no_install=1
	exec env WITH_STORES_CLUSTER=0 WITH_STORES_NO_INSTALL=$no_install \
		bash scripts/with-stores.sh "${harness[@]}"
fi
# exec: the harness is this process, so that a SIGTERM or Ctrl-C sent to it reaches the
# harness, which stops what it started.
exec "${harness[@]}"
