"""The table: every row the run measured, then the targets, each a figure of this run (the
ratios are computed within the run: compare them, not absolute numbers across machines).
"""

from __future__ import annotations

import datetime
import os
from typing import List, Optional

from alerts import ALERT_SUBJECTS, alert_targets
from settings import settings_targets
from backtest import backtest_targets
from ingest import ingest_targets
from scale import redis_loss_targets, scale_targets
from knobs import COUNTRIES, SCENARIOS, Knobs
from levels import level_rows, level_targets
from limitador import peer_rows, peer_targets
from measurements import BRACKETED, Line, Results, mean_of

ROW = "{:<9} {:<20} {:>9} {:>9} {:>8} {:>8} {:>7} {:>11} {:>7} {:>6} {:>6} {:>6} {:>7} {:>7} {:>5}"
LABEL = 64  # the width of a target's label


def ratio(a: float, b: float) -> str:
    """a / b to two decimals, "n/a" when b is not positive."""
    return f"{a / b:.2f}" if b > 0 else "n/a"


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def at_least(value: str, threshold: float) -> bool:
    """value (as printed) >= threshold; a value that is not a number misses."""
    try:
        return float(value) >= threshold
    except ValueError:
        return False


def at_most(value: str, threshold: float) -> bool:
    try:
        return float(value) <= threshold
    except ValueError:
        return False


def target(label: str, value: str, threshold: str = "", met: Optional[bool] = None) -> str:
    """One line of the targets: label, figure, and the threshold with its verdict if any."""
    line = f"  {label:<{LABEL}} {value:>8}"
    if threshold:
        line += f"  {threshold:<16} {verdict(met) if met is not None else ''}"
    return line.rstrip()


def _row(mode: str, label: str, subjects: int, line: Optional[Line], p99_ratio: str, errors: Optional[int] = None) -> List[str]:
    """One row of the main table (none without LINE); ERRORS defaults to wrk's socket
    errors and non-2xx answers."""
    if line is None:
        return []
    if errors is None:
        errors = line.i("socket_errors") + line.i("non2xx")
    return [
        ROW.format(
            mode, label, subjects, f"{line.f('rps'):.0f}", f"{line.f('p50_ms'):.2f}", f"{line.f('p99_ms'):.2f}",
            errors, p99_ratio, line.s("svc_us"), line.s("http_us"), line.s("sql_us"), line.s("bg_us"),
            line.s("redis_us"), line.s("wrk_us"), line.s("load"),
        )
    ]  # fmt: skip


def table(knobs: Knobs, results: Results, redis_version: str) -> List[str]:
    """The whole table, as lines."""
    out: List[str] = []
    out += _runs(knobs, results, redis_version)
    out.append("")
    out += _memory(knobs, results)
    out.append("")
    out += _targets(knobs, results)
    return out


