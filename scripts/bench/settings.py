"""The settings rows: what a durability setting costs the Redis mode's consumes.

Each row compares two fresh services alike (a fresh SQLite ledger, Redis flushed) that
differ in one setting, in rounds whose order alternates (without, then with; with, then
without; ...), the calendar day at SETTINGS_SUBJECTS subjects, BENCH_CONNECTIONS
connections. The ratio printed is the median of the rounds' ratios (with / without).

- checkpoints: the default `QUOTA_CHECKPOINT_EVERY_S` against `0` (none), in
  CHECKPOINT_ROUNDS rounds of at least CHECKPOINT_SECONDS each, so that a row spans several
  checkpoints and not only the first (which reads the whole ledger of that row so far).
- replicas: `QUOTA_REDIS_MIN_REPLICAS=1` against `0`, with one replica of the bench's Redis
  started for the row (on the same machine: its CPU is in the row too), in REPLICA_ROUNDS
  rounds.
- TLS: a Redis of the row's own that listens both in plaintext and with TLS (a CA and a
  server certificate for `localhost` made with openssl), `rediss://localhost` with
  `QUOTA_REDIS_CA_FILE` against `redis://127.0.0.1`, in TLS_ROUNDS rounds.
- TLS to Postgres: the private Postgres of scripts/with-stores.sh, its `ssl` turned on for
  the row (the same certificates) and off again after, each round on a fresh database of
  its own: `sslmode=verify-full` with `sslrootcert` to `localhost` against
  `sslmode=disable`, in TLS_ROUNDS rounds, for the Redis mode (the drain's batches) and for
  the embedded default (every group commit). Skipped without that Postgres.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import subprocess
import time
from typing import Callable, Dict, List, Optional, Tuple, Union

from pathlib import Path

from ingest import _psql, postgres_url
from measurements import Bench, Line, run_wrk
from processes import Failure, Redis, free_port, log

SETTINGS_SUBJECTS = 100_000
CHECKPOINT_ROUNDS = 4
CHECKPOINT_SECONDS = 30
REPLICA_ROUNDS = 3
TLS_ROUNDS = 3
ACTION = "sms"

# (row, variant) -> one Line per round, in round order.
Rows = Dict[Tuple[str, str], List[Line]]

# A variant's environment, or what makes it for a round (its number).
Env = Union[Dict[str, str], Callable[[int], Dict[str, str]]]


def _round(bench: Bench, row: str, variant: str, env: Env, rows: Rows, number: int, rounds: int, mode: str) -> None:
    (getattr(bench, "settings_redis", None) or bench.redis).flushall()
    env = env(number) if callable(env) else env
    service = bench.service(mode, env=env).start(tries=600)
    service.create_policies()
    log(f"{mode}: calendar day, {SETTINGS_SUBJECTS} subjects, {row} {variant} (round {number + 1} of {rounds})")
    line = run_wrk(bench, service, ACTION, SETTINGS_SUBJECTS)
    rows.setdefault((row, variant), []).append(line)
    service.stop()


def _alternating(
    bench: Bench, row: str, variants: Dict[str, Env], rounds: int, rows: Rows, mode: str = "redis"
) -> None:
    names = list(variants)
    for number in range(rounds):
        for variant in names if number % 2 == 0 else list(reversed(names)):
            _round(bench, row, variant, variants[variant], rows, number, rounds, mode)


class Replica:
    """A replica of the bench's Redis, on a free port, with no persistence."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.port = free_port()
        directory = bench.tmp / "replica"
        directory.mkdir(parents=True, exist_ok=True)
        self.process: Optional[subprocess.Popen[bytes]] = bench.processes.start(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory), "--logfile", str(directory / "redis.log"),
             "--replicaof", "127.0.0.1", str(bench.redis.port)]
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = bench.redis.command("INFO", "replication")
            if isinstance(info, bytes) and b"connected_slaves:1" in info and b"state=online" in info:
                return
            time.sleep(0.2)
        raise Failure("the bench's replica did not come online within 30 s")

    def stop(self) -> None:
        self.bench.processes.stop(self.process)
        self.process = None


