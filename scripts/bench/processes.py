"""Tools, processes and the two servers the harness runs: Redis and the service.

Every process the harness starts goes through Processes, in a process group of its own
(so that a Ctrl-C on the terminal reaches the harness alone, which then stops them in
order), and is stopped on exit whatever happens: Processes.stop_all kills what is left.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from knobs import ADMIN_TOKEN, ROOT, Knobs, policies

HZ = os.sysconf("SC_CLK_TCK")


class Failure(Exception):
    """A step that cannot go on: the harness stops, with this message."""


class Stop(BaseException):
    """A signal asked the harness to stop (BaseException: no `except Exception` eats it)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Tools and the build
# ---------------------------------------------------------------------------
def ensure_tools(knobs: Knobs) -> None:
    """Installs wrk and redis-server / redis-tools with apt-get when they are missing."""
    need: List[str] = []
    if not shutil.which("wrk"):
        need.append("wrk")
    if not shutil.which("redis-server"):
        need.append("redis-server")
    if not shutil.which("redis-benchmark"):
        need.append("redis-tools")
    if knobs.build and not shutil.which("cargo"):
        raise Failure("cargo is needed to build the service (https://rustup.rs)")
    if not need:
        return
    if not knobs.install:
        raise Failure(f"missing: {' '.join(need)} (BENCH_NO_INSTALL=1)")
    if not shutil.which("apt-get"):
        raise Failure(f"missing: {' '.join(need)}, and no apt-get to install them")
    sudo = [] if os.getuid() == 0 else ["sudo"]
    apt = sudo + ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-o", "DPkg::Lock::Timeout=300"]
    log(f"installing {' '.join(need)}")
    subprocess.run(apt + ["update", "-q"], check=True)
    subprocess.run(apt + ["install", "-y", "-q", "--no-install-recommends"] + need, check=True)


def build(knobs: Knobs) -> None:
    """cargo build --release (incrementally), the gRPC load generator unless BENCH_GRPC=0,
    and the ledger filler unless BENCH_LEDGER_ENTRIES=0."""
    log("cargo build --release")
    subprocess.run(["cargo", "build", "--release", "--locked", "--quiet"], cwd=ROOT, check=True)
    # Apart from the binary's build: an example brings in the dev-dependencies' features,
    # which the benchmarked binary must not be built with.
    examples = (["rls_load"] if knobs.grpc else []) + (["ledger_scale"] if knobs.ledger_entries > 0 else [])
    for example in examples:
        log(f"cargo build --release --example {example}")
        subprocess.run(
            ["cargo", "build", "--release", "--locked", "--quiet", "--example", example], cwd=ROOT, check=True
        )


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------
Output = Union[None, int, IO[Any]]