def _runs(knobs: Knobs, results: Results, redis_version: str) -> List[str]:
    """The rows: one per (mode, scenario, subjects), then the baseline."""
    k = knobs
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    out = [
        f"quota-ledger consume benchmark, {now}",
        f"{len(os.sched_getaffinity(0))} cores, {redis_version}, wrk {k.threads} threads x {k.connections} connections,"
        f" {k.warmup}s warm-up + {k.duration}s per row, loopback",
        "",
        ROW.format("mode", "scenario", "subjects", "req/s", "p50_ms", "p99_ms", "errors", "p99/p99@1k",
                   "svc_us", "http", "sql", "bg", "rds_us", "wrk_us", "load"),
    ]  # fmt: skip
    for mode in k.modes:
        for scenario in SCENARIOS:
            first_p99: Optional[float] = None
            for subjects in k.subjects:
                line = results.runs.get((mode, scenario.action, subjects))
                if line is None:
                    continue
                p99 = line.f("p99_ms")
                if first_p99 is None:
                    first_p99 = p99
                # The 3-budget row between the calendar-day rows it is compared with.
                if scenario.action in BRACKETED:
                    before = results.pairs.get((mode, f"before:{scenario.action}", subjects))
                    out += _row(mode, "  calendar, before", subjects, before, "-")
                out += _row(mode, scenario.label, subjects, line, ratio(p99, first_p99))
                if scenario.action in BRACKETED:
                    after = results.pairs.get((mode, f"after:{scenario.action}", subjects))
                    out += _row(mode, "  calendar, after", subjects, after, "-")
            if scenario.action != "sms":
                continue
            # Envoy's ShouldRateLimit on the same policy, beside its HTTP rows.
            for subjects in k.subjects:
                grpc = results.grpc.get((mode, subjects))
                if grpc is not None:
                    out += _row(mode, "grpc ShouldRateLimit", subjects, grpc, "-", grpc.i("over") + grpc.i("errors"))
            # The same consume on fresh services: open, and with an API key, by round.
            rounds = zip(results.auth.get((mode, "none"), []), results.auth.get((mode, "key"), []))
            for open_, keyed in rounds:
                out += _row(mode, "calendar, open", k.grpc_subjects, open_, "-")
                out += _row(mode, "calendar, API key", k.grpc_subjects, keyed, "-")
            # The same consume on fresh services: without alerts, and with them, by round.
            rounds = zip(results.alerts.get((mode, "off"), []), results.alerts.get((mode, "on"), []))
            for off, on in rounds:
                out += _row(mode, "calendar, no alerts", ALERT_SUBJECTS, off, "-")
                out += _row(mode, "calendar, alerts", ALERT_SUBJECTS, on, "-")
    # The Limitador peer's calendar rows, after the service's (limitador.py).
    peer, peer_notes = peer_rows(k, results, _row, ratio)
    out += peer
    out += level_rows(k, results, _row)
    base = results.baseline
    if base is not None:
        out.append(
            "{:<9} {:<20} {:>9} {:>9.0f} {:>8.2f} {:>8.2f} {:>7} {:>11} {:>7} {:>6} {:>6} {:>6} {:>7} {:>7}".format(
                "baseline", "redis-benchmark", 100000, base.rps, base.p50_ms, base.p99_ms, 0, "", "-", "", "", "",
                f"{base.redis_us:.1f}", f"{base.client_us:.1f}",
            )
        )  # fmt: skip
    out += [
        "(errors: socket errors + non-2xx answers; svc_us / rds_us / wrk_us: CPU microseconds per",
        " request of the service / Redis / the load generator (redis-benchmark in the baseline row)",
        " during the row; the service's split by thread: http = the actix workers (HTTP, JSON,",
        " the engine, the Redis client), sql = SQLite inserting ledger entries, bg = the rest",
        " (the ledger drain or group-commit task); load: 1-minute load average at its end)",
        "(3 budgets: action sms3, whose consume charges three calendar-day budgets in one call:",
        f" the subject's, its country's (one of {len(COUNTRIES.split(','))}, drawn uniformly) and the whole action's;",
        " calendar, before / after: the calendar-day consume again right before and right after it,",
        " on the ledger as large as the 3-budget row found it; the target compares it with their mean)",
        "(calendar, open / API key: the calendar-day consume on fresh services alike, with open",
        " quota endpoints and with an API key as every request's bearer token, in alternating rounds)",
    ]
    out += peer_notes
    if k.grpc:
        out += [
            "(grpc ShouldRateLimit: Envoy's rate limit service, one descriptor [subject] of the calendar-day",
            f" policy, {k.connections} streams over {k.grpc_connections} HTTP/2 connections (examples/rls_load.rs); errors:",
            " OVER_LIMIT answers + gRPC errors; the gRPC runtime's threads (grpc) are in bg;",
            " wrk_us is rls_load's; its req/s and p99 against the HTTP row are under Targets)",
        ]
    return out


def _memory(knobs: Knobs, results: Results) -> List[str]:
    """Redis memory per subject per policy, and the service's resident memory."""
    out = [f"Redis memory per subject per policy ({knobs.memory_subjects} subjects charged once each through the service):"]
    for kind in ("calendar", "rolling", "rolling-full", "token_bucket"):
        m = results.memory.get(kind)
        if m is not None:
            out.append(f"  {kind:<13} {m.per_key:6.0f} bytes  ({m.keys} keys; key of {m.key_len} bytes, e.g. {m.sample})")
    out += ["  (rolling: one bucket per subject; rolling-full: all 25 buckets that count in use)", ""]
    out.append("Service memory (VmRSS / peak VmHWM):")
    for kind in ("redis", "redis-fill", "embedded"):
        if kind in results.rss:
            rss, hwm = results.rss[kind]
            out.append(f"  {kind:<11} {rss / 1024:7.1f} MiB / {hwm / 1024:7.1f} MiB")
    out.append("  (embedded holds every counter written by its runs in process: see its key count below)")
    out.append(f"  redis keys after the redis runs: {'' if results.redis_keys is None else results.redis_keys}")
    return out


