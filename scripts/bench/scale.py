"""The ledger-at-scale rows: a fresh SQLite ledger filled with BENCH_LEDGER_ENTRIES entries
over the last 24 hours by examples/ledger_scale.rs (through the service's own store and
codec, in batches of 5,000 as the drain writes them), then what the API reads from it
timed: the console's Today page (24 hourly rollups and the most-denied subjects) and the
query API's filters. Postgres: run the example against a Postgres URL by hand (the bench
starts no Postgres); docs/performance.md has its figures."""

from __future__ import annotations

import subprocess
from typing import List

from knobs import LEDGER_SCALE
from measurements import Bench, Line
from processes import Failure, log


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
