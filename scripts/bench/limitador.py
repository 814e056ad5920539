"""The Limitador rows: a peer measured beside the service, the same way.

The peer (scripts/bench/limitador/, a cargo project of its own that only the bench builds)
is Limitador's own library behind actix-web, as limitador-server serves it: POST
/check_and_report with `{"namespace", "values": {"subject": ...}, "delta": 1}`, one limit of
LIMIT per 86400 s by subject in namespace sms (the calendar-day policy's action and limit).
Its rows are measured right after the service's consume rows of the matching mode, with
the same wrk settings and subjects (scripts/bench/limitador.lua): on the private Redis
(flushed first; Limitador's AsyncRedisStorage) after the Redis mode's rows, and in memory
(its in-memory storage) after the embedded default's. The targets compare the service's
calendar-day rows with them at each subject count.

The exactness rows: EXACT_REQUESTS requests at once (each on a connection of its own,
opened first) for one subject with a limit of EXACT_LIMIT, against a fresh service in each
mode and a fresh peer in the matching storage: how many were admitted.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from knobs import BENCH_DIR, LIMIT, PEER_BINARY, PEER_MANIFEST, PEER_TARGET, ROOT, Knobs
from measurements import Bench, Line, Results, run_wrk_script
from processes import Failure, cpu_ticks, free_port, log, thread_ticks

PEER_LUA = BENCH_DIR / "limitador.lua"
# The calendar-day policy's action: the peer's namespace.
ACTION = "sms"
# The peer's storage beside each mode of the service.
STORAGES: Dict[str, str] = {"redis": "redis", "embedded": "memory"}
# What each mode's calendar day (entries) should reach against the peer beside it: req/s
# (that many times the peer's) and the service's own p99 (under that many ms). The record
# level rows of levels.py (LEVEL_TARGETS, on 3 rounds) carry the verdicts: these one-round
# rows show them for reference.
FLOORS: Dict[str, Tuple[float, float]] = {"redis": (0.8, 5.0), "embedded": (0.4, 10.0)}
EXACT_REQUESTS = 200
EXACT_LIMIT = 5
EXACT_ACTION = "exact"

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def prepare_peer(knobs: Knobs) -> bool:
    """Builds the peer (unless BENCH_NO_BUILD=1 or BENCH_BINARY); whether its rows run."""
    if not knobs.limitador:
        return False
    if knobs.build:
        log(f"cargo build --release --manifest-path {PEER_MANIFEST.relative_to(ROOT)} (the Limitador peer)")
        env = dict(os.environ, CARGO_TARGET_DIR=str(PEER_TARGET))
        done = subprocess.run(
            ["cargo", "build", "--release", "--locked", "--quiet", "--manifest-path", str(PEER_MANIFEST)],
            cwd=ROOT,
            env=env,
        )
        if done.returncode != 0:
            raise Failure("building the Limitador peer failed (BENCH_LIMITADOR=0 skips its rows)")
    if not os.access(PEER_BINARY, os.X_OK):
        log(
            f"{PEER_BINARY.relative_to(ROOT)} is missing: the Limitador rows are skipped (build it with"
            f" CARGO_TARGET_DIR={PEER_TARGET.relative_to(ROOT)} cargo build --release --manifest-path"
            f" {PEER_MANIFEST.relative_to(ROOT)}, or run without BENCH_NO_BUILD / BENCH_BINARY)"
        )
        return False
    return True


class Peer:
    """One limitador-peer process, in memory or on the private Redis."""

    starts = 0

    def __init__(self, bench: Bench, storage: str) -> None:
        Peer.starts += 1
        self.bench = bench
        self.storage = storage
        self.log_path = bench.tmp / f"limitador-{Peer.starts}.log"
        self.port = 0
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None

    def start(self, limits: Sequence[Tuple[str, int]]) -> Peer:
        """Starts it with LIMITS (namespace, max) per 86400 s by subject; waits 10 s at most
        for GET /status to answer 200."""
        self.port = free_port()
        args: List[str] = [str(PEER_BINARY), "--listen", f"127.0.0.1:{self.port}", "--seconds", "86400",
                           "--variable", "subject"]  # fmt: skip
        for namespace, max_value in limits:
            args += ["--limit", f"{namespace}={max_value}"]
        if self.storage == "redis":
            args += ["--redis", self.bench.redis.url]
        # Its storage is its arguments' alone: not a REDIS_URL the environment may hold.
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "LIMITADOR_PEER_LISTEN")}
        with open(self.log_path, "wb") as out:
            self.process = self.bench.processes.start(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        for _ in range(100):
            if self._status() == 200:
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        sys.stderr.write(self.log_path.read_text(errors="replace"))
        raise Failure(f"the Limitador peer ({self.storage}) did not become ready")

    def _status(self) -> int:
        try:
            with _HTTP.open(self.base + "/status", timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except (OSError, http.client.HTTPException):
            return 0

    def stop(self) -> None:
        self.bench.processes.stop(self.process)

    # -- what a measured run reads (measurements.Measured)
    def cpu_ticks(self) -> int:
        return cpu_ticks(self.pid)

    def thread_ticks(self) -> Tuple[int, int, int]:
        return thread_ticks(self.pid)


def measure_peer_rows(bench: Bench, mode: str) -> None:
    """The peer's calendar-day rows beside the service's in MODE: at each subject count, wrk
    as run_wrk runs it (scripts/bench/limitador.lua)."""
    storage = STORAGES[mode]
    if storage == "redis":
        bench.redis.flushall()
    peer = Peer(bench, storage).start([(ACTION, LIMIT)])
    try:
        for subjects in bench.knobs.subjects:
            log(f"limitador {storage}: calendar day, {subjects} subjects")
            bench.results.peer[(storage, subjects)] = run_wrk_script(
                bench, peer, f"{peer.base}/check_and_report", PEER_LUA, [ACTION, str(subjects)]
            )
    finally:
        peer.stop()
    if storage == "redis":
        bench.redis.flushall()


def _burst(port: int, path: str, body: dict, n: int) -> Tuple[int, int, int]:
    """N POSTs of BODY to PATH at once, each on a connection opened beforehand: (200s,
    429s, anything else)."""
    payload = json.dumps(body).encode()
    statuses = [0] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.connect()
        except OSError:
            barrier.abort()
            return
        try:
            barrier.wait(timeout=30)
            conn.request("POST", path, payload, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            statuses[i] = answer.status
        except (OSError, http.client.HTTPException, threading.BrokenBarrierError):
            pass
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(i,), name=f"burst-{i}", daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    admitted, denied = statuses.count(200), statuses.count(429)
    return admitted, denied, n - admitted - denied


def measure_exactness(bench: Bench) -> None:
    """EXACT_REQUESTS requests at once for one subject at a limit of EXACT_LIMIT: a fresh
    service in each mode (a fresh database, Redis flushed), then a fresh peer in the
    matching storage."""
    policy = {"id": "exact-day", "action": EXACT_ACTION, "measure": "count", "limit": EXACT_LIMIT,
              "window": {"type": "calendar", "period": "day", "timezone": "UTC"}}  # fmt: skip
    # The same limit recorded in totals (record levels: scripts/bench/levels.py).
    totals = dict(policy, id="exact-day-totals", action=f"{EXACT_ACTION}-totals", record="totals")
    for mode in bench.knobs.modes:
        if mode == "redis":
            bench.redis.flushall()
        service = bench.service(mode).start()
        for each in (policy, totals):
            status, answer = service.request("POST", "/admin/policies", each, admin=True)
            if status != 201:
                raise Failure(f"creating the exactness policy answered {status}: {answer.decode(errors='replace')}")
        for who, action in ((f"quota-ledger {mode}", EXACT_ACTION), (f"quota-ledger {mode} totals", totals["action"])):
            log(f"{who}: exactness, {EXACT_REQUESTS} requests at once for one subject, limit {EXACT_LIMIT}")
            bench.results.exact[who] = _burst(
                service.port, "/quota/consume", {"action": action, "subject": "u1"}, EXACT_REQUESTS
            )
        service.stop()

        storage = STORAGES[mode]
        if storage == "redis":
            bench.redis.flushall()
        peer = Peer(bench, storage).start([(EXACT_ACTION, EXACT_LIMIT)])
        log(f"limitador {storage}: exactness, {EXACT_REQUESTS} requests at once for one subject, limit {EXACT_LIMIT}")
        try:
            bench.results.exact[f"limitador {storage}"] = _burst(
                peer.port, "/check_and_report",
                {"namespace": EXACT_ACTION, "values": {"subject": "u1"}, "delta": 1}, EXACT_REQUESTS,
            )  # fmt: skip
        finally:
            peer.stop()
        if storage == "redis":
            bench.redis.flushall()


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------
Row = Callable[..., List[str]]


def peer_rows(
    knobs: Knobs, results: Results, row: Row, ratio: Callable[[float, float], str]
) -> Tuple[List[str], List[str]]:
    """The peer's rows of the main table, and their footnote (none when it did not run)."""
    out: List[str] = []
    for storage in ("redis", "memory"):
        first_p99: Optional[float] = None
        for subjects in knobs.subjects:
            line: Optional[Line] = results.peer.get((storage, subjects))
            if line is None:
                continue
            if first_p99 is None:
                first_p99 = line.f("p99_ms")
            out += row("limitador", f"{storage}, calendar", subjects, line, ratio(line.f("p99_ms"), first_p99))
    if not out:
        return [], []
    notes = [
        "(limitador: Limitador's library behind actix-web (scripts/bench/limitador/), POST /check_and_report",
        f" of one unit for the same subjects, one limit of {LIMIT} per 86400 s by subject; redis: its",
        " AsyncRedisStorage on the same private Redis, flushed first; memory: its in-memory storage;",
        " svc_us is the peer's CPU, http its actix workers, bg its main thread (the Redis connection))",
    ]
    return out, notes


