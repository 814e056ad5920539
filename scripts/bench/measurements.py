"""The measurement steps, and the load generator runs they are made of.

Each step records its figures in Results; table.py prints them. bench.py runs them in
this order:

  measure_baseline        redis-benchmark running a minimal check-and-charge script
  measure_consume_rows    per mode: the wrk rows, the gRPC row, the flood, ledger lag, RSS
  measure_peer_rows       right after them (limitador.py): the Limitador peer's calendar
                          rows, on Redis after the Redis mode's, in memory after embedded's
  after the Redis mode's rows:
    measure_memory        Redis memory per subject per window type
    measure_outage_budget consumes while the ledger database refuses writes
    measure_verify        counters verify on the ledger of the runs
    measure_idle_load     Redis commands/s of idle instances (1, then 4)
  after the embedded default's rows:
    measure_restart       restart to first consume on the ledger of the runs
    measure_crash_restart restart to first consume after kill -9 under full load
    measure_verify
  at the end:
    measure_exactness     (limitador.py) a burst against one subject at a limit of 5
"""

from __future__ import annotations

import csv
import json
import re
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

from knobs import BENCH_DIR, LIMIT, LOADGEN, SCENARIOS, Knobs
from processes import HZ, Failure, Processes, Redis, Service, cpu_ticks, load_average, log, log_field

CONSUME_LUA = BENCH_DIR / "consume.lua"
FLOOD_LUA = BENCH_DIR / "flood.lua"
FILL_LUA = BENCH_DIR / "fill.lua"
FILL_BUCKETS_LUA = BENCH_DIR / "fill-buckets.lua"
BASELINE_LUA = BENCH_DIR / "baseline.lua"


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------
class Line:
    """One load generator's result line, `TAG k=v k=v ...` (consume.lua's, flood.lua's and
    fill.lua's done() hooks and rls_load print one), with the figures the harness adds.
    Values are kept as printed: the table shows several of them as they are."""

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields: Dict[str, str] = dict(fields)

    @classmethod
    def find(cls, output: str, tag: str) -> Optional[Line]:
        """The first line of OUTPUT that starts with TAG (None when there is none)."""
        for text in output.splitlines():
            if text.startswith(tag + " "):
                pairs = (item.split("=", 1) for item in text.split()[1:] if "=" in item)
                return cls({key: value for key, value in pairs})
        return None

    def s(self, key: str) -> str:
        """The value as printed ("" when absent)."""
        return self.fields.get(key, "")

    def f(self, key: str) -> float:
        """The value as a number (0 when absent)."""
        try:
            return float(self.fields.get(key, "0"))
        except ValueError:
            return 0.0

    def i(self, key: str) -> int:
        return int(self.f(key))

    def add(self, **values: str) -> Line:
        self.fields.update(values)
        return self


@dataclass
class Baseline:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    redis_us: float  # Redis's CPU microseconds per call
    client_us: float  # redis-benchmark's


@dataclass
class MemoryFigure:
    delta: int  # used_memory bytes the fill added
    keys: int  # keys it added
    key_len: int
    sample: str  # one of those keys

    @property
    def per_key(self) -> float:
        return self.delta / self.keys if self.keys > 0 else 0.0


@dataclass
class LedgerLag:
    p99_s: str  # a bucket's upper bound as /metrics prints it, "+Inf", or "none"
    count: int


@dataclass
class Backlog:
    rps: float
    waiting: int  # ledger entries the run left waiting in Redis
    bytes: int  # the used_memory they added
    entry_size: int  # bytes of one waiting entry
    drained_s: float  # once the database was back


@dataclass
class Restart:
    entries: int  # covered by the snapshot + replayed after it
    seconds: float
    replayed: int


@dataclass
class CrashRestart:
    restart: Restart
    load_seconds: int  # how long the load ran before the kill
    snapshots: int  # snapshots the killed process took under the load
    max_pause_ms: int  # the longest any of them held the counters' changes back


@dataclass
class Verify:
    entries: int
    seconds: float
    checked: int
    alone: Line
    during: Line


# The scenarios compared with the calendar day measured right before and right after them,
# on the ledger as large as they found it (it grows with every row, and inserts slow as it
# does): the 3 budgets, and the day from a 04:00 cut-off.
BRACKETED = ("sms3", "sms-cut")

# Rounds of the API key rows (open, key, open, key, ...).
AUTH_ROUNDS = 2


def mean_of(lines: List[Line], field: str) -> float:
    """The mean of FIELD over the rounds' LINES (at least one)."""
    return sum(line.f(field) for line in lines) / len(lines)


