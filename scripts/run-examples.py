#!/usr/bin/env python3
"""Run the shell examples of Markdown files, in order, and check their answers.

    scripts/run-examples.py [--bin PATH | --serve CMD] FILE.md [FILE.md ...]

Each file runs in one fresh bash, in a fresh temporary directory, so the
variables a block sets are there for the next, as for a reader who pastes the
blocks in order into one terminal. What the runner changes in a block before it
runs it:

  * `cargo run --release` becomes the binary given with --bin (the one the
    tests built), or the whole command given with --serve (a container, say);
  * `localhost:8080` and `127.0.0.1:8080` become a free port, which
    QUOTA_LISTEN names.

Fences:

  ```sh            run; the block must exit 0
  ```sh no-run     shown, not run (it needs what CI has not, or it is a sketch)
  ```http          right after a run block: the answer to the block's last
                   `curl -i`: the status line must match, every header shown
                   must be there with that value, and the body is checked
                   as a ```json block is
  ```json          right after a run block: the last JSON value the block
                   printed must match it (see `matches`)

Everything ends when the file does: the shell's process group (the service the
blocks started in the background included) is stopped, and the directory goes.
Exits 1 on the first block that fails, printing the block, what it printed and
why it does not match.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BLOCK_TIMEOUT_S = 180
ELLIPSIS = "…"


class Block:
    def __init__(self, path, line, info, text):
        self.path, self.line, self.info, self.text = path, line, info, text

    @property
    def lang(self):
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runs(self):
        return self.lang in ("sh", "bash") and "no-run" not in self.info.split()

    def where(self):
        return f"{self.path}:{self.line}"


def blocks(path):
    """The fenced blocks of a Markdown file, each with what it expects (or None)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*" + fence + r"\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        end = i
        i += 1
        found.append((Block(path, start, info, "\n".join(body) + "\n"), start - 1, end))
    # pair each run block with an output block that follows it directly
    pairs = []
    for n, (block, _, end) in enumerate(found):
        if not block.runs:
            continue
        expected = None
        if n + 1 < len(found):
            nxt, nxt_start, _ = found[n + 1]
            between = lines[end + 1 : nxt_start]
            if nxt.lang in ("http", "json") and all(not s.strip() for s in between):
                expected = nxt
        pairs.append((block, expected))
    return pairs


def matches(expected, actual, path="$"):
    """None when `actual` has everything `expected` shows, else why not.

    Objects: every key shown must be there and match (more keys may be; a
    `"…": "…"` member only tells the reader so).
    Arrays: element by element, of the same length, unless the last element
    shown is "…" (then at least as long). Strings: "…" matches any value; a
    string with "…" in it is a pattern ("qlk_…" matches "qlk_3xT…").
    Numbers, booleans and null: equal.
    """
    if expected == ELLIPSIS:
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected an object, got {json.dumps(actual)[:200]}"
        for key, value in expected.items():
            if key == ELLIPSIS:
                continue
            if key not in actual:
                return f"{path}: no field {key!r} (fields: {', '.join(actual)})"
            why = matches(value, actual[key], f"{path}.{key}")
            if why:
                return why
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{path}: expected an array, got {json.dumps(actual)[:200]}"
        open_ended = bool(expected) and expected[-1] == ELLIPSIS
        shown = expected[:-1] if open_ended else expected
        if len(actual) < len(shown) or (not open_ended and len(actual) != len(shown)):
            return f"{path}: expected {len(shown)} elements, got {len(actual)}"
        for n, value in enumerate(shown):
            why = matches(value, actual[n], f"{path}[{n}]")
            if why:
                return why
        return None
    if isinstance(expected, str) and ELLIPSIS in expected:
        pattern = ".*".join(re.escape(part) for part in expected.split(ELLIPSIS))
        if isinstance(actual, str) and re.fullmatch(pattern, actual, re.S):
            return None
        return f"{path}: expected {expected!r}, got {json.dumps(actual)}"
    if type(expected) is not type(actual) or expected != actual:
        return f"{path}: expected {json.dumps(expected)}, got {json.dumps(actual)}"
    return None