def _targets(knobs: Knobs, results: Results) -> List[str]:
    """Each target by what it measures: the figure of this run, the threshold, the verdict."""
    k, runs = knobs, results.runs
    out = ["Targets:"]
    cal100 = runs.get(("redis", "sms", 100000))
    base = results.baseline
    if cal100 is not None and base is not None:
        v = ratio(cal100.f("rps"), base.rps)
        out.append(target("consume throughput vs the EVALSHA baseline: redis calendar 100k", f"{v}x", ">= 0.4x", at_least(v, 0.4)))
        path = cal100.f("svc_us") + cal100.f("redis_us") + cal100.f("wrk_us")
        cpu = f"{(base.redis_us + base.client_us) / path:.2f}x" if path > 0 else "n/a"
        out.append(target("  CPU per call, baseline / consume path (svc+rds+wrk)", cpu))
        p99 = cal100.s("p99_ms")
        out.append(target("p99 latency: redis calendar 100k", f"{p99} ms", "< 5 ms", cal100.f("p99_ms") < 5))
    first, last = k.subjects[0], k.subjects[-1]
    for mode in k.modes:
        for scenario in SCENARIOS:
            low, high = runs.get((mode, scenario.action, first)), runs.get((mode, scenario.action, last))
            if low is None or high is None:
                continue
            v = ratio(high.f("p99_ms"), low.f("p99_ms"))
            label = f"p99 flatness, @{last} / @{first} subjects: {mode} {scenario.label}"
            out.append(target(label, f"{v}x", "<= 1.25x", at_most(v, 1.25)))
    for kind, label, limit in (
        ("calendar", "Redis memory per subject: calendar policy", 120),
        ("rolling-full", "Redis memory per subject: rolling, 24 buckets all in use", 600),
    ):
        m = results.memory.get(kind)
        if m is not None:
            v = f"{m.per_key:.0f}"
            out.append(target(label, f"{v} B", f"< {limit} B", float(v) < limit))
    for mode in knobs.modes:
        subjects = knobs.grpc_subjects
        anchored = runs.get((mode, "sms-cut", subjects))
        before = results.pairs.get((mode, "before:sms-cut", subjects))
        after = results.pairs.get((mode, "after:sms-cut", subjects))
        if anchored is not None and before is not None and after is not None:
            plain = (before.f("rps") + after.f("rps")) / 2
            v = ratio(anchored.f("rps"), plain)
            label = f"{mode}: day from 04:00 vs plain day around it, req/s ({subjects // 1000}k)"
            out.append(target(label, f"{v}x", ">= 0.95x", at_least(v, 0.95)))
    emb100 = runs.get(("embedded", "sms", 100000))
    if cal100 is not None and emb100 is not None:
        v = ratio(emb100.f("rps"), cal100.f("rps"))
        out.append(target("embedded default throughput vs Redis mode: calendar 100k", f"{v}x", ">= 1.0x", at_least(v, 1.0)))
    out += level_targets(k, results, target, ratio, at_least)
    out += peer_targets(k, results, target, ratio, at_least)
    out += _shared_budgets(k, results)
    out += _grpc_vs_http(k, results)
    out += _auth(k, results)
    out += alert_targets(k.modes, results, target, ratio, at_least)
    out += settings_targets(results, target, at_least)
    out += backtest_targets(results, target, at_most)
    out += scale_targets(results, target, at_most)
    out += redis_loss_targets(results, target, at_most)
    out += ingest_targets(results, target, at_least)
    out += _overload(k, results)
    for mode in k.modes:
        lag = results.lag.get(mode)
        if lag is not None:
            bound = "1e9" if lag.p99_s in ("+Inf", "none") else lag.p99_s
            label = f"ledger lag p99 (decision to SQL): {mode}, {lag.count} entries"
            out.append(target(label, f"<= {lag.p99_s} s", "<= 1 s", at_most(bound, 1)))
    out += _outage_budget(results)
    one, four = results.idle.get(1), results.idle.get(4)
    if one is not None and four is not None:
        out.append(target("idle Redis load: commands/s, 1 instance (drain, sweeper)", f"{one:.1f}", "<= 10", one <= 10))
        out.append(target("idle Redis load: commands/s, 4 instances in all", f"{four:.1f}", "<= 40", four <= 40))
    restart = results.restart
    if restart is not None:
        # The target is 5 s at 1M entries: scaled linearly to the ledger's entries.
        v = f"{restart.seconds * 1e6 / restart.entries:.1f}" if restart.entries > 0 else "0.0"
        out.append(target(f"restart to first consume: embedded, {restart.entries} ledger entries", f"{restart.seconds:.2f} s"))
        out.append(target("  entries replayed after the snapshot", str(restart.replayed)))
        out.append(target("  seconds per million entries (linear)", f"{v} s", "<= 5 s", at_most(v, 5)))
    crash = results.crash
    if crash is not None:
        r = crash.restart
        label = f"restart to first consume after kill -9: embedded, {crash.load_seconds} s of load"
        out.append(target(label, f"{r.seconds:.2f} s", "<= 5 s", r.seconds <= 5))
        out.append(target(f"  entries replayed after the snapshot (of {r.entries})", str(r.replayed)))
        out.append(target(f"  snapshots under the load, longest pause", f"{crash.snapshots}, {crash.max_pause_ms} ms"))
    for mode in ("embedded", "redis"):
        verify = results.verify.get(mode)
        if verify is None:
            continue
        v = f"{verify.seconds * 1e6 / verify.entries:.1f}" if verify.entries > 0 else "0.0"
        label = f"counters verify: {mode}, {verify.checked} budgets, {verify.entries} ledger entries"
        out.append(target(label, f"{verify.seconds:.2f} s"))
        out.append(target("  verify seconds per million entries (linear)", f"{v} s"))
        out.append(
            target("  consumes/s while verifies run back to back, vs alone", f"{ratio(verify.during.f('rps'), verify.alone.f('rps'))}x")
        )
    return out