@dataclass
class Results:
    baseline: Optional[Baseline] = None
    runs: Dict[Tuple[str, str, int], Line] = field(default_factory=dict)  # (mode, action, subjects)
    pairs: Dict[Tuple[str, str, int], Line] = field(default_factory=dict)  # (mode, before|after:ACTION, subjects)
    grpc: Dict[Tuple[str, int], Line] = field(default_factory=dict)  # (mode, subjects)
    auth: Dict[Tuple[str, str], List[Line]] = field(default_factory=dict)  # (mode, none|key): per round
    alerts: Dict[Tuple[str, str], List[Line]] = field(default_factory=dict)  # (mode, off|on): per round
    settings: Dict[Tuple[str, str], List[Line]] = field(default_factory=dict)  # (row, variant): per round
    deliveries: Dict[str, List[float]] = field(default_factory=dict)  # mode: crossing-to-delivery s
    alert_events: Dict[str, List[Tuple[int, int]]] = field(default_factory=dict)  # mode: (delivered, recorded)
    backtest: Dict[str, Tuple[int, int, float]] = field(default_factory=dict)  # mode: (entries, requests, s)
    peer: Dict[Tuple[str, int], Line] = field(default_factory=dict)  # Limitador (redis|memory, subjects)
    exact: Dict[str, Tuple[int, int, int]] = field(default_factory=dict)  # who: (admitted, denied, other)
    levels: Dict[Tuple[str, str], List[Line]] = field(default_factory=dict)  # (mode, entries|totals|peer): per round
    level_verify: Dict[str, bool] = field(default_factory=dict)  # mode: verify found no drift after the level rows
    flood: Dict[str, Line] = field(default_factory=dict)
    lag: Dict[str, LedgerLag] = field(default_factory=dict)
    rss: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # VmRSS, VmHWM KiB
    redis_keys: Optional[int] = None
    memory: Dict[str, MemoryFigure] = field(default_factory=dict)
    backlog: Optional[Backlog] = None
    idle: Dict[int, float] = field(default_factory=dict)  # instances -> commands/s
    restart: Optional[Restart] = None
    crash: Optional[CrashRestart] = None
    verify: Dict[str, Verify] = field(default_factory=dict)
    scale: Optional[Line] = None  # the ledger-at-scale line (scripts/bench/scale.py)
    redis_loss: Optional[Dict[str, Any]] = None  # the Redis-loss row (scripts/bench/scale.py)
    ingest: Optional[Any] = None  # the Postgres ingest row (scripts/bench/ingest.py)
    crash_at_scale: Optional[Restart] = None  # kill -9 on the Redis-loss row's ledger (scale.py)


class Bench:
    """What every step shares: the knobs, the processes, the private Redis, the results."""

    def __init__(self, knobs: Knobs, processes: Processes, tmp: Path) -> None:
        self.knobs = knobs
        self.processes = processes
        self.tmp = tmp
        self.redis = Redis(processes, tmp)
        self.results = Results()

    def service(self, mode: str, db: Optional[Path] = None, env: Optional[Mapping[str, str]] = None) -> Service:
        return Service(self.knobs, self.processes, self.tmp, mode, self.redis, db, env)


# ---------------------------------------------------------------------------
# Load generator runs
# ---------------------------------------------------------------------------
Args = Sequence[Union[str, Path]]


class Measured(Protocol):
    """What a measured run reads of the server under load: the service, or the peer."""

    def cpu_ticks(self) -> int: ...

    def thread_ticks(self) -> Tuple[int, int, int]: ...


def measured(bench: Bench, service: Measured, name: str, args: Args) -> Line:
    """Runs ARGS (a load generator printing one BENCH line) as the measured run of a row,
    its output in TMP/NAME.out; returns that line with, appended, the CPU microseconds per
    request of the service (svc_us, and its split by thread: http_us, sql_us, bg_us), of
    Redis (redis_us) and of the generator itself (wrk_us), and the machine's load average:
    on a shared machine they tell a slow run from a busy one."""
    s0, t0, r0 = service.cpu_ticks(), service.thread_ticks(), cpu_ticks(bench.redis.pid)
    out, err = bench.tmp / f"{name}.out", bench.tmp / f"{name}.err"
    _, generator_cpu = bench.processes.run(args, stdout=out, stderr=err)
    line = Line.find(out.read_text(errors="replace"), "BENCH")
    if line is None:
        raise Failure(f"{Path(args[0]).name} printed no result: {err.read_text(errors='replace')}")
    s1, t1, r1 = service.cpu_ticks(), service.thread_ticks(), cpu_ticks(bench.redis.pid)
    count = line.f("requests") if line.f("requests") > 0 else 1
    us = 1e6 / HZ / count
    return line.add(
        svc_us=f"{(s1 - s0) * us:.1f}",
        http_us=f"{(t1[0] - t0[0]) * us:.1f}",
        sql_us=f"{(t1[1] - t0[1]) * us:.1f}",
        bg_us=f"{(t1[2] - t0[2]) * us:.1f}",
        redis_us=f"{(r1 - r0) * us:.1f}",
        wrk_us=f"{generator_cpu * 1e6 / count:.1f}",
        load=load_average(),
    )


