"""The ledger-at-scale rows: a fresh SQLite ledger filled with BENCH_LEDGER_ENTRIES entries
over the last 24 hours by examples/ledger_scale.rs (through the service's own store and
codec, in batches of 5,000 as the drain writes them), then what the API reads from it
timed: the console's Today page (24 hourly rollups and the most-denied subjects) and the
query API's filters. Postgres: run the example against a Postgres URL by hand (the bench
starts no Postgres); docs/benchmarks.md has its figures.

Then the Redis-loss row: another ledger of as many entries whose charges name the counter
they charged (the calendar day, as a consume's do), a Redis-mode service started on it
with the default settings (a checkpoint every 10 s), left until its janitor saved the
first checkpoint of the ledger's replay, then under full
load (wrk, the calendar day at 100k subjects) for LOSS_LOAD_SECONDS, FLUSHALL: the seconds
until every shard is rebuilt from the checkpoint and the entries after it, and serves.
Then the embedded default on that same ledger, killed with SIGKILL under full load, and
started again: the seconds until its first consume is answered."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from knobs import LEDGER_SCALE
from measurements import Bench, Line, kill_and_restart, wrk_in_background
from processes import Failure, log, log_field


def measure_ledger_scale(bench: Bench) -> None:
    entries = bench.knobs.ledger_entries
    db = bench.tmp / "scale.db"
    log(f"the ledger at scale: {entries} entries over 24 hours into a fresh SQLite ledger")
    done = subprocess.run(
        [str(LEDGER_SCALE), f"sqlite://{db}?mode=rwc", str(entries)], capture_output=True, check=False
    )
    output = done.stdout.decode(errors="replace")
    line = Line.find(output, "LEDGER")
    if done.returncode != 0 or line is None:
        raise Failure(f"ledger_scale failed ({done.returncode}): {done.stderr.decode(errors='replace')[-2000:]}")
    bench.results.scale = line
    for path in db.parent.glob("scale.db*"):
        path.unlink()


LOSS_LOAD_SECONDS = 25


def measure_redis_loss(bench: Bench) -> None:
    """The Redis-loss row (see the module doc)."""
    entries = bench.knobs.ledger_entries
    db = bench.tmp / "loss.db"
    log(f"Redis loss: {entries} entries over 24 hours, each charge on its counter, into a fresh SQLite ledger")
    done = subprocess.run(
        [str(LEDGER_SCALE), f"sqlite://{db}?mode=rwc", str(entries), "counters"], capture_output=True, check=False
    )
    if done.returncode != 0:
        raise Failure(f"ledger_scale failed ({done.returncode}): {done.stderr.decode(errors='replace')[-2000:]}")
    bench.redis.flushall()
    # A first start on an empty Redis rebuilds every shard from the whole ledger. The
    # default settings: checkpoints every 10 s (QUOTA_CHECKPOINT_EVERY_S).
    service = bench.service("redis", db=db).start(tries=6000)
    service.create_policies()
    _wait_for(service, "saved a checkpoint", 1200)
    checkpoint = service.log_line("saved a checkpoint")
    # Under full load: the rebuild then has the entries of the last seconds to replay
    # after the checkpoint, as it would in production.
    wrk = wrk_in_background(bench, service, LOSS_LOAD_SECONDS * 2)
    time.sleep(LOSS_LOAD_SECONDS)
    log(f"Redis loss: FLUSHALL after {LOSS_LOAD_SECONDS} s of full load")
    rebuilds = service.log_text().count("rebuilt counter-store shards")
    bench.redis.flushall()
    t0 = time.monotonic()
    rebuilt = _wait_for(service, "rebuilt counter-store shards", 600, after=rebuilds, poll=0.02)
    seconds = time.monotonic() - t0
    bench.processes.stop(wrk)
    checkpoints = [line for line in service.log_text().splitlines() if "saved a checkpoint" in line]
    bench.results.redis_loss = {
        "entries": entries,
        "seconds": round(seconds, 2),
        "first": log_field("millis", checkpoint),
        "last_every": log_field("millis", checkpoints[-1]),
        "replayed": log_field("entries", rebuilt),
        "items": log_field("items", rebuilt),
        "replay_ms": log_field("replay_ms", rebuilt),
        "write_ms": log_field("write_ms", rebuilt),
    }
    service.stop()
    measure_embedded_crash_at_scale(bench, db)
    for path in db.parent.glob("loss.db*"):
        path.unlink()


CRASH_LOAD_SECONDS = 30


def measure_embedded_crash_at_scale(bench: Bench, db: Path) -> None:
    """The embedded kill -9 row at scale: the embedded default started on the ledger the
    Redis-loss row left (its 10M entries inside the calendar day, and the entries of its
    load), which it rebuilds its counters from (the checkpoint that row saved, then the
    entries after it); CRASH_LOAD_SECONDS of full load; SIGKILL while wrk runs; then the
    seconds from the start of the process until its first consume is answered."""
    log(f"embedded at scale: kill -9 after {CRASH_LOAD_SECONDS} s of full load on the Redis-loss row's ledger")
    service = bench.service("embedded", db=db).start(tries=6000)
    what = "the embedded service restarted after kill -9 at scale"
    restarted, bench.results.crash_at_scale = kill_and_restart(bench, service, CRASH_LOAD_SECONDS, what)
    restarted.stop()


def _wait_for(service, needle: str, seconds: float, after: int = 0, poll: float = 0.5) -> str:  # type: ignore[no-untyped-def]
    """The log line of SERVICE with NEEDLE after its first AFTER ones, waited for SECONDS."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = [line for line in service.log_text().splitlines() if needle in line]
        if len(lines) > after:
            return lines[after]
        time.sleep(poll)
    raise Failure(f"the service logged no {needle!r} within {seconds:.0f} s")