def _shared_budgets(k: Knobs, results: Results) -> List[str]:
    """A 3-budget consume against a 1-budget one (calendar day) at the same subjects, in the
    same run: the mean of the calendar-day rows right before and right after it. The target
    holds on a standalone Redis; embedded has none (its ratio shows what the in-process store
    pays for budgets shared by subjects)."""
    out: List[str] = []
    for mode in k.modes:
        heading = False
        for subjects in k.subjects:
            three = results.runs.get((mode, "sms3", subjects))
            before = results.pairs.get((mode, "before:sms3", subjects))
            after = results.pairs.get((mode, "after:sms3", subjects))
            if three is None or before is None or after is None:
                continue
            one = float(f"{(before.f('rps') + after.f('rps')) / 2:.1f}")
            if not heading:
                heading = True
                out.append(f"  shared budgets: {mode} 3 budgets (subject+country+global) vs 1, right before and after")
            v = ratio(three.f("rps"), one)
            label = f"  req/s, 3 budgets / calendar day, @{subjects} subjects"
            if mode == "redis":
                out.append(target(label, f"{v}x", ">= 0.8x", at_least(v, 0.8)))
            else:
                out.append(target(label, f"{v}x", "-"))
            out.append(target(f"    {three.s('rps')} / mean({before.s('rps')}, {after.s('rps')})", ""))
    return out


def _grpc_vs_http(k: Knobs, results: Results) -> List[str]:
    """Envoy's ShouldRateLimit over gRPC next to an HTTP consume of the same policy
    (calendar day), at the same subjects, in the same run. No target: the figures."""
    out: List[str] = []
    for mode in k.modes:
        for subjects in k.subjects:
            http = results.runs.get((mode, "sms", subjects))
            grpc = results.grpc.get((mode, subjects))
            if http is None or grpc is None:
                continue
            out.append(f"  gRPC vs HTTP: {mode} ShouldRateLimit vs consume (calendar day, @{subjects} subjects)")
            out.append(target("  req/s, grpc / http", f"{ratio(grpc.f('rps'), http.f('rps'))}x", "-"))
            out.append(target("  p99, grpc / http", f"{ratio(grpc.f('p99_ms'), http.f('p99_ms'))}x", "-"))
            out.append(target("  service CPU us per call, grpc / http", f"{grpc.s('svc_us')}/{http.s('svc_us')}", "-"))
    return out