def _warm_up(bench: Bench, args: Args) -> None:
    code, _ = bench.processes.run(args, stdout=bench.tmp / "warmup.out", stderr=bench.tmp / "warmup.err")
    if code != 0:
        raise Failure(f"the warm-up run failed ({code}): {(bench.tmp / 'warmup.err').read_text(errors='replace')}")


def run_wrk(
    bench: Bench, service: Service, action: str, subjects: int, amount: str = "", countries: str = "", token: str = ""
) -> Line:
    """wrk POSTing /quota/consume (scripts/bench/consume.lua) for subjects u1..uSUBJECTS
    drawn uniformly, each with AMOUNT and a country drawn from COUNTRIES when given, and
    TOKEN as its bearer token when given: a warm-up, then one measured run (see
    `measured`)."""
    script_args = [action, str(subjects)]
    # consume.lua's arguments are positional: an empty AMOUNT stands for 1 before COUNTRIES,
    # and empty COUNTRIES for none before TOKEN.
    if amount or countries or token:
        script_args.append(amount)
    if countries or token:
        script_args.append(countries)
    if token:
        script_args.append(token)
    return run_wrk_script(bench, service, f"{service.base}/quota/consume", CONSUME_LUA, script_args)


def run_wrk_script(bench: Bench, server: Measured, url: str, script: Path, script_args: Sequence[str]) -> Line:
    """wrk running SCRIPT (which prints a BENCH line) against URL with SCRIPT_ARGS, at
    BENCH_CONNECTIONS connections and BENCH_THREADS threads: a warm-up, then one measured
    run of SERVER (see `measured`). Every wrk row goes through here, the service's and the
    Limitador peer's alike."""
    k = bench.knobs
    args: List[Union[str, Path]] = [
        f"-t{k.threads}", f"-c{k.connections}", "--timeout", "5s", "-s", script, url, "--", *script_args,
    ]  # fmt: skip
    if k.warmup > 0:
        _warm_up(bench, ["wrk", f"-d{k.warmup}s"] + args)
    return measured(bench, server, "wrk", ["wrk", f"-d{k.duration}s"] + args)


def run_grpc(bench: Bench, service: Service, action: str, subjects: int) -> Line:
    """As run_wrk, with Envoy's ShouldRateLimit over gRPC (examples/rls_load.rs): one
    descriptor [subject=user-<n>], n uniform in [1, SUBJECTS], at BENCH_CONNECTIONS streams
    over BENCH_GRPC_CONNECTIONS HTTP/2 connections; wrk_us is then rls_load's. Its subjects
    are named apart from wrk's: it charges fresh counters, as the HTTP row did."""
    k = bench.knobs
    args: List[Union[str, Path]] = [
        LOADGEN, "--url", f"http://127.0.0.1:{service.grpc_port}", "--domain", action,
        "--concurrency", str(k.connections), "--connections", str(k.grpc_connections),
        "--subjects", str(subjects), "--warmup", "0",
    ]  # fmt: skip
    if k.warmup > 0:
        _warm_up(bench, args + ["--duration", str(k.warmup)])
    return measured(bench, service, "grpc", args + ["--duration", str(k.duration)])