def measure_settings_rows(bench: Bench) -> None:
    """Every settings row (see the module doc)."""
    rows: Rows = {}
    knobs = bench.knobs
    bench.knobs = dataclasses.replace(knobs, duration=max(knobs.duration, CHECKPOINT_SECONDS))
    try:
        variants = {"off": {"QUOTA_CHECKPOINT_EVERY_S": "0"}, "default": {}}
        _alternating(bench, "checkpoints", variants, CHECKPOINT_ROUNDS, rows)
    finally:
        bench.knobs = knobs
    replica = Replica(bench)
    try:
        variants = {"0": {"QUOTA_REDIS_MIN_REPLICAS": "0"}, "1": {"QUOTA_REDIS_MIN_REPLICAS": "1"}}
        _alternating(bench, "min replicas", variants, REPLICA_ROUNDS, rows)
    finally:
        replica.stop()
    measure_tls_row(bench, rows)
    measure_postgres_tls_rows(bench, rows)
    bench.results.settings = rows


def _openssl(directory: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, check=False)
    if done.returncode != 0:
        raise Failure(f"openssl {' '.join(args)}: {done.stderr.decode(errors='replace')[-500:]}")


def make_certs(directory: Path) -> None:
    """ca.pem, and server.pem / server.key for localhost signed by it, in DIRECTORY."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nx509_extensions = ca\nprompt = no\n[dn]\nCN = bench CA\n"
        "[ca]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\n"
    )
    (directory / "server.ext").write_text(
        "basicConstraints = CA:FALSE\nkeyUsage = critical, digitalSignature\n"
        "subjectAltName = DNS:localhost\nextendedKeyUsage = serverAuth\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(directory, "req", "-x509", *ec, "-days", "2", "-config", "ca.cnf", "-keyout", "ca.key", "-out", "ca.pem")
    _openssl(directory, "req", *ec, "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr")
    _openssl(directory, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem")  # fmt: skip


def measure_tls_row(bench: Bench, rows: Rows) -> None:
    """The TLS row (see the module doc)."""
    certs = bench.tmp / "certs"
    make_certs(certs)
    tls_port = free_port()
    redis = Redis(bench.processes, bench.tmp / "tls", extra=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(certs / "server.pem"),
        "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.pem"),
        "--tls-auth-clients", "no",
    ])  # fmt: skip
    redis.start()
    bench.settings_redis = redis  # type: ignore[attr-defined]
    try:
        variants = {
            "plaintext": {"REDIS_URL": redis.url},
            "tls": {"REDIS_URL": f"rediss://localhost:{tls_port}/", "QUOTA_REDIS_CA_FILE": str(certs / "ca.pem")},
        }
        _alternating(bench, "tls", variants, TLS_ROUNDS, rows)
    finally:
        bench.settings_redis = None  # type: ignore[attr-defined]
        redis.stop()


def measure_postgres_tls_rows(bench: Bench, rows: Rows) -> None:
    """The TLS to Postgres rows (see the module doc)."""
    admin = postgres_url()
    if admin is None or shutil.which("psql") is None:
        log("TLS to Postgres: no private Postgres (run through scripts/bench.sh); rows skipped")
        return
    certs = bench.tmp / "certs"
    if not (certs / "server.pem").exists():
        make_certs(certs)
    # The server reads its key only if it owns it and no one else may read it.
    key = certs / "server.key"
    os.chmod(key, 0o600)
    if os.getuid() == 0:
        shutil.chown(key, "postgres")
        shutil.chown(certs / "server.pem", "postgres")
        os.chmod(certs, 0o755)
        os.chmod(bench.tmp, 0o755)
    for sql in (f"ALTER SYSTEM SET ssl_cert_file = '{certs / 'server.pem'}'",
                f"ALTER SYSTEM SET ssl_key_file = '{key}'",
                "ALTER SYSTEM SET ssl = on",
                "SELECT pg_reload_conf()"):  # fmt: skip
        _psql(admin, sql)
    base = admin.rsplit("/", 1)[0]
    host_port = base.rsplit("@", 1)[1]
    port = host_port.rsplit(":", 1)[1]
    created: List[str] = []

    def database(variant: str) -> Callable[[int], Dict[str, str]]:
        def make(number: int) -> Dict[str, str]:
            name = f"bench_pgtls_{os.getpid()}_{len(created)}"
            _psql(admin, f"CREATE DATABASE {name}")
            created.append(name)
            if variant == "tls":
                url = f"postgres://postgres@localhost:{port}/{name}?sslmode=verify-full&sslrootcert={certs / 'ca.pem'}"
            else:
                url = f"{base}/{name}?sslmode=disable"
            return {"DATABASE_URL": url}

        return make

    try:
        tls = f"postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={certs / 'ca.pem'}"
        deadline = time.monotonic() + 10
        while _psql(admin, "SHOW ssl") != "on" or subprocess.run(
            ["psql", "-X", "-q", "-A", "-t", tls, "-c", "SELECT 1"], capture_output=True, check=False
        ).returncode != 0:
            if time.monotonic() > deadline:
                raise Failure("the private Postgres did not serve TLS within 10 s")
            time.sleep(0.2)
        for mode in ("redis", "embedded"):
            variants: Dict[str, Env] = {"plaintext": database("plaintext"), "tls": database("tls")}
            _alternating(bench, f"postgres tls {mode}", variants, TLS_ROUNDS, rows, mode)
    finally:
        for sql in ("ALTER SYSTEM RESET ssl", "ALTER SYSTEM RESET ssl_cert_file",
                    "ALTER SYSTEM RESET ssl_key_file", "SELECT pg_reload_conf()"):  # fmt: skip
            _psql(admin, sql)
        for name in created:
            _psql(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _ratios(rows: Rows, row: str, without: str, with_: str) -> List[Tuple[float, float]]:
    return [(a.f("rps"), b.f("rps")) for a, b in zip(rows.get((row, with_), []), rows.get((row, without), []))]


def settings_targets(results, target, at_least) -> List[str]:  # type: ignore[no-untyped-def]
    """Each setting's median ratio beside its target, with the rounds."""
    rows: Optional[Rows] = getattr(results, "settings", None)
    if not rows:
        return []
    out: List[str] = []
    for row, without, with_, label, floor in (
        ("checkpoints", "off", "default", "redis: checkpoints at the default interval vs none", 0.95),
        ("min replicas", "0", "1", "redis: QUOTA_REDIS_MIN_REPLICAS=1 vs 0 (one replica)", 0.8),
        ("tls", "plaintext", "tls", "redis: TLS to Redis (rediss://) vs plaintext", None),
        ("postgres tls redis", "plaintext", "tls", "redis: TLS to a Postgres ledger (verify-full) vs plaintext", None),
        ("postgres tls embedded", "plaintext", "tls", "embedded: TLS to a Postgres ledger (verify-full) vs plaintext", None),
    ):
        pairs = _ratios(rows, row, without, with_)
        if not pairs:
            continue
        median = statistics.median(on / off for on, off in pairs)
        label = f"{label}, req/s, median of {len(pairs)} rounds"
        if floor is None:
            out.append(target(label, f"{median:.2f}x", "-"))
        else:
            out.append(target(label, f"{median:.2f}x", f">= {floor}x", at_least(str(round(median, 2)), floor)))
        rounds = ", ".join(f"{on:,.0f} / {off:,.0f}" for on, off in pairs)
        out.append(f"      rounds, with / without: {rounds}")
        lag = [line.f("svc_us") for line in rows.get((row, with_), [])]
        if lag:
            out.append(target(f"  {row}: service CPU us per consume, with", f"{statistics.median(lag):.1f}", "-"))
    return out