class Processes:
    """Every process the harness started and has not seen end; stop_all stops them."""

    def __init__(self) -> None:
        self._live: List[subprocess.Popen[bytes]] = []
        self.hurry = False  # a second signal: kill at once, no graceful stop

    def start(
        self,
        args: Sequence[Union[str, Path]],
        *,
        env: Optional[Mapping[str, str]] = None,
        stdout: Output = subprocess.DEVNULL,
        stderr: Output = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes]:
        """Starts ARGS in a process group of its own (the group's id is its pid)."""
        process = subprocess.Popen(
            [str(a) for a in args],
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self._live.append(process)
        return process

    def run(self, args: Sequence[Union[str, Path]], *, stdout: Path, stderr: Path) -> Tuple[int, float]:
        """Runs ARGS to its end, output in files; returns its exit code and its CPU seconds
        (user + system, all its threads: what bash's `time` printed)."""
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            process = self.start(args, stdout=out, stderr=err)
            _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        self._forget(process)
        return process.returncode, usage.ru_utime + usage.ru_stime

    def output(self, args: Sequence[Union[str, Path]]) -> str:
        """Runs ARGS to its end and returns its standard output (stderr goes to ours)."""
        process = self.start(args, stdout=subprocess.PIPE, stderr=None)
        out, _ = process.communicate()
        self._forget(process)
        if process.returncode != 0:
            raise Failure(f"{args[0]} exited with {process.returncode}")
        return out.decode(errors="replace")

    def stop(self, process: Optional[subprocess.Popen[bytes]], grace: float = 60.0) -> None:
        """SIGTERM to the process group, then SIGKILL after GRACE seconds (a graceful stop
        of the embedded service ends with a snapshot of its counters, which a kill would
        lose). Whatever is left in the group after its leader ended is killed too."""
        if process is None:
            return
        if process.poll() is None:
            self._signal(process, signal.SIGKILL if self.hurry else signal.SIGTERM)
            deadline = time.monotonic() + grace
            while process.poll() is None and time.monotonic() < deadline:
                if self.hurry:
                    self._signal(process, signal.SIGKILL)
                time.sleep(0.05)
            if process.poll() is None:
                self._signal(process, signal.SIGKILL)
                process.wait()
        self._signal(process, signal.SIGKILL)  # stragglers of the group, if any
        self._forget(process)

    def stop_all(self) -> None:
        """Stops every live process, the last started first."""
        for process in reversed(list(self._live)):
            self.stop(process)

    def kill_all(self) -> None:
        """SIGKILL to every live group at once (a second Ctrl-C during the cleanup)."""
        self.hurry = True
        for process in list(self._live):
            self._signal(process, signal.SIGKILL)

    @staticmethod
    def _signal(process: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _forget(self, process: subprocess.Popen[bytes]) -> None:
        if process in self._live:
            self._live.remove(process)


_handed_out: Set[int] = set()


def free_port() -> int:
    """A loopback port that binds now and was not handed out before in this run."""
    for _ in range(200):
        port = random.randint(20000, 54999)
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise Failure("no free port")


# ---------------------------------------------------------------------------
# /proc readers
# ---------------------------------------------------------------------------
def _stat_ticks(path: str) -> Optional[int]:
    """utime + stime of a /proc/.../stat file, in clock ticks (None when it is gone)."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return int(fields[11]) + int(fields[12])


def cpu_ticks(pid: Optional[int]) -> int:
    """User + system CPU time of a process so far, in clock ticks (0 when it is gone)."""
    if pid is None:
        return 0
    return _stat_ticks(f"/proc/{pid}/stat") or 0


def thread_ticks(pid: Optional[int]) -> Tuple[int, int, int]:
    """A process's CPU ticks so far by kind of thread, (http, sql, bg): the actix workers
    (HTTP, JSON, the engine, the Redis client), SQLite's worker threads (the ledger's
    inserts), and the rest (the main runtime: the ledger drain or group-commit task, policy
    refresh, the listener). (0, 0, 0) when it is gone."""
    http = sql = bg = 0
    tasks = f"/proc/{pid}/task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return 0, 0, 0
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        ticks = _stat_ticks(f"{tasks}/{tid}/stat")
        if ticks is None:
            continue
        if comm.startswith("actix-rt"):
            http += ticks
        elif comm.startswith("sqlx-sqlite"):
            sql += ticks
        else:
            bg += ticks
    return http, sql, bg


def load_average() -> str:
    """The 1-minute load average, as /proc/loadavg prints it."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------
class RedisError(Exception):
    """An error reply."""


RespValue = Union[None, int, bytes, List[Any]]


class Redis:
    """The private Redis: started on a free port with no persistence, talked to over one
    RESP connection (no client library: the standard library only)."""

    def __init__(self, processes: Processes, tmp: Path, extra: Sequence[str] = ()) -> None:
        self.processes = processes
        self.dir = tmp / "redis"
        self.extra = list(extra)  # more redis-server arguments
        self.port = 0
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._sock: Optional[socket.socket] = None
        self._buf = b""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/"

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None

    def start(self) -> None:
        self.port = free_port()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = self.processes.start(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--protected-mode", "yes",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir),
             "--logfile", str(self.dir / "redis.log"), *self.extra]
        )  # fmt: skip
        for _ in range(100):
            try:
                if self.command("PING") == b"PONG":
                    return
            except OSError:
                self._close()
            time.sleep(0.1)
        raise Failure(f"redis-server did not start (see {self.dir / 'redis.log'})")

    def stop(self) -> None:
        self._close()
        self.processes.stop(self.process)
        self.process = None

    # -- the protocol
    def command(self, *args: Union[str, int, bytes]) -> RespValue:
        """Sends one command, returns its reply (bytes, int, None or a list of them)."""
        if self._sock is None:
            self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=600)
            self._buf = b""
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        try:
            self._sock.sendall(payload)
            return self._reply()
        except OSError:
            self._close()
            raise

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _line(self) -> bytes:
        assert self._sock is not None
        while b"\r\n" not in self._buf:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("Redis closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n: int) -> bytes:
        assert self._sock is not None
        while len(self._buf) < n + 2:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("Redis closed the connection")
            self._buf += chunk
        data, self._buf = self._buf[:n], self._buf[n + 2 :]
        return data

    def _reply(self) -> RespValue:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exactly(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise ConnectionError(f"unexpected reply from Redis: {line!r}")

    # -- what the harness asks of it
    def flushall(self) -> None:
        self.command("FLUSHALL")

    def dbsize(self) -> int:
        return int(self.command("DBSIZE") or 0)  # type: ignore[arg-type]

    def info(self, section: str) -> Dict[str, str]:
        text = self.command("INFO", section)
        assert isinstance(text, bytes)
        fields: Dict[str, str] = {}
        for line in text.decode().splitlines():
            if ":" in line and not line.startswith("#"):
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        return fields

    def used_memory(self) -> int:
        return int(self.info("memory")["used_memory"])

    def commands_processed(self) -> int:
        """Redis's count of the commands it has run so far (this INFO not included)."""
        return int(self.info("stats")["total_commands_processed"])

    def scan(self, pattern: str, first: bool = False) -> List[bytes]:
        """The keys matching PATTERN (only the first one found when FIRST)."""
        keys: List[bytes] = []
        cursor = b"0"
        while True:
            page = self.command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            assert isinstance(page, list)
            cursor = page[0]
            keys.extend(page[1])
            if (first and keys) or cursor == b"0":
                return keys[:1] if first else keys

    def first_key(self, pattern: str) -> str:
        keys = self.scan(pattern, first=True)
        return keys[0].decode() if keys else ""

    def version(self) -> str:
        """'Redis 7.0.15', from redis-server --version."""
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
        match = re.search(r"v=(\S+)", out)
        return f"Redis {match.group(1)}" if match else "Redis ?"


# ---------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------
# Requests to 127.0.0.1 never go through a proxy the environment may name.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_field(name: str, line: str) -> str:
    """The value of `NAME=value` in a log line ("" when absent; the last one wins)."""
    found = re.findall(rf"(?:^|\s){re.escape(name)}=(\S*)", line)
    return found[-1] if found else ""


class Service:
    """One quota-ledger process: the release binary on a SQLite database of its own (or
    one an earlier start left), on the private Redis or embedded (in-process counters),
    serving gRPC too unless BENCH_GRPC=0."""

    starts = 0  # every start in this run, for the names of its database and log

    def __init__(
        self,
        knobs: Knobs,
        processes: Processes,
        tmp: Path,
        mode: str,
        redis: Optional[Redis],
        db: Optional[Path] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        Service.starts += 1
        self.knobs = knobs
        self.processes = processes
        self.mode = mode
        self.redis = redis
        self.db = db or tmp / f"policies-{Service.starts}.db"
        self.log_path = tmp / f"service-{Service.starts}.log"
        self.extra_env = dict(env or {})
        self.port = 0
        self.grpc_port = 0
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, tries: int = 200) -> Service:
        """Starts it and waits TRIES x 0.1 s at most for /readyz to answer 2xx (the gRPC
        port is bound before the HTTP one answers)."""
        self.port = free_port()
        env = dict(os.environ)
        env.update(
            QUOTA_LISTEN=f"127.0.0.1:{self.port}",
            DATABASE_URL=f"sqlite://{self.db}",
            QUOTA_ADMIN_TOKEN=ADMIN_TOKEN,
            RUST_LOG="warn,quota_ledger::startup=info,quota_ledger::engine::recovery=info",
        )
        if self.mode == "redis":
            assert self.redis is not None
            env["REDIS_URL"] = self.redis.url
        if self.knobs.grpc:
            self.grpc_port = free_port()
            env["QUOTA_GRPC_LISTEN"] = f"127.0.0.1:{self.grpc_port}"
        env.update(self.extra_env)
        with open(self.log_path, "wb") as out:
            self.process = self.processes.start([self.knobs.binary], env=env, stdout=out, stderr=subprocess.STDOUT)
        for _ in range(tries):
            if self.request("GET", "/readyz", timeout=2)[0] // 100 == 2:
                return self
            if not self.alive():
                break
            time.sleep(0.1)
        sys.stderr.write(self.log_text())
        raise Failure("the service did not become ready")

    def stop(self) -> None:
        """A graceful stop (SIGTERM; the embedded default saves a snapshot then)."""
        self.processes.stop(self.process)

    def log_text(self) -> str:
        """Its log so far, without colours."""
        try:
            return _ANSI.sub("", self.log_path.read_text(errors="replace"))
        except OSError:
            return ""

    def log_line(self, needle: str) -> str:
        """The first line of its log that contains NEEDLE ("" when none does)."""
        return next((line for line in self.log_text().splitlines() if needle in line), "")

    # -- HTTP
    def request(
        self,
        method: str,
        path: str,
        body: Optional[Any] = None,
        *,
        admin: bool = False,
        timeout: Optional[float] = 30,
    ) -> Tuple[int, bytes]:
        """METHOD PATH with a JSON BODY: (status, body); status 0 when nothing answered."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if admin:
            headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with _HTTP.open(req, timeout=timeout) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (OSError, http.client.HTTPException):
            return 0, b""

    def consume(self, action: str, subject: str) -> int:
        """POST /quota/consume of one unit; the status."""
        return self.request("POST", "/quota/consume", {"action": action, "subject": subject}, timeout=10)[0]

    def create_policies(self) -> None:
        for policy in policies():
            status, body = self.request("POST", "/admin/policies", policy, admin=True)
            if status != 201:
                raise Failure(f"creating a policy answered {status}: {body.decode(errors='replace')}")

    def metric(self, name: str) -> float:
        """The value of one unlabelled sample of /metrics (0 when absent or unanswered)."""
        for line in self.metrics_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == name:
                return float(fields[1])
        return 0.0

    def metrics_text(self) -> str:
        status, body = self.request("GET", "/metrics")
        return body.decode(errors="replace") if status == 200 else ""

    # -- /proc
    def cpu_ticks(self) -> int:
        return cpu_ticks(self.pid)

    def thread_ticks(self) -> Tuple[int, int, int]:
        """Its CPU ticks so far by kind of thread (see `thread_ticks`)."""
        return thread_ticks(self.pid)

    def memory_kib(self) -> Tuple[int, int]:
        """(VmRSS, VmHWM) in KiB."""
        values: Dict[str, int] = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0])
        return values.get("VmRSS", 0), values.get("VmHWM", 0)
