"""The Postgres ingest row: the drain's entries/s into a Postgres ledger, from a full
backlog, with the service idle.

A Redis-mode service on a fresh Postgres database (the private Postgres that
scripts/bench.sh starts through scripts/with-stores.sh; the row is skipped without one),
its ledger partitioned by day as every start leaves it. The drain is held back by a lock
on `ledger_entries` that another session takes (its inserts wait, as in an outage of the
database), while wrk runs the calendar-day row at 100k subjects; the entries wait in
Redis. Then the lock goes, and the row times how long the drain takes to move them all
into SQL with no traffic: entries/s, beside the target of 50,000. The entries are
counted in SQL afterwards: every one waiting was inserted.

The row runs `ROUNDS` times, each on a fresh database, and prints the median beside
every round: the first round on the bench's fresh Postgres also creates the write-ahead
log's files (later ones recycle them, as a server that has run a while does), and the
rounds differ by up to a fifth on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import List, Optional

from measurements import Bench, run_wrk
from processes import Failure, log

# How many entries the drain must move for the row to count (a shorter run measures the
# first transaction's latency more than the drain's rate).
MIN_ENTRIES = 50000

# How many times the row runs; the median is the figure.
ROUNDS = 3

# The application name of the session that holds the ledger table.
LOCKER = "bench-ingest-lock"


@dataclass
class Ingest:
    entries: int  # waiting in Redis when the lock went
    seconds: float  # until none was waiting
    rows: int  # in SQL afterwards


def postgres_url() -> Optional[str]:
    """The admin URL of the private Postgres (scripts/with-stores.sh exports it)."""
    url = os.environ.get("QUOTA_TEST_DATABASE_URL", "")
    return url or None


def _psql(url: str, sql: str) -> str:
    done = subprocess.run(["psql", "-X", "-q", "-A", "-t", url, "-c", sql], capture_output=True, check=False)
    if done.returncode != 0:
        raise Failure(f"psql failed on {sql!r}: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode().strip()


def measure_postgres_ingest(bench: Bench) -> None:
    admin = postgres_url()
    if admin is None or shutil.which("psql") is None:
        log("Postgres ingest: no private Postgres (run through scripts/bench.sh); row skipped")
        return
    rounds: List[Ingest] = []
    for round_ in range(ROUNDS):
        rounds.append(_measure_once(bench, admin, round_))
    bench.results.ingest = rounds


def _measure_once(bench: Bench, admin: str, round_: int) -> Ingest:
    name = f"bench_ingest_{os.getpid()}_{round_}"
    _psql(admin, f"CREATE DATABASE {name}")
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    env = {"DATABASE_URL": url, "QUOTA_LEDGER_BACKLOG_MAX": "100000000"}
    service = bench.service("redis", env=env).start()
    try:
        service.create_policies()
        log("Postgres ingest: consumes while another session holds ledger_entries")
        seconds = bench.knobs.warmup + bench.knobs.duration + 60
        lock = bench.processes.start(
            [
                "psql", "-X", "-q", url, "-c",
                f"BEGIN; LOCK TABLE ledger_entries IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep({seconds});",
            ],
            env={**os.environ, "PGAPPNAME": LOCKER},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_locked(url)
        run_wrk(bench, service, "sms", 100000)
        waiting = int(service.metric("quota_ledger_backlog_entries"))
        if waiting < MIN_ENTRIES:
            raise Failure(f"only {waiting} entries waited for the drain (at least {MIN_ENTRIES} needed)")
        log(f"Postgres ingest: {waiting} entries waiting; the lock goes")
        # Its session ends (a stopped psql would leave the server's pg_sleep holding it).
        _psql(url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{LOCKER}'")
        t0 = time.monotonic()
        bench.processes.stop(lock)
        while service.metric("quota_ledger_backlog_entries") > 0:
            if time.monotonic() - t0 > 600:
                raise Failure("the backlog did not drain into Postgres within 10 minutes")
            time.sleep(0.02)
        drained = time.monotonic() - t0
        rows = int(_psql(url, "SELECT count(*) FROM ledger_entries"))
        if rows < waiting:
            raise Failure(f"{rows} entries in SQL once none waited, of {waiting} (a scrape of /metrics failed?)")
        measured = Ingest(waiting, round(drained, 2), rows)
        log(f"Postgres ingest: round {round_ + 1}: {waiting / measured.seconds:.0f} entries/s")
        return measured
    finally:
        service.stop()
        bench.redis.flushall()
        _psql(admin, f"DROP DATABASE IF EXISTS {name}")


def _wait_locked(url: str) -> None:
    for _ in range(100):
        held = _psql(
            url,
            "SELECT count(*) FROM pg_locks WHERE granted AND mode = 'AccessExclusiveLock' "
            "AND relation = 'ledger_entries'::regclass",
        )
        if held == "1":
            return
        time.sleep(0.1)
    raise Failure("could not lock ledger_entries")


def ingest_targets(results, target, at_least) -> List[str]:  # type: ignore[no-untyped-def]
    rounds: Optional[List[Ingest]] = results.ingest
    if not rounds:
        return []
    rates = sorted(r.entries / r.seconds if r.seconds > 0 else 0.0 for r in rounds)
    median = rates[len(rates) // 2]
    entries = ", ".join(str(r.entries) for r in rounds)
    label = f"Postgres ingest: the drain from a full backlog ({entries} entries), service idle, entries/s, median of {len(rounds)}"
    each = " / ".join(f"{r.entries / r.seconds:.0f}" if r.seconds > 0 else "0" for r in rounds)
    out = [target(label, f"{median:.0f} ({each})", ">= 50000", at_least(f"{median}", 50000))]
    rows = ", ".join(str(r.rows) for r in rounds)
    out.append(target("  entries in SQL afterwards (every one waiting, and those before)", rows))
    return out