def run_flood(bench: Bench, service: Service, action: str, subjects: int) -> Line:
    """The calendar scenario at BENCH_FLOOD_CONNECTIONS connections (scripts/bench/flood.lua),
    the answers counted by kind, with the degraded allows the service counted meanwhile and
    the CPU microseconds per goodput answer (200 or 429) of the service, Redis and wrk: where
    the time goes under the flood, beside the 50-connection row's per-request figures."""
    k = bench.knobs
    d0 = service.metric("quota_degraded_allows_total")
    s0, r0 = service.cpu_ticks(), cpu_ticks(bench.redis.pid)
    out, err = bench.tmp / "flood.out", bench.tmp / "flood.err"
    _, wrk_cpu = bench.processes.run(
        ["wrk", f"-t{k.threads}", f"-c{k.flood_connections}", f"-d{k.duration}s", "--timeout", "5s",
         "-s", FLOOD_LUA, f"{service.base}/quota/consume", "--", action, str(subjects)],
        stdout=out, stderr=err,
    )  # fmt: skip
    line = Line.find(out.read_text(errors="replace"), "BENCH")
    if line is None:
        raise Failure(f"wrk printed no result: {err.read_text(errors='replace')}")
    s1, r1 = service.cpu_ticks(), cpu_ticks(bench.redis.pid)
    d1 = service.metric("quota_degraded_allows_total")
    good = line.i("ok") + line.i("denied")
    per = good if good > 0 else 1
    us = 1e6 / HZ / per
    return line.add(
        degraded=str(int(d1) - int(d0)),
        svc_us=f"{(s1 - s0) * us:.1f}",
        redis_us=f"{(r1 - r0) * us:.1f}",
        wrk_us=f"{wrk_cpu * 1e6 / per:.1f}",
    )


# ---------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------
def measure_baseline(bench: Bench) -> None:
    """What a Redis-backed quota check costs at the least: redis-benchmark running a minimal
    atomic check-and-charge Lua script (scripts/bench/baseline.lua) by EVALSHA, with
    BENCH_CONNECTIONS clients over 100k keys, for about BENCH_DURATION seconds; with the CPU
    microseconds per call of Redis and of redis-benchmark. The consume rows' throughput is
    compared with it, within the same run on the same machine."""
    k, redis = bench.knobs, bench.redis
    sha = redis.command("SCRIPT", "LOAD", BASELINE_LUA.read_text())
    assert isinstance(sha, bytes)
    args: List[Union[str, Path]] = [
        "-h", "127.0.0.1", "-p", str(redis.port), "-c", str(k.connections), "-r", "100000", "--csv",
        "EVALSHA", sha.decode(), "1", "counter:__rand_int__", str(LIMIT), "1", "90000000",
    ]  # fmt: skip
    log(f"baseline: redis-benchmark EVALSHA, {k.connections} clients, 100k keys")
    # A short run to warm up and size the measured one to about BENCH_DURATION seconds.
    warm = _benchmark_csv(bench.processes.output(["redis-benchmark", "-n", "50000"] + args))
    n = max(int(float(warm[1]) * k.duration), 10000)
    r0 = cpu_ticks(redis.pid)
    out = bench.tmp / "baseline.csv"
    _, client_cpu = bench.processes.run(["redis-benchmark", "-n", str(n)] + args, stdout=out, stderr=bench.tmp / "baseline.err")
    r1 = cpu_ticks(redis.pid)
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    row = _benchmark_csv(out.read_text())
    bench.results.baseline = Baseline(
        rps=float(row[1]),
        p50_ms=float(row[4]),
        p99_ms=float(row[6]),
        requests=n,
        redis_us=float(f"{(r1 - r0) * 1e6 / HZ / n:.1f}"),
        client_us=float(f"{client_cpu * 1e6 / n:.1f}"),
    )
    redis.flushall()


def _benchmark_csv(output: str) -> List[str]:
    """The last row of redis-benchmark's --csv output."""
    rows = [row for row in csv.reader(output.splitlines()) if row]
    if not rows or len(rows[-1]) < 7:
        raise Failure(f"redis-benchmark printed no result: {output!r}")
    return rows[-1]


def measure_consume_rows(bench: Bench, mode: str) -> Service:
    """The consume path's throughput and latency: the service in MODE (on the private Redis,
    or embedded), POST /quota/consume with wrk at BENCH_CONNECTIONS connections, for each
    scenario (calendar day, 3 budgets, rolling 24 h in 24 buckets, token bucket, count +
    amount) at each subject count. Each 3-budget row is bracketed by two calendar-day rows
    (the 3-budget target compares it with their mean); the gRPC row follows the calendar-day
    row it is compared with. Then the flood, the ledger lag and the service's memory.
    Returns the (stopped) service, whose database and log the later steps reuse."""
    k, results = bench.knobs, bench.results
    if mode == "redis":
        bench.redis.flushall()
    service = bench.service(mode).start()
    service.create_policies()
    for scenario in SCENARIOS:
        for subjects in k.subjects:
            bracketed = scenario.action in BRACKETED
            if bracketed:
                log(f"{mode}: calendar day, {subjects} subjects (before the {scenario.label} row)")
                results.pairs[(mode, f"before:{scenario.action}", subjects)] = run_wrk(bench, service, "sms", subjects)
            log(f"{mode}: {scenario.label}, {subjects} subjects")
            results.runs[(mode, scenario.action, subjects)] = run_wrk(
                bench, service, scenario.action, subjects, scenario.amount, scenario.countries
            )
            if bracketed:
                log(f"{mode}: calendar day, {subjects} subjects (after the {scenario.label} row)")
                results.pairs[(mode, f"after:{scenario.action}", subjects)] = run_wrk(bench, service, "sms", subjects)
            if k.grpc and scenario.action == "sms" and subjects == k.grpc_subjects:
                measure_grpc_row(bench, service, mode, subjects)
    if k.flood_connections > 0:
        measure_flood(bench, service, mode)
    results.lag[mode] = measure_ledger_lag(service)
    results.rss[mode] = service.memory_kib()
    if mode == "redis":
        results.redis_keys = bench.redis.dbsize()
    service.stop()
    return service


