"""The record level rows: the service's calendar day recorded as `entries` and as `totals`,
beside the Limitador peer, in alternating rounds.

In each mode, one fresh service (Redis flushed first) with two calendar-day policies that
differ only in `record` (sms: entries, the default; sms-totals: totals), and a fresh peer in
the matching storage, both running: then LEVEL_ROUNDS rounds of entries, totals, peer, each
a wrk row at BENCH_CONNECTIONS connections for the subject count of the gRPC row (100k by
default), with its warm-up. The targets read the median of each: its req/s against the
peer's median, its p99, and the HTTP workers' CPU per consume (the actix worker threads,
by name: `http_us`), the ledger's own work (writer, drain, SQL) being reported apart
(`sql_us`, `bg_us`). After the rounds, `counters verify` must find no drift.
"""

from __future__ import annotations

import json
from typing import Dict, List, Tuple

from knobs import LIMIT
from limitador import ACTION, PEER_LUA, STORAGES, Peer
from measurements import Bench, Line, run_wrk, run_wrk_script
from processes import Failure, log

# Rounds of the record level rows (entries, totals, peer; three times).
LEVEL_ROUNDS = 3
# The totals policy's action: the calendar day of the entries row, recorded as totals.
TOTALS_ACTION = "sms-totals"
LEVELS: Dict[str, str] = {"entries": ACTION, "totals": TOTALS_ACTION}
# The targets, per (mode, level): at least that many times the peer's req/s, and the
# service's p99 under that many ms.
LEVEL_TARGETS: Dict[Tuple[str, str], Tuple[float, float]] = {
    ("redis", "totals"): (1.3, 5.0),
    ("redis", "entries"): (0.8, 5.0),
    ("embedded", "totals"): (0.7, 5.0),
    ("embedded", "entries"): (0.4, 10.0),
}
# The HTTP workers' CPU per consume, outside the ledger's own work: at most this many µs.
HTTP_US_MAX = 15.0


def totals_policy() -> dict:
    """The calendar-day policy of the level rows recorded in totals."""
    return {
        "id": "sms-totals-per-day",
        "action": TOTALS_ACTION,
        "measure": "count",
        "limit": LIMIT,
        "window": {"type": "calendar", "period": "day", "timezone": "America/New_York"},
        "record": "totals",
    }


def measure_level_rows(bench: Bench, mode: str) -> None:
    """The rounds of MODE (see the module doc), into results.levels[(mode, level)] and
    results.levels[(mode, "peer")], one line per round."""
    k, results = bench.knobs, bench.results
    storage = STORAGES[mode]
    if mode == "redis":
        bench.redis.flushall()
    service = bench.service(mode).start()
    peer = None
    try:
        service.create_policies()
        status, body = service.request("POST", "/admin/policies", totals_policy(), admin=True)
        if status != 201:
            raise Failure(f"creating the totals policy answered {status}: {body.decode(errors='replace')}")
        if k.limitador:
            peer = Peer(bench, storage).start([(ACTION, LIMIT)])
        subjects = k.grpc_subjects
        for round_ in range(1, LEVEL_ROUNDS + 1):
            for level, action in LEVELS.items():
                log(f"{mode}: calendar day recorded as {level}, {subjects} subjects (round {round_})")
                before = _decision_calls(service)
                line = run_wrk(bench, service, action, subjects)
                after = _decision_calls(service)
                calls = after[1] - before[1]
                # Decisions per Redis script call over the row (its warm-up included).
                line.add(per_call=f"{(after[0] - before[0]) / calls:.1f}" if calls > 0 else "-")
                results.levels.setdefault((mode, level), []).append(line)
            if peer is not None:
                log(f"limitador {storage}: calendar day, {subjects} subjects (round {round_})")
                line = run_wrk_script(bench, peer, f"{peer.base}/check_and_report", PEER_LUA, [ACTION, str(subjects)])
                results.levels.setdefault((mode, "peer"), []).append(line)
        status, body = service.request("GET", "/admin/counters/verify", admin=True, timeout=None)
        drift = json.loads(body).get("drift") if status == 200 else None
        results.level_verify[mode] = status == 200 and drift == []
        if not results.level_verify[mode]:
            log(f"{mode}: counters verify after the level rows answered {status}: {body[:400]!r}")
    finally:
        if peer is not None:
            peer.stop()
        service.stop()
    if mode == "redis":
        bench.redis.flushall()


def _decision_calls(service) -> Tuple[float, float]:  # type: ignore[no-untyped-def]
    """The service's decisions sent to Redis and the script calls that carried them."""
    return service.metric("quota_redis_decisions_total"), service.metric("quota_redis_decision_calls_total")


def median(lines: List[Line], field: str) -> float:
    """The median of FIELD over LINES (at least one)."""
    values = sorted(line.f(field) for line in lines)
    middle = len(values) // 2
    if len(values) % 2 == 1:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


def level_rows(knobs, results, row) -> List[str]:  # type: ignore[no-untyped-def]
    """The rounds of the level rows in the main table, in the order they ran."""
    out: List[str] = []
    for mode in knobs.modes:
        for level in (*LEVELS, "peer"):
            for i, line in enumerate(results.levels.get((mode, level), []), start=1):
                who = "limitador" if level == "peer" else mode
                label = f"{STORAGES[mode]}, round {i}" if level == "peer" else f"{level}, round {i}"
                out += row(who, label, knobs.grpc_subjects, line, "-")
    return out


def level_targets(knobs, results, target, ratio, at_least) -> List[str]:  # type: ignore[no-untyped-def]
    """The issue's targets, each beside the median of its rounds."""
    out: List[str] = []
    for mode in knobs.modes:
        storage = STORAGES[mode]
        theirs = results.levels.get((mode, "peer"))
        for level in LEVELS:
            ours = results.levels.get((mode, level))
            if not ours:
                continue
            floor, p99_max = LEVEL_TARGETS[(mode, level)]
            rounds = len(ours)
            if theirs:
                v = ratio(median(ours, "rps"), median(theirs, "rps"))
                label = f"{mode}, {level}: / Limitador {storage}, req/s (median of {rounds})"
                out.append(target(label, f"{v}x", f">= {floor:g}x", at_least(v, floor)))
                figures = f"{median(ours, 'rps'):.0f}/{median(theirs, 'rps'):.0f}"
                out.append(target(f"  req/s: {mode} {level} / Limitador {storage}", figures))
            p99 = median(ours, "p99_ms")
            label = f"  p99: {mode} {level}, {knobs.connections} connections"
            out.append(target(label, f"{p99:.2f} ms", f"< {p99_max:g} ms", p99 < p99_max))
            http = median(ours, "http_us")
            label = f"  HTTP worker CPU per consume: {mode} {level}"
            out.append(target(label, f"{http:.1f} us", f"<= {HTTP_US_MAX:g} us", http <= HTTP_US_MAX))
            ledger = f"sql {median(ours, 'sql_us'):.1f} us, background {median(ours, 'bg_us'):.1f} us, Redis {median(ours, 'redis_us'):.1f} us"
            out.append(target(f"  the ledger's own work and Redis: {mode} {level}", ledger))
            if mode == "redis":
                per_call = [line.s("per_call") for line in ours]
                out.append(target(f"  decisions per Redis call: {mode} {level}, by round", " ".join(per_call)))
        if mode in results.level_verify:
            verified = results.level_verify[mode]
            out.append(target(f"  counters verify after the level rows: {mode}", "no drift" if verified else "DRIFT", "no drift", verified))
    return out
