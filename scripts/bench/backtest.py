"""The backtest row: POST /admin/backtest on the ledger the runs left (the calendar-day
policy of action sms at a tenth of its limit, over the last day: every consume of the
runs is replayed), timed, to be read as seconds per million ledger entries replayed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

from knobs import LIMIT, policies
from measurements import Bench
from processes import Failure, log


def measure_backtest(bench: Bench, mode: str, db: Path) -> None:
    log(f"{mode}: a backtest of the calendar-day policy on the ledger of the runs")
    service = bench.service(mode, db=db).start(tries=6000)
    try:
        policy = dict(next(p for p in policies() if p["action"] == "sms"), limit=max(1, LIMIT // 10))
        t0 = time.monotonic()
        status, body = service.request(
            "POST", "/admin/backtest", {"policies": [policy], "days": 1}, admin=True, timeout=None
        )
        seconds = time.monotonic() - t0
    finally:
        service.stop()
    try:
        answer = json.loads(body)
        entries = int(answer["entries"])
        requests = int(answer["policies"][0]["requests"])
    except (ValueError, KeyError, TypeError, IndexError):
        raise Failure(f"the backtest answered {status}: {body.decode(errors='replace') or 'nothing'}") from None
    bench.results.backtest[mode] = (entries, requests, round(seconds, 2))


def backtest_targets(results, target, at_most) -> List[str]:  # type: ignore[no-untyped-def]
    out: List[str] = []
    for mode, (entries, requests, seconds) in sorted(results.backtest.items()):
        per_million = seconds * 1e6 / entries if entries > 0 else 0.0
        out.append(target(f"backtest: {mode}, {entries} ledger entries ({requests} requests)", f"{seconds:.2f} s"))
        out.append(
            target("  backtest seconds per million entries", f"{per_million:.1f} s", "<= 10 s", at_most(per_million, 10))
        )
    return out