def measure_auth_rows(bench: Bench, mode: str) -> None:
    """What an API key costs a consume: the calendar day at the gRPC row's subject count on
    fresh services alike (a fresh database, Redis flushed), with open quota endpoints, then
    with an API key for the action as every request's bearer token (a key closes the
    endpoints of its service for good, hence a service per row), in AUTH_ROUNDS alternating
    rounds, so that drift over the run falls on both sides alike."""
    subjects = bench.knobs.grpc_subjects
    for round_ in range(AUTH_ROUNDS):
        for variant in ("none", "key"):
            if mode == "redis":
                bench.redis.flushall()
            service = bench.service(mode).start()
            service.create_policies()
            token = ""
            if variant == "key":
                body = {"name": "bench", "actions": ["sms"], "operations": ["consume"]}
                status, answer = service.request("POST", "/admin/keys", body, admin=True)
                if status != 201:
                    raise Failure(f"creating an API key answered {status}: {answer.decode(errors='replace')}")
                token = json.loads(answer)["key"]
            log(f"{mode}: calendar day, {subjects} subjects, auth: {variant} (round {round_ + 1} of {AUTH_ROUNDS})")
            bench.results.auth.setdefault((mode, variant), []).append(
                run_wrk(bench, service, "sms", subjects, token=token)
            )
            service.stop()


def measure_grpc_row(bench: Bench, service: Service, mode: str, subjects: int) -> None:
    """Envoy's ShouldRateLimit over gRPC for the calendar-day policy, right after the HTTP
    row it is compared with (same policy, same subject count, same ledger size)."""
    log(f"{mode}: grpc ShouldRateLimit, {subjects} subjects")
    bench.results.grpc[(mode, subjects)] = run_grpc(bench, service, "sms", subjects)


def measure_flood(bench: Bench, service: Service, mode: str) -> None:
    """Overload: the calendar day at BENCH_FLOOD_CONNECTIONS connections, 100k subjects:
    goodput against the 50-connection rate, the admitted answers' p99, and no store-down
    answer nor degraded allow (admission control sheds with 503 overloaded instead)."""
    log(f"{mode}: calendar day at {bench.knobs.flood_connections} connections")
    bench.results.flood[mode] = run_flood(bench, service, "sms", 100000)


def measure_ledger_lag(service: Service) -> LedgerLag:
    """How far the ledger trails the decisions: once the Redis streams are empty (60 s at
    most), the p99 of quota_ledger_lag_seconds (decision to SQL commit) over every entry the
    runs wrote, read off /metrics: the upper bound of the bucket that holds the 99th
    percentile."""
    for _ in range(600):
        if service.metric("quota_ledger_backlog_entries") == 0:
            break
        time.sleep(0.1)
    buckets: List[Tuple[str, float]] = []
    count = 0.0
    for text in service.metrics_text().splitlines():
        fields = text.split()
        if text.startswith("quota_ledger_lag_seconds_bucket") and len(fields) >= 2:
            match = re.search(r'le="([^"]*)"', text)
            buckets.append((match.group(1) if match else "", float(fields[1])))
        elif fields and fields[0] == "quota_ledger_lag_seconds_count" and len(fields) >= 2:
            count = float(fields[1])
    p99 = next((le for le, cumulative in buckets if count > 0 and cumulative >= 0.99 * count), "none")
    return LedgerLag(p99, int(count))


