"""The harness's knobs (BENCH_* environment variables), constants and workload.

Knobs keeps what the environment asked for; the rest of this module is what every run
does the same way: the policies it creates, the scenarios its rows measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = ROOT / "scripts" / "bench"
LOADGEN = ROOT / "target" / "release" / "examples" / "rls_load"
LEDGER_SCALE = ROOT / "target" / "release" / "examples" / "ledger_scale"
DEFAULT_BINARY = ROOT / "target" / "release" / "quota-ledger"
# The Limitador peer (scripts/bench/limitador/): a cargo project of its own, built into a
# target directory of its own.
PEER_MANIFEST = BENCH_DIR / "limitador" / "Cargo.toml"
PEER_TARGET = ROOT / "target" / "limitador-peer"
PEER_BINARY = PEER_TARGET / "release" / "limitador-peer"

ADMIN_TOKEN = "bench-admin-token"
# High enough that nothing is denied: every consume takes the writing path.
LIMIT = 1000000000
# The countries of the 3-budget consumes, drawn uniformly: 20 budgets per country policy,
# few and hot, as a platform's traffic is concentrated on a few countries.
COUNTRIES = "NG,IN,US,BR,ID,PK,BD,RU,MX,JP,PH,EG,VN,CD,TR,IR,DE,TH,GB,FR"
MODES = ("redis", "embedded")


class KnobError(Exception):
    """A BENCH_* variable that does not parse."""


def _text(env: Mapping[str, str], name: str, default: str) -> str:
    # As bash's ${NAME:-default}: unset and empty both read as the default.
    value = env.get(name, "")
    return value if value != "" else default


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _text(env, name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise KnobError(f"{name}={raw!r} is not a whole number") from None


@dataclass(frozen=True)
class Knobs:
    """What the BENCH_* variables asked for, with the defaults of the old bench.sh."""

    duration: int  # BENCH_DURATION: seconds measured per run (after the warm-up)
    warmup: int  # BENCH_WARMUP: seconds of warm-up before each measured run
    connections: int  # BENCH_CONNECTIONS: wrk connections, redis-benchmark clients, gRPC streams
    flood_connections: int  # BENCH_FLOOD_CONNECTIONS: the overload rows' connections (0: none)
    threads: int  # BENCH_THREADS: wrk threads
    subjects: Tuple[int, ...]  # BENCH_SUBJECTS: distinct subjects per row
    memory_subjects: int  # BENCH_MEMORY_SUBJECTS: subjects charged for the memory figures
    idle_seconds: int  # BENCH_IDLE_SECONDS: idle Redis load counted over (0: not measured)
    modes: Tuple[str, ...]  # BENCH_MODES: which service modes to run
    grpc: bool  # BENCH_GRPC (anything but 0): the gRPC row and its load generator
    grpc_connections: int  # BENCH_GRPC_CONNECTIONS: HTTP/2 connections the streams share
    auth: bool  # BENCH_AUTH (anything but 0): the API key rows (a key against open endpoints)
    alerts: bool  # BENCH_ALERTS (anything but 0): the alert rows (thresholds and a webhook)
    settings: bool  # BENCH_SETTINGS (anything but 0): the settings rows (checkpoints, replicas, TLS)
    limitador: bool  # BENCH_LIMITADOR (anything but 0): the Limitador peer's rows and its build
    levels: bool  # BENCH_LEVELS (anything but 0): the record level rows (scripts/bench/levels.py)
    ledger_entries: int  # BENCH_LEDGER_ENTRIES: the ledger-at-scale rows' entries (0: none)
    postgres: bool  # BENCH_POSTGRES (anything but 0): the Postgres ingest row
    build: bool  # not BENCH_NO_BUILD=1 nor BENCH_BINARY: cargo build first (the peer's too)
    install: bool  # not BENCH_NO_INSTALL=1: apt-get what is missing
    binary: Path  # BENCH_BINARY, or target/release/quota-ledger
    out: Optional[Path]  # BENCH_OUT: also write the table there

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Knobs:
        subjects_raw = _text(env, "BENCH_SUBJECTS", "1000 100000 1000000").split()
        try:
            subjects = tuple(int(s) for s in subjects_raw)
        except ValueError:
            raise KnobError(f"BENCH_SUBJECTS={' '.join(subjects_raw)!r}: whole numbers only") from None
        modes = tuple(_text(env, "BENCH_MODES", "redis embedded").split())
        for mode in modes:
            if mode not in MODES:
                raise KnobError(f"BENCH_MODES: unknown mode {mode!r} (redis, embedded)")
        binary = env.get("BENCH_BINARY", "")
        out = env.get("BENCH_OUT", "")
        knobs = cls(
            duration=_int(env, "BENCH_DURATION", 10),
            warmup=_int(env, "BENCH_WARMUP", 2),
            connections=_int(env, "BENCH_CONNECTIONS", 50),
            flood_connections=_int(env, "BENCH_FLOOD_CONNECTIONS", 2000),
            threads=_int(env, "BENCH_THREADS", 2),
            subjects=subjects,
            memory_subjects=_int(env, "BENCH_MEMORY_SUBJECTS", 100000),
            idle_seconds=_int(env, "BENCH_IDLE_SECONDS", 30),
            modes=modes,
            grpc=_text(env, "BENCH_GRPC", "1") != "0",
            grpc_connections=_int(env, "BENCH_GRPC_CONNECTIONS", 2),
            auth=_text(env, "BENCH_AUTH", "1") != "0",
            alerts=_text(env, "BENCH_ALERTS", "1") != "0",
            settings=_text(env, "BENCH_SETTINGS", "1") != "0",
            limitador=_text(env, "BENCH_LIMITADOR", "1") != "0",
            levels=_text(env, "BENCH_LEVELS", "1") != "0",
            ledger_entries=_int(env, "BENCH_LEDGER_ENTRIES", 10000000),
            postgres=_text(env, "BENCH_POSTGRES", "1") != "0",
            build=_text(env, "BENCH_NO_BUILD", "0") != "1" and binary == "",
            install=_text(env, "BENCH_NO_INSTALL", "0") != "1",
            binary=Path(binary).resolve() if binary else DEFAULT_BINARY,
            out=Path(out) if out else None,
        )
        if not knobs.subjects:
            raise KnobError("BENCH_SUBJECTS names no subject count")
        if knobs.duration <= 0:
            raise KnobError("BENCH_DURATION must be at least 1")
        return knobs

    @property
    def grpc_subjects(self) -> int:
        """The gRPC row's subject count: 100k, or the first count when 100k is not measured."""
        return 100000 if 100000 in self.subjects else self.subjects[0]


