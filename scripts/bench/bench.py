"""quota-ledger's benchmark harness: the consume path's throughput, latency and memory, in
one table. Run it as scripts/bench.sh (which makes sure python3 is there).

On this machine, all on loopback, in one run:
  1. a baseline: redis-benchmark running a minimal atomic check-and-charge Lua script
     (scripts/bench/baseline.lua) with 50 clients over 100k keys, against a private Redis;
  2. the service in release mode on that Redis, then on its embedded default (no Redis):
     POST /quota/consume with wrk at 50 connections, for a calendar-day policy, a rolling
     24 h policy in 24 buckets, a token bucket, a two-policy action (count + amount) and a
     3-budget consume (calendar-day budgets of the subject, of its country, one of 20 drawn
     uniformly, and of the whole action, charged in one call), each with 1k, 100k and 1M
     distinct subjects (scripts/bench/consume.lua); each 3-budget row, against two more
     calendar-day rows right before and after it, gives what budgets shared by subjects
     cost; and Envoy's ShouldRateLimit over gRPC for the calendar-day policy at 100k
     subjects (at the first subject count when 100k is not measured), right after its HTTP
     row, with 50 streams over 2 HTTP/2 connections (examples/rls_load.rs: no packaged gRPC
     load generator here); then the calendar day at 2,000 connections (the overload rows),
     and the ledger lag;
  3. Redis memory per subject per policy for each window type: the used_memory delta after
     charging 100k distinct subjects through the service (scripts/bench/fill.lua), and the
     service's resident memory;
  4. the embedded default restarted on the ledger its runs left, after a graceful stop
     (which snapshots its counters): the time until its first consume is answered (the
     counters are rebuilt from the snapshot and the ledger after it first); then a fresh
     one killed with SIGKILL after a minute of full load, and started again: the same
     time, which a busy service's snapshots (every QUOTA_SNAPSHOT_ENTRIES entries) bound;
  5. the outage budget: the service on Redis while its ledger database refuses writes (a
     SQLite lock held by another process, as a Postgres outage looks to the drain): the
     consumes/s, the ledger entries held in Redis, the Redis memory each takes and the
     size of one, and how long the backlog takes to drain once the database is back; then
     the same backlog drained into a Postgres ledger, with the service idle: entries/s
     (scripts/bench/ingest.py);
  6. the idle Redis load: the commands per second Redis runs for 1, then 4 instances with
     no traffic (their ledger drain and hold sweeper);
  7. counters verify on the ledger of the runs, embedded and with Redis: seconds per
     million ledger entries, and the consumes/s of the calendar-day row while verifies run
     back to back against the same row alone; and a backtest on the embedded ledger
     (scripts/bench/backtest.py): seconds per million entries replayed;
  8. the alert rows (scripts/bench/alerts.py): consumes with alert thresholds and a webhook
     against none, and the time from a crossing to its delivery under that load; the
     settings rows (scripts/bench/settings.py): checkpoints at their default interval
     against none, and QUOTA_REDIS_MIN_REPLICAS=1 against 0 with one replica;
  9. the Limitador rows (scripts/bench/limitador.py): Limitador's own library behind
     actix-web, as limitador-server serves it (scripts/bench/limitador/, a cargo project that
     only the bench builds), its POST /check_and_report with wrk as the calendar-day rows,
     at each subject count: on the private Redis (flushed) right after the Redis mode's
     consume rows, in memory right after the embedded default's; and at the end, the
     exactness rows: 200 requests at once for one subject at a limit of 5, against the
     service in each mode (a policy recording entries, and one recording totals) and the
     peer beside it, how many were admitted; after the peer's rows of each mode, the
     record level rows (scripts/bench/levels.py): the calendar day recorded as entries and
     as totals, and the peer, in 3 alternating rounds at 100k subjects, each target read
     on the median of its rounds, then counters verify;
 10. the ledger at scale (scripts/bench/scale.py): a fresh ledger filled with 10 million
     entries over 24 hours through the service's own store, then the Today page's
     activity and the query API's filters timed on it;
then prints one table: every row, and each target (named by what it measures) beside the
measured figure. Steps 3, 5 and 6 run after the Redis mode's rows, 4 after the
embedded one's, 7 after each.

Installs what is missing (wrk, redis-server, redis-tools) with apt-get, builds the release
binary, the gRPC load generator and the Limitador peer (into target/limitador-peer/) with
cargo (incrementally), and stops everything it started on exit, on failure and on Ctrl-C /
SIGTERM too.
Timings are noisy on a shared machine: compare the ratios within one run.

Knobs (environment):
  BENCH_DURATION=10          seconds measured per wrk run (after the warm-up)
  BENCH_WARMUP=2             seconds of warm-up before each measured run
  BENCH_CONNECTIONS=50       wrk connections, redis-benchmark clients and gRPC streams
  BENCH_FLOOD_CONNECTIONS=2000  wrk connections of the overload rows (0: none)
  BENCH_THREADS=2            wrk threads
  BENCH_SUBJECTS="1000 100000 1000000"   distinct subjects per run
  BENCH_MEMORY_SUBJECTS=100000           subjects charged for the memory figures
  BENCH_MODES="redis embedded"           which service modes to run
  BENCH_GRPC=0               no gRPC row (nor its load generator's build)
  BENCH_GRPC_CONNECTIONS=2   HTTP/2 connections the gRPC streams share
  BENCH_AUTH=0               no API key rows (a consume with a key against open endpoints)
  BENCH_ALERTS=0             no alert rows (thresholds and a webhook against none, and the
                             time from a crossing to its delivery; scripts/bench/alerts.py)
  BENCH_SETTINGS=0           no settings rows (checkpoints at the default interval against
                             none, QUOTA_REDIS_MIN_REPLICAS=1 against 0, TLS to Redis and to
                             Postgres against plaintext; scripts/bench/settings.py)
  BENCH_LEDGER_ENTRIES=10000000  the ledger-at-scale rows' entries (0: none; scripts/bench/scale.py)
  BENCH_POSTGRES=0           no private Postgres (scripts/bench.sh starts one through
                             scripts/with-stores.sh), hence no Postgres ingest row
                             (scripts/bench/ingest.py)
  BENCH_LIMITADOR=0          no Limitador rows (nor the peer's build; scripts/bench/limitador.py);
                             without a build (BENCH_NO_BUILD, BENCH_BINARY) they need
                             target/limitador-peer/release/limitador-peer, or are skipped
  BENCH_LEVELS=0             no record level rows (the calendar day recorded as entries and
                             as totals, beside the Limitador peer, 3 alternating rounds;
                             scripts/bench/levels.py)
  BENCH_NO_BUILD=1           use target/release/quota-ledger (and examples/rls_load, and the
                             Limitador peer) as they are
  BENCH_BINARY=PATH          benchmark this binary instead (implies BENCH_NO_BUILD=1)
  BENCH_NO_INSTALL=1         never apt-get install; fail when a tool is missing
  BENCH_OUT=FILE             also write the table to FILE (relative to the repository)
  BENCH_DOCS=1               rewrite docs/benchmarks.md after this run (0: never; unset:
                             only after a full run, none of the knobs above set but
                             BENCH_NO_BUILD, BENCH_BINARY, BENCH_NO_INSTALL and BENCH_OUT;
                             scripts/bench.sh decides, and names the date and the machine)
  BENCH_IDLE_SECONDS=30      seconds the idle Redis load is counted over (0: not measured;
                             the janitor measures every stream every 15 s)
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Dict, List, Optional

if sys.version_info < (3, 9):
    sys.exit("bench: Python 3.9 or later is needed")

from alerts import measure_alert_rows  # noqa: E402
from backtest import measure_backtest  # noqa: E402
from ingest import measure_postgres_ingest  # noqa: E402
from scale import measure_ledger_scale, measure_redis_loss  # noqa: E402
from settings import measure_settings_rows  # noqa: E402
from knobs import LOADGEN, ROOT, KnobError, Knobs  # noqa: E402
from limitador import measure_exactness, measure_peer_rows, prepare_peer  # noqa: E402
from levels import measure_level_rows  # noqa: E402
from measurements import (  # noqa: E402
    Bench,
    measure_baseline,
    measure_auth_rows,
    measure_consume_rows,
    measure_crash_restart,
    measure_idle_load,
    measure_memory,
    measure_outage_budget,
    measure_restart,
    measure_verify,
)
from processes import Failure, Processes, Stop, build, ensure_tools, log  # noqa: E402
from table import table  # noqa: E402

SIGNALS: Dict[int, int] = {int(signal.SIGINT): 130, int(signal.SIGTERM): 143, int(signal.SIGHUP): 129}


def run(knobs: Knobs, processes: Processes, tmp: Path, peer: bool) -> List[str]:
    """Every step, in order (the Limitador rows when PEER); returns the table."""
    bench = Bench(knobs, processes, tmp)
    bench.redis.start()
    measure_baseline(bench)
    for mode in knobs.modes:
        service = measure_consume_rows(bench, mode)
        if peer:
            measure_peer_rows(bench, mode)
        if knobs.levels:
            measure_level_rows(bench, mode)
        if knobs.auth:
            measure_auth_rows(bench, mode)
        if knobs.alerts:
            measure_alert_rows(bench, mode)
        if mode == "redis":
            measure_memory(bench)
            measure_outage_budget(bench)
            if knobs.settings:
                measure_settings_rows(bench)
            if knobs.postgres:
                measure_postgres_ingest(bench)
            measure_verify(bench, "redis", service.db)
            if knobs.idle_seconds > 0:
                log("idle Redis load: 1, then 4 instances with no traffic")
                measure_idle_load(bench, 1)
                measure_idle_load(bench, 4)
        else:
            measure_restart(bench, service)
            measure_crash_restart(bench)
            measure_verify(bench, "embedded", service.db)
            measure_backtest(bench, "embedded", service.db)
    if peer:
        measure_exactness(bench)
    if knobs.ledger_entries > 0:
        measure_ledger_scale(bench)
        if "redis" in knobs.modes:
            measure_redis_loss(bench)
    return table(knobs, bench.results, bench.redis.version())


RESULTS_PAGE = """# Benchmark results