def _auth(k: Knobs, results: Results) -> List[str]:
    """A consume with an API key against one with open endpoints: two fresh services alike,
    the calendar day at the gRPC row's subject count, in the same run."""
    out: List[str] = []
    for mode in k.modes:
        opens, keys = results.auth.get((mode, "none"), []), results.auth.get((mode, "key"), [])
        if not opens or not keys:
            continue

        v = ratio(mean_of(keys, "rps"), mean_of(opens, "rps"))
        label = f"{mode}: API key vs open, req/s (calendar {k.grpc_subjects // 1000}k)"
        out.append(target(label, f"{v}x", ">= 0.97x", at_least(v, 0.97)))
        rounds = ", ".join(f"{a.f('rps'):.0f}/{b.f('rps'):.0f}" for a, b in zip(keys, opens))
        out.append(f"      mean of {len(keys)} rounds, key/open: {rounds}")
        p99 = ratio(mean_of(keys, "p99_ms"), mean_of(opens, "p99_ms"))
        out.append(target(f"  {mode}: p99 with a key / open", f"{p99}x", "-"))
        cpu = f"{mean_of(keys, 'svc_us'):.1f}/{mean_of(opens, 'svc_us'):.1f}"
        out.append(target(f"  {mode}: service CPU us per consume, key / open", cpu, "-"))
    return out


def _overload(k: Knobs, results: Results) -> List[str]:
    """The flood against the row at BENCH_CONNECTIONS (100k subjects, or the first count)."""
    out: List[str] = []
    for mode in k.modes:
        flood = results.flood.get(mode)
        if flood is None:
            continue
        base = results.runs.get((mode, "sms", 100000)) or results.runs.get((mode, "sms", k.subjects[0]))
        if base is None:
            continue
        seconds = flood.f("seconds")
        good = f"{(flood.f('ok') + flood.f('denied')) / seconds:.0f}" if seconds > 0 else "0"
        v = ratio(float(good), base.f("rps"))
        label = f"overload: {mode} goodput at {k.flood_connections} connections / req/s at {k.connections}"
        out.append(target(label, f"{v}x", ">= 0.9x", at_least(v, 0.9)))
        admitted = flood.s("admitted_p99_ms")
        out.append(target("  p99 of the admitted answers (200 and 429)", f"{admitted} ms", "< 50 ms", flood.f("admitted_p99_ms") < 50))
        out.append(target("  p99 of every answer (a shed one waits QUEUE_WAIT first)", f"{flood.s('p99_ms')} ms"))
        out.append(
            target(
                f"  CPU us per answer at {k.connections} connections: service/redis/wrk",
                f"{base.s('svc_us')}/{base.s('redis_us')}/{base.s('wrk_us')}",
            )
        )
        out.append(
            target(
                "  CPU us per goodput answer in the flood: service/redis/wrk",
                f"{flood.s('svc_us')}/{flood.s('redis_us')}/{flood.s('wrk_us')}",
            )
        )
        total = sum(flood.f(kind) for kind in ("ok", "denied", "overloaded", "unavailable", "other"))
        shed = 100 * flood.f("overloaded") / total if total > 0 else 0
        out.append(target("  answered 503 overloaded", f"{shed:.0f}%"))
        bad = flood.i("unavailable") + flood.i("degraded")
        out.append(target("  store-down 503s + degraded allows", str(bad), "0", bad == 0))
    return out


def _outage_budget(results: Results) -> List[str]:
    """The Redis memory an outage of the ledger database costs, and how fast it drains."""
    b = results.backlog
    if b is None:
        return []
    per_entry = f"{b.bytes / b.waiting:.0f}" if b.waiting > 0 else "0"
    e = float(per_entry)
    minutes = f"{2**30 / e / b.rps / 60:.1f}" if e > 0 and b.rps > 0 else "0.0"
    ingest = b.waiting / b.drained_s if b.drained_s > 0 else 0.0
    return [
        target("outage budget: consumes/s, ledger database refusing writes", f"{b.rps:.0f}"),
        target("  ledger entries held in Redis", str(b.waiting)),
        target("  size of one waiting entry (single-policy consume)", f"{b.entry_size} B", "<= 200 B", b.entry_size <= 200),
        target("  Redis memory per waiting entry (stream overhead included)", f"{per_entry} B"),
        target("  minutes of outage per GiB of Redis headroom at that rate", minutes),
        target("  backlog drained after the database came back in", f"{b.drained_s:.1f} s"),
        # The drain's ingest from a full backlog with the service idle, into the bench's
        # SQLite ledger; the 50,000 entries/s target is for Postgres, measured by the
        # Postgres ingest row (scripts/bench/ingest.py).
        target("  drain ingest from that backlog (SQLite ledger), entries/s", f"{ingest:.0f}"),
    ]