@dataclass(frozen=True)
class Scenario:
    """One kind of consume row: its label in the table, the action, amount and countries."""

    label: str
    action: str
    amount: str = ""  # "" for the default amount (1)
    countries: str = ""  # comma-separated; "" for no attributes


# The 3-budget throughput target compares the 3-budget row's req/s with the calendar day's:
# each 3-budget row is bracketed by two more calendar-day rows at its subject count, right
# before and right after it, and compared with their mean. Every row grows the ledger the
# later rows insert into (1-2M entries per mode), and the SQL inserts slow as it grows: a
# calendar-day row measured four rows earlier, on a smaller ledger, would flatter the
# 1-budget side.
SCENARIOS: Tuple[Scenario, ...] = (
    Scenario("calendar day", "sms"),
    Scenario("day from 04:00", "sms-cut"),
    Scenario("3 budgets", "sms3", countries=COUNTRIES),
    Scenario("rolling 24h/24", "upload"),
    Scenario("token bucket", "api"),
    Scenario("count+amount", "transfer", amount="2500"),
)

_NEW_YORK_DAY = {"type": "calendar", "period": "day", "timezone": "America/New_York"}
_ROLLING_24H = {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600}


def policies() -> List[Dict[str, Any]]:
    """The benchmark's policies, after the contract's examples; nothing is ever denied."""
    return [
        {"id": "sms-per-day", "action": "sms", "measure": "count", "limit": LIMIT, "window": _NEW_YORK_DAY},
        # The same day from a bank's 04:00 cut-off: anchors must cost nothing measurable.
        {
            "id": "sms-cut-off",
            "action": "sms-cut",
            "measure": "count",
            "limit": LIMIT,
            "window": dict(_NEW_YORK_DAY, day_start="04:00"),
        },
        {"id": "upload-24h", "action": "upload", "measure": "count", "limit": LIMIT, "window": _ROLLING_24H},
        {
            "id": "api-hourly",
            "action": "api",
            "measure": "count",
            "limit": LIMIT,
            "window": {"type": "token_bucket", "seconds": 3600},
        },
        {
            "id": "transfers-per-day",
            "action": "transfer",
            "measure": "count",
            "limit": LIMIT,
            "window": {"type": "calendar", "period": "day", "timezone": "UTC"},
        },
        {
            "id": "transfer-usd-24h",
            "action": "transfer",
            "measure": "amount",
            "unit": "USD cents",
            "limit": 1000000000000000,
            "window": _ROLLING_24H,
        },
        # Budgets shared by subjects: the subject's, its country's and the whole action's,
        # all three charged by one consume in one call (one EVALSHA on a standalone Redis).
        {"id": "sms3-user", "action": "sms3", "measure": "count", "limit": LIMIT, "window": _NEW_YORK_DAY},
        {
            "id": "sms3-country",
            "action": "sms3",
            "measure": "count",
            "limit": LIMIT,
            "scope": ["country"],
            "window": _NEW_YORK_DAY,
        },
        {
            "id": "sms3-global",
            "action": "sms3",
            "measure": "count",
            "limit": LIMIT,
            "scope": [],
            "window": _NEW_YORK_DAY,
        },
    ]