def redis_loss_targets(results, target, at_most) -> List[str]:  # type: ignore[no-untyped-def]
    loss: Optional[Dict[str, Any]] = results.redis_loss
    if not loss:
        return []
    label = f"Redis lost its data under load, default settings: every shard serving again, {loss['entries']} entries, s"
    out = [target(label, f"{loss['seconds']:.2f}", "<= 5", at_most(str(loss["seconds"]), 5))]
    out.append(target("  entries replayed after the checkpoint, items written", f"{loss['replayed']}, {loss['items']}"))
    out.append(target("  the rebuild's replay (checkpoint loaded), its writes, ms", f"{loss['replay_ms']}, {loss['write_ms']}"))
    out.append(target("  checkpoints: the first (whole ledger), the last, ms", f"{loss['first']}, {loss['last_every']}"))
    crash = results.crash_at_scale
    if crash is not None:
        label = f"restart to first consume after kill -9, embedded, on that ledger ({crash.entries} entries), s"
        out.append(target(label, f"{crash.seconds:.2f}", "<= 5", at_most(str(crash.seconds), 5)))
        out.append(target("  entries replayed after the snapshot", str(crash.replayed)))
    return out


def scale_targets(results, target, at_most) -> List[str]:  # type: ignore[no-untyped-def]
    line = results.scale
    if line is None:
        return []
    n = line.i("entries")
    out = [target(f"ledger: {n} entries in 24 h, written in batches of 5,000 (SQLite), entries/s", line.s("fill_rate"))]
    activity = line.f("activity_ms")
    label = "  /admin/activity's queries (24 hourly rollups, the most denied), ms"
    out.append(target(label, f"{activity:.1f}", "<= 100", at_most(activity, 100)))
    for key, label in (
        ("kind_action_ms", "?action=&kind=refund (no such entry)"),
        ("kind_ms", "?kind=refund"),
        ("subject_ms", "?subject="),
    ):
        out.append(target(f"  /quota/ledger's page of 100, {label}, ms", line.s(key)))
    return out
