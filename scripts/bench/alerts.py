"""The alert rows: what alert thresholds cost a consume, and how soon a crossing is
delivered under full load.

Two fresh services alike (a fresh database, Redis flushed), in ALERT_ROUNDS rounds whose
order alternates (off then on, on then off, ...: a drift over the run, such as the page
cache or the machine's clock warming up, weighs on both variants alike): the calendar day at ALERT_SUBJECTS subjects, with a policy of ALERT_LIMIT a day,
without thresholds ("off"), then with `alert_thresholds: [5]` and a webhook endpoint
("on"): every consume of an alerting policy keeps its answer in its ledger entry, and each
subject's 50th unit of the day crosses the threshold, so about ALERT_SUBJECTS events are
recorded and delivered while wrk runs. The receiver (a stdlib HTTP server in this process)
answers 204 and notes when each event arrived; its age then (arrival - the event's `at`,
the instant of the decision that crossed) is the crossing-to-delivery time.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional, Tuple

from measurements import Bench, Line, Results, mean_of, run_wrk
from processes import Failure, log

ALERT_ROUNDS = 4
ALERT_SUBJECTS = 1000
ALERT_LIMIT = 1000
ACTION = "alerts"


class Receiver:
    """A webhook receiver on a free loopback port: the age of each event when it arrived."""

    def __init__(self) -> None:
        ages: List[float] = []
        self.ages = ages

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1: connections stay open between deliveries, as real endpoints keep
            # them (HTTP/1.0, the stdlib's default, would close each after its answer).
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                arrived = time.time()
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()
                try:
                    at = json.loads(body)["at"].replace("Z", "+00:00")
                    ages.append(arrived - datetime.datetime.fromisoformat(at).timestamp())
                except (ValueError, KeyError, TypeError):
                    pass

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _policy(thresholds: List[int]) -> dict:
    policy = {"id": "alert-day", "action": ACTION, "measure": "count", "limit": ALERT_LIMIT,
              "window": {"type": "calendar", "period": "day", "timezone": "UTC"}}  # fmt: skip
    if thresholds:
        policy["alert_thresholds"] = thresholds
    return policy


def _admin(service, method: str, path: str, body: dict, want: int) -> None:  # type: ignore[no-untyped-def]
    status, answer = service.request(method, path, body, admin=True)
    if status != want:
        raise Failure(f"{method} {path} answered {status}: {answer.decode(errors='replace')}")


def measure_alert_rows(bench: Bench, mode: str) -> None:
    """The rows of each round, and the delivery times of the "on" ones (see the module)."""
    for round_ in range(ALERT_ROUNDS):
        for variant in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            if mode == "redis":
                bench.redis.flushall()
            service = bench.service(mode, env={"QUOTA_WEBHOOK_ALLOW_PRIVATE": "true"}).start()
            receiver: Optional[Receiver] = None
            if variant == "on":
                receiver = Receiver()
                _admin(service, "POST", "/admin/policies", _policy([5]), 201)
                _admin(service, "POST", "/admin/webhooks", {"id": "bench", "url": receiver.url}, 201)
            else:
                _admin(service, "POST", "/admin/policies", _policy([]), 201)
            log(f"{mode}: calendar day, {ALERT_SUBJECTS} subjects, alerts {variant} (round {round_ + 1} of {ALERT_ROUNDS})")
            line = run_wrk(bench, service, ACTION, ALERT_SUBJECTS)
            bench.results.alerts.setdefault((mode, variant), []).append(line)
            if receiver is not None:
                # The stragglers: every event recorded is delivered, within 30 s.
                expected = service.metric("quota_alert_events_total")
                deadline = time.monotonic() + 30
                while len(receiver.ages) < expected and time.monotonic() < deadline:
                    time.sleep(0.2)
                    expected = service.metric("quota_alert_events_total")
                bench.results.deliveries.setdefault(mode, []).extend(receiver.ages)
                bench.results.alert_events.setdefault(mode, []).append((len(receiver.ages), int(expected)))
                receiver.close()
            service.stop()


def _percentile(values: List[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def alert_targets(modes: Tuple[str, ...], results: Results, target, ratio, at_least) -> List[str]:  # type: ignore[no-untyped-def]
    """Alerts on against off (the mean of the rounds), and the crossing-to-delivery times."""
    out: List[str] = []
    for mode in modes:
        off, on = results.alerts.get((mode, "off"), []), results.alerts.get((mode, "on"), [])
        if not off or not on:
            continue

        v = ratio(mean_of(on, "rps"), mean_of(off, "rps"))
        label = f"{mode}: alerts on vs off, req/s (calendar {ALERT_SUBJECTS // 1000}k)"
        out.append(target(label, f"{v}x", ">= 0.95x", at_least(v, 0.95)))
        rounds = ", ".join(f"{a.f('rps'):.0f}/{b.f('rps'):.0f}" for a, b in zip(on, off))
        out.append(f"      mean of {len(on)} rounds, on/off: {rounds}")
        cpu = f"{mean_of(on, 'svc_us'):.1f}/{mean_of(off, 'svc_us'):.1f}"
        out.append(target(f"  {mode}: service CPU us per consume, on / off", cpu, "-"))
        ages = results.deliveries.get(mode, [])
        counts = results.alert_events.get(mode, [])
        got, recorded = sum(c[0] for c in counts), sum(c[1] for c in counts)
        out.append(target(f"  {mode}: events delivered / recorded", f"{got}/{recorded}", "all", got == recorded and got > 0))
        for name, p in (("p50", 0.5), ("p99", 0.99)):
            value = _percentile(ages, p)
            out.append(target(f"  {mode}: crossing to delivery {name}, s", f"{value:.3f}", "-"))
    return out