def peer_targets(knobs: Knobs, results: Results, target, ratio, at_least) -> List[str]:  # type: ignore[no-untyped-def]
    """The service's calendar-day rows against the peer beside them, at each subject count;
    then the exactness rows."""
    out: List[str] = []
    for mode in knobs.modes:
        storage = STORAGES[mode]
        floor, p99_max = FLOORS[mode]
        for subjects in knobs.subjects:
            ours, theirs = results.runs.get((mode, "sms", subjects)), results.peer.get((storage, subjects))
            if ours is None or theirs is None:
                continue
            # One row each: the record level rows (levels.py) read the targets on 3 rounds.
            v = ratio(ours.f("rps"), theirs.f("rps"))
            label = f"quota-ledger {mode} / Limitador {storage}, req/s @{subjects}"
            out.append(target(label, f"{v}x", f"({floor:g}x)", None))
            label = f"  p99: quota-ledger {mode} calendar @{subjects}, {knobs.connections} connections"
            p99 = f"{ours.f('p99_ms'):.2f} ms"
            out.append(target(label, p99, f"({p99_max:g} ms)", None))
            figures = f"{ours.f('rps'):.0f}/{theirs.f('rps'):.0f}"
            out.append(target(f"  req/s: quota-ledger {mode} / Limitador {storage}", figures))
            out.append(target(f"  p99: Limitador {storage}", f"{theirs.f('p99_ms'):.2f} ms"))
    if results.exact:
        out.append(f"  exactness: {EXACT_REQUESTS} requests at once for one subject, limit {EXACT_LIMIT}")
        for who, (admitted, denied, other) in results.exact.items():
            figures = f"{admitted}/{denied}/{other}"
            label = f"    {who}: admitted / denied / other"
            if who.startswith("quota-ledger"):
                # Ours must admit exactly the limit, at every record level.
                exact = f"{EXACT_LIMIT}/{EXACT_REQUESTS - EXACT_LIMIT}/0"
                out.append(target(label, figures, exact, figures == exact))
            else:
                out.append(target(label, figures, "-"))
    return out