def measure_memory(bench: Bench) -> None:
    """Redis memory per subject per policy, for each window type: the used_memory (and key
    count) delta after charging BENCH_MEMORY_SUBJECTS distinct subjects once each through
    the service (scripts/bench/fill.lua); for the rolling window, again with all 25 buckets
    that count in use (scripts/bench/fill-buckets.lua). Redis is flushed under the running
    service before each window type, and the fill waits until the service has rebuilt its
    shards from the ledger. Then the service's resident memory."""
    redis = bench.redis
    service = bench.service("redis").start()
    service.create_policies()
    for label, action in (("calendar", "sms"), ("rolling", "upload"), ("token_bucket", "api")):
        log(f"memory: {label}, {bench.knobs.memory_subjects} subjects")
        open_shards = _epochs(redis)
        redis.flushall()
        _wait_reopened(service, redis, action, open_shards)
        # The rebuild wrote back the counters of the earlier fills that the ledger still
        # counts: the fill's figures are deltas, in keys as in bytes.
        keys0 = redis.dbsize()
        before = redis.used_memory()
        _fill(bench, service, action)
        time.sleep(0.5)
        after = redis.used_memory()
        keys = redis.dbsize() - keys0
        sample = redis.first_key(f"*{action}|u12345")
        bench.results.memory[label] = MemoryFigure(after - before, keys, len(sample), sample)
        if label == "rolling":
            # Every bucket in use: the 24 older buckets of a subject active all day.
            redis.command("EVAL", FILL_BUCKETS_LUA.read_text(), 0, f"*{action}|*", 24)
            after = redis.used_memory()
            bench.results.memory["rolling-full"] = MemoryFigure(after - before, keys, len(sample), sample)
    bench.results.rss["redis-fill"] = service.memory_kib()
    service.stop()
    redis.flushall()


def _epochs(redis: Redis) -> int:
    """How many shards of the counter store are open (have their "#epoch" key)."""
    return len(redis.scan("*#epoch"))


def _wait_reopened(service: Service, redis: Redis, action: str, want: int) -> None:
    """After a FLUSHALL under the running service, waits (30 s at most) until a probe
    consume of ACTION answers 200 and WANT shards are open again. The service finds the
    shards without their epoch and answers 503 while it rebuilds them from the ledger: a
    fill started meanwhile would lose its charges. The rebuild opens one shard after the
    other, so the probe's 200 alone (its own shard) is not enough."""
    status, open_shards = 0, 0
    for _ in range(300):
        status = service.consume(action, "flush-probe")
        if status == 200:
            open_shards = _epochs(redis)
            if open_shards >= want:
                return
        time.sleep(0.1)
    raise Failure(f"30 s after the flush, a consume of {action} answers {status} and {open_shards} of {want} shards are open")


def _fill(bench: Bench, service: Service, action: str) -> None:
    """Charges u1..uBENCH_MEMORY_SUBJECTS once each through the service."""
    k, runs = bench.knobs, bench.results.runs
    # The calendar rate at 100k subjects (at the first subject count when 100k is not
    # measured, or 1000/s) sets a generous duration: wrk runs all of it, even after its
    # threads have stopped once every subject was sent.
    line = runs.get(("redis", "sms", 100000)) or runs.get(("redis", "sms", k.subjects[0]))
    rps = int(line.f("rps")) if line else 0
    if rps <= 1000:
        rps = 1000
    seconds = 2 * k.memory_subjects // rps + 2
    out, err = bench.tmp / "fill.out", bench.tmp / "fill.err"
    bench.processes.run(
        ["wrk", f"-t{k.threads}", f"-c{k.connections}", f"-d{seconds}s", "--timeout", "5s", "-s", FILL_LUA,
         f"{service.base}/quota/consume", "--", action, str(k.memory_subjects), str(k.threads)],
        stdout=out, stderr=err,
    )  # fmt: skip
    fill = Line.find(out.read_text(errors="replace"), "FILL")
    if fill is None:
        raise Failure(f"wrk printed no fill result: {err.read_text(errors='replace')}")
    if fill.s("non2xx") != "0":
        log(f"warning: filling {action}: requests={fill.s('requests')} non2xx={fill.s('non2xx')} (errors are not charged)")