{header}

Written by `scripts/bench.sh`: a full run (every knob at its default) rewrites this page.
What the rows measure, how to reproduce them and how to read them:
[Performance](performance.md).

```text
{table}```
"""


def write_results_page(path: Path, header: str, text: str) -> None:
    """docs/benchmarks.md: HEADER (the date and the machine, from scripts/bench.sh), then the table."""
    path.write_text(RESULTS_PAGE.format(header=header or "Machine and date not recorded.", table=text))
    log(f"wrote {path}")


def main(argv: List[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return 0
    if argv:
        log(f"no arguments are taken (the knobs are BENCH_* variables; see --help): {' '.join(argv)}")
        return 2
    os.chdir(ROOT)
    processes = Processes()

    def stop(signum: int, _frame: Optional[FrameType]) -> None:
        raise Stop(SIGNALS[signum])

    for signum in SIGNALS:
        signal.signal(signum, stop)
    tmp: Optional[Path] = None
    code = 0
    try:
        knobs = Knobs.from_env(os.environ)
        ensure_tools(knobs)
        if knobs.build:
            build(knobs)
        if not os.access(knobs.binary, os.X_OK):
            raise Failure(f"{knobs.binary} is missing: build it with cargo build --release")
        if knobs.grpc and not os.access(LOADGEN, os.X_OK):
            raise Failure(
                f"{LOADGEN} is missing: build it with cargo build --release --example rls_load (or BENCH_GRPC=0)"
            )
        peer = prepare_peer(knobs)
        tmp = Path(tempfile.mkdtemp(prefix="quota-bench."))
        lines = run(knobs, processes, tmp, peer)
        text = "\n".join(lines) + "\n"
        sys.stdout.write(text)
        sys.stdout.flush()
        if knobs.out is not None:
            knobs.out.write_text(text)
        docs = os.environ.get("BENCH_DOCS_FILE", "")
        if docs:
            write_results_page(ROOT / docs, os.environ.get("BENCH_DOCS_HEADER", ""), text)
    except Stop as stopped:
        log("stopping: a signal arrived")
        code = stopped.code
    except (Failure, KnobError) as error:
        log(f"error: {error}")
        code = 1
    except Exception:
        # A bug or an unexpected answer: its traceback, then the same cleanup.
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        # A second signal during the cleanup kills what is left at once.
        for signum in SIGNALS:
            signal.signal(signum, lambda _s, _f: processes.kill_all())
        processes.stop_all()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