def json_values(text):
    """Every JSON object or array printed in `text`, in order."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
                values.append(value)
                i = end
                continue
            except ValueError:
                pass
        i += 1
    return values


def quote_ellipses(text):
    """`…` outside strings stands for any value: make it the string "…"."""
    out, in_string, escaped = [], False, False
    for c in text:
        if in_string:
            if c == '"' and not escaped:
                in_string = False
            escaped = c == "\\" and not escaped
        elif c == '"':
            in_string = True
        elif c == ELLIPSIS:
            c = '"…"'
        out.append(c)
    return "".join(out)


def check_json(expected_text, output):
    try:
        expected = json.loads(quote_ellipses(expected_text))
    except ValueError as e:
        return f"the ```json block is not JSON: {e}"
    if not isinstance(expected, (dict, list)):  # a number or a word: the last line printed
        lines = output.strip().split("\n")
        try:
            return matches(expected, json.loads(lines[-1]))
        except ValueError:
            return f"expected {json.dumps(expected)}, the last line printed is {lines[-1]!r}"
    values = json_values(output)
    if not values:
        return "the block printed no JSON"
    return matches(expected, values[-1])


def check_http(expected_text, output):
    lines = expected_text.strip("\n").split("\n")
    m = re.match(r"^HTTP/[\d.]+ (\d{3})", lines[0])
    if not m:
        return "the ```http block does not start with a status line (HTTP/1.1 200 OK)"
    starts = [s.start() for s in re.finditer(r"HTTP/[\d.]+ \d{3} ", output)]
    if not starts:
        return "the block printed no HTTP answer (is it `curl -i`?)"
    answer = output[starts[-1] :].replace("\r\n", "\n")
    head, _, body = answer.partition("\n\n")
    status = re.match(r"^HTTP/[\d.]+ (\d{3})", head).group(1)
    if status != m.group(1):
        return f"expected status {m.group(1)}, got {status}"
    headers = {}
    for line in head.split("\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    rest = lines[1:]
    while rest and rest[0].strip():
        name, _, value = rest.pop(0).partition(":")
        got = headers.get(name.strip().lower())
        if got is None:
            return f"no header {name.strip()!r}"
        if matches(value.strip(), got):
            return f"header {name.strip()}: expected {value.strip()!r}, got {got!r}"
    shown_body = "\n".join(rest).strip()
    if shown_body:
        return check_json(shown_body, body)
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Shell:
    """One bash for a whole file, fed blocks one at a time."""

    def __init__(self, workdir, env):
        self.dir = workdir
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.n = 0

    def run(self, script):
        self.n += 1
        code = os.path.join(self.dir, f".block{self.n}.sh")
        out = os.path.join(self.dir, f".block{self.n}.out")
        status = os.path.join(self.dir, f".block{self.n}.status")
        with open(code, "w", encoding="utf-8") as f:
            f.write(script)
        self.proc.stdin.write(f"source {code} > {out} 2>&1 < /dev/null; echo $? > {status}.tmp; mv {status}.tmp {status}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while not os.path.exists(status):
            if self.proc.poll() is not None:
                return None, read(out), "the shell exited (does the block call `exit`?)"
            if time.monotonic() > deadline:
                return None, read(out), f"the block ran past {BLOCK_TIMEOUT_S} s"
            time.sleep(0.05)
        return int(read(status).strip() or "1"), read(out), None

    def close(self):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            for _ in range(100):
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            time.sleep(0.5)  # the group's other members (the service) may still be ending


def read(path):
    try:
        return open(path, encoding="utf-8", errors="replace").read()
    except FileNotFoundError:
        return ""


def run_file(path, serve):
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="examples-")
    env = dict(os.environ, QUOTA_LISTEN=f"127.0.0.1:{port}")
    for name in ("REDIS_URL", "DATABASE_URL", "QUOTA_ADMIN_TOKEN", "QUOTA_CLIENT_TOKENS"):
        env.pop(name, None)  # a fresh service, whatever the caller's environment
    shell = Shell(workdir, env)
    ran = 0
    try:
        for block, expected in blocks(path):
            script = block.text.replace("cargo run --release", serve)
            script = re.sub(r"\b(localhost|127\.0\.0\.1):8080\b", rf"\1:{port}", script)
            started = time.monotonic()
            status, output, trouble = shell.run(script)
            why = trouble
            if why is None and status != 0:
                why = f"the block exited {status}"
            if why is None and expected is not None:
                check = check_http if expected.lang == "http" else check_json
                why = check(expected.text, output)
            if why:
                print(f"\n{block.where()}: FAILED: {why}\n--- block ---\n{block.text}--- it printed ---\n{output}---", file=sys.stderr)
                if expected is not None:
                    print(f"--- expected ({expected.where()}) ---\n{expected.text}---", file=sys.stderr)
                return False
            ran += 1
            checked = " (answer checked)" if expected else ""
            print(f"  ok  {block.where()} {time.monotonic() - started:.1f}s{checked}")
        print(f"{path}: {ran} blocks ran")
        return True
    finally:
        shell.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--bin", help="the quota-ledger binary that `cargo run --release` stands for")
    which.add_argument("--serve", help="a command that `cargo run --release` stands for")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    serve = args.serve or os.path.abspath(args.bin)
    for path in args.files:
        print(f"{path}:")
        if not run_file(path, serve):
            sys.exit(1)


if __name__ == "__main__":
    main()
