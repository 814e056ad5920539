#!/usr/bin/env bash
# Profiles the HTTP workers of the consume path and draws their flame graph.
#
#   scripts/profile.sh [OUT.svg] [entries|totals] [redis|embedded]
#
# Starts a private Redis (Redis mode) and the release binary on loopback, creates the
# calendar-day policy of the bench's record level rows (100k subjects, recorded as LEVEL),
# loads it with wrk (2 threads, 50 connections, scripts/bench/consume.lua), samples the
# service with `perf record` (DWARF call graphs) for 6 s of that load, and draws the
# `actix-rt` threads (the HTTP workers) with scripts/flamegraph.py, then prints the split
# of their time into parts (flamegraph.py --split). Needs perf (Debian's linux-perf), wrk
# and, in Redis mode, redis-server. TITLE sets the graph's title, QUOTA_BIN the binary.
# Stops everything it started, on failure too.
set -euo pipefail

OUT=${1:-flamegraph.svg}
LEVEL=${2:-totals}
MODE=${3:-redis}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${QUOTA_BIN:-$ROOT/target/release/quota-ledger}
WORK=$(mktemp -d)
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

for tool in perf wrk python3; do
  command -v "$tool" >/dev/null || { echo "profile.sh: $tool is missing" >&2; exit 1; }
done
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release)

PORT=$(free_port)
ENV=(QUOTA_LISTEN="127.0.0.1:$PORT" DATABASE_URL="sqlite://$WORK/ledger.db" QUOTA_ADMIN_TOKEN=profile RUST_LOG=warn)
if [ "$MODE" = redis ]; then
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
  PIDS+=($!)
  ENV+=(REDIS_URL="redis://127.0.0.1:$REDIS_PORT")
fi
env "${ENV[@]}" "$BIN" >"$WORK/service.log" 2>&1 &
SERVICE=$!
PIDS+=("$SERVICE")
for _ in $(seq 200); do
  curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break
  sleep 0.1
done
curl -sf -X POST "http://127.0.0.1:$PORT/admin/policies" -H 'authorization: Bearer profile' \
  -H 'content-type: application/json' \
  -d "{\"id\":\"profiled\",\"action\":\"sms\",\"measure\":\"count\",\"limit\":1000000000,
       \"window\":{\"type\":\"calendar\",\"period\":\"day\",\"timezone\":\"America/New_York\"},
       \"record\":\"$LEVEL\"}" >/dev/null

LOAD=(wrk -t2 -c50 -s "$ROOT/scripts/bench/consume.lua" "http://127.0.0.1:$PORT/quota/consume" -- sms 100000)
"${LOAD[@]:0:3}" -d3s "${LOAD[@]:3}" >/dev/null
perf record -F 997 --call-graph dwarf,65528 -p "$SERVICE" -o "$WORK/perf.data" -- sleep 6 >/dev/null 2>&1 &
RECORD=$!
"${LOAD[@]:0:3}" -d8s "${LOAD[@]:3}" | grep '^BENCH'
wait "$RECORD"
perf script -i "$WORK/perf.data" --no-inline -F comm,tid,period,ip,sym 2>/dev/null >"$WORK/perf.txt"
python3 "$ROOT/scripts/flamegraph.py" "$WORK/perf.txt" --threads actix-rt \
  --title "${TITLE:-HTTP workers, POST /quota/consume, $MODE, $LEVEL}" -o "$OUT" --split
echo "wrote $OUT"