LOCK_SCRIPT = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def measure_outage_budget(bench: Bench) -> None:
    """The outage budget: the service on Redis while its ledger database refuses writes (a
    SQLite write lock held by another process, as a Postgres outage looks to the drain):
    the consumes/s, the ledger entries left waiting in Redis, the Redis memory each takes
    (the used_memory delta over their number; 1,000 subjects, so that counters are a
    negligible part of it) and the size of one, and how long the backlog takes to drain
    once the database is back."""
    k, redis = bench.knobs, bench.redis
    service = bench.service("redis", env={"QUOTA_LEDGER_BACKLOG_MAX": "100000000"}).start()
    service.create_policies()
    log("outage budget: consumes while the ledger database refuses writes")
    lock = _lock_database(bench, service.db, k.warmup + k.duration + 30)
    time.sleep(1)
    before = redis.used_memory()
    w0 = service.metric("quota_ledger_backlog_entries")
    line = run_wrk(bench, service, "sms", 1000)
    after = redis.used_memory()
    w1 = service.metric("quota_ledger_backlog_entries")
    stream = redis.first_key("*#ledger")
    entry = redis.command("XRANGE", stream, "-", "+", "COUNT", 1) if stream else []
    # The entry's first field value: the compact ledger entry itself.
    sample = entry[0][1][1] if isinstance(entry, list) and entry and len(entry[0][1]) >= 2 else b""
    bench.processes.stop(lock)
    t0 = time.monotonic()
    while service.metric("quota_ledger_backlog_entries") > 0:
        if time.monotonic() - t0 > 600:
            raise Failure("the ledger backlog did not drain within 10 minutes of the database's return")
        time.sleep(0.1)
    drained = time.monotonic() - t0
    bench.results.backlog = Backlog(line.f("rps"), int(w1 - w0), after - before, len(sample), round(drained, 1))
    service.stop()
    redis.flushall()


def _lock_database(bench: Bench, db: Path, seconds: int) -> subprocess.Popen[bytes]:
    """Holds SQLite's write lock on DB for SECONDS in another process: the service's ledger
    inserts then fail after their busy timeout, and its reads go on (WAL)."""
    out = bench.tmp / "lock.out"
    with open(out, "wb") as f:
        process = bench.processes.start([sys.executable, "-c", LOCK_SCRIPT, str(db), str(seconds)], stdout=f, stderr=f)
    for _ in range(100):
        if "locked" in out.read_text(errors="replace"):
            return process
        time.sleep(0.1)
    raise Failure(f"could not lock the ledger database: {out.read_text(errors='replace')}")


def measure_idle_load(bench: Bench, instances: int) -> None:
    """The idle Redis load: the commands per second Redis runs for INSTANCES instances with
    no traffic (each on a database of its own: their ledger drain, hold sweeper, readiness),
    counted with INFO stats over BENCH_IDLE_SECONDS, after 3 s for their starts to settle."""
    services = [bench.service("redis").start() for _ in range(instances)]
    time.sleep(3)
    c0 = bench.redis.commands_processed()
    time.sleep(bench.knobs.idle_seconds)
    c1 = bench.redis.commands_processed()
    for service in services:
        service.stop()
    # The first INFO that measured is a Redis command too: not counted.
    bench.results.idle[instances] = round((c1 - c0 - 1) / bench.knobs.idle_seconds, 1)


def measure_restart(bench: Bench, stopped: Service) -> None:
    """Restart to first consume: the embedded default restarted on the ledger its runs left
    (every entry inside its policies' windows), after the graceful stop that ended them and
    saved a snapshot of its counters: the time from the start of the process until its first
    consume is answered, which waits for the snapshot to be loaded and the ledger after it
    replayed. Records the ledger's entries (those the snapshot covers plus those replayed),
    the seconds, and how many entries were replayed."""
    log("embedded: restart on the ledger of the runs")
    if not stopped.log_line("saved a snapshot"):
        raise Failure("the embedded service's graceful stop saved no snapshot")
    service, seconds = _start_until_served(bench, stopped.db, "the restarted service")
    line = service.log_line("rebuilt the in-process counters")
    covered, replayed = log_field("snapshot_seq", line), log_field("entries", line) or "0"
    if not covered.isdigit() or not replayed.isdigit():
        raise Failure(f"the restart did not load the snapshot: {line}")
    bench.results.restart = Restart(int(covered) + int(replayed), round(seconds, 2), int(replayed))
    service.stop()


def _start_until_served(bench: Bench, db: Path, what: str) -> Tuple[Service, float]:
    """The embedded service started on DB, and the seconds from its start until its first
    consume was answered (10 minutes at most)."""
    t0 = time.monotonic()
    service = bench.service("embedded", db=db).start(tries=6000)
    while not 200 <= service.consume("sms", "restart-probe") < 400:
        if time.monotonic() - t0 > 600:
            raise Failure(f"{what} answered no consume within 10 minutes")
        time.sleep(0.02)
    return service, time.monotonic() - t0


def wrk_in_background(bench: Bench, service: Service, seconds: int) -> "subprocess.Popen[bytes]":
    """wrk consuming for SECONDS (the calendar day, 100k subjects, BENCH_CONNECTIONS
    connections), not measured: the load under which a row's event happens."""
    k = bench.knobs
    return bench.processes.start(
        ["wrk", f"-t{k.threads}", f"-c{k.connections}", f"-d{seconds}s", "--timeout", "5s",
         "-s", CONSUME_LUA, f"{service.base}/quota/consume", "--", "sms", "100000"]
    )  # fmt: skip


CRASH_LOAD_SECONDS = 60


def measure_crash_restart(bench: Bench) -> None:
    """Restart to first consume after kill -9 under full load: a fresh embedded service
    under wrk (the calendar day, 100k subjects, BENCH_CONNECTIONS connections) for
    CRASH_LOAD_SECONDS, killed with SIGKILL while wrk still runs, then started on its
    ledger: the time from the start of the process until its first consume is answered.
    A busy service snapshots its counters every QUOTA_SNAPSHOT_ENTRIES ledger entries,
    so the start replays only those after the last one, whatever the load was; the
    snapshots' pauses (changes held back while the store is copied) are read from the
    killed process's log."""
    log(f"embedded: kill -9 after {CRASH_LOAD_SECONDS} s of full load, then restart")
    service = bench.service("embedded").start()
    service.create_policies()
    restarted, restart = kill_and_restart(bench, service, CRASH_LOAD_SECONDS, "the service restarted after kill -9")
    pauses = [int(log_field("paused_ms", line) or "0")
              for line in service.log_text().splitlines() if "saved a snapshot" in line]  # fmt: skip
    bench.results.crash = CrashRestart(restart, CRASH_LOAD_SECONDS, len(pauses), max(pauses, default=0))
    restarted.stop()


def kill_and_restart(bench: Bench, service: Service, seconds: int, what: str) -> Tuple[Service, Restart]:
    """SERVICE (embedded) under full load for SECONDS, killed with SIGKILL while wrk still
    runs, then started on its ledger: the restarted service, and the seconds from its start
    until its first consume was answered, with what it rebuilt its counters from."""
    wrk = wrk_in_background(bench, service, seconds + 30)
    time.sleep(seconds)
    assert service.process is not None
    service.process.kill()
    service.process.wait()
    bench.processes.stop(wrk)
    restarted, took = _start_until_served(bench, service.db, what)
    line = restarted.log_line("rebuilt the in-process counters")
    covered, replayed = log_field("snapshot_seq", line) or "0", log_field("entries", line) or "0"
    if not covered.isdigit() or not replayed.isdigit():
        raise Failure(f"{what} did not say what it rebuilt: {line}")
    return restarted, Restart(int(covered) + int(replayed), round(took, 2), int(replayed))


def measure_verify(bench: Bench, mode: str, db: Path) -> None:
    """Counters verify on the ledger the runs left, with the service (MODE) restarted on it:
    the seconds one GET /admin/counters/verify takes (a replay of the ledger's horizon into
    memory, compared with the live counters; with Redis, read shard by shard at one instant
    each), to be read per million ledger entries; then the calendar-day consume row at 100k
    subjects twice, alone and while verifies run back to back: the throughput a verify
    costs the consumes."""
    log(f"{mode}: counters verify on the ledger of the runs")
    entries = _ledger_entries(db)
    service = bench.service(mode, db=db).start(tries=6000)
    t0 = time.monotonic()
    status, body = service.request("GET", "/admin/counters/verify", admin=True, timeout=None)
    seconds = time.monotonic() - t0
    try:
        checked = int(json.loads(body)["checked"])
    except (ValueError, KeyError, TypeError):
        raise Failure(f"counters verify answered {status}: {body.decode(errors='replace') or 'nothing'}") from None
    alone = run_wrk(bench, service, "sms", 100000)
    stop = threading.Event()

    def verify_back_to_back() -> None:
        while not stop.is_set() and service.alive():
            if service.request("GET", "/admin/counters/verify", admin=True, timeout=None)[0] == 0:
                time.sleep(0.1)

    loop = threading.Thread(target=verify_back_to_back, name="verify-loop", daemon=True)
    loop.start()
    try:
        during = run_wrk(bench, service, "sms", 100000)
    finally:
        stop.set()
        service.stop()  # ends the verify in flight too
        loop.join(timeout=10)
    bench.results.verify[mode] = Verify(entries, round(seconds, 2), checked, alone, during)


def _ledger_entries(db: Path) -> int:
    """The ledger's entries in the SQLite database DB (0 when it cannot be read)."""
    try:
        conn = sqlite3.connect(str(db))
        try:
            return int(conn.execute("SELECT COUNT(*) FROM ledger_entries").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0

