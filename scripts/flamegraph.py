#!/usr/bin/env python3
"""A flame graph of the service's threads from `perf script` output (standard library only).

    perf record -F 997 --call-graph dwarf,16384 -p PID -o perf.data -- sleep 6
    perf script -i perf.data --no-inline -F comm,tid,period,ip,sym > perf.txt
    scripts/flamegraph.py perf.txt --threads actix-rt --title "..." -o graph.svg [--top 25]

Each sample's stack is folded root first; samples of threads whose name does not start with
one of the --threads prefixes are left out (the HTTP workers are `actix-rt|system`). The SVG
draws one box per frame, as wide as its share of the samples, with the whole name and share
in its tooltip. --top prints the functions with the largest inclusive and self shares;
--split the shares of the parts of the HTTP workers' time (PARTS below); --folded writes
the folded stacks (one "root;...;leaf count" line per stack, as other flame graph tools
read them).
"""

import argparse
import hashlib
import html
import re
import sys
from collections import Counter
from typing import Dict, List, Tuple

WIDTH = 1200
ROW = 16
FONT = 11
# Generic parameters and closures make Rust names long; they are cut for the boxes, not the
# tooltips.
GENERICS = re.compile(r"<[^<>]*>")


def read_stacks(path: str, prefixes: List[str]) -> Counter:
    """Folded stacks (root;...;leaf) of the samples of the threads named by PREFIXES."""
    stacks: Counter = Counter()
    comm, frames = None, []

    def flush() -> None:
        if comm is not None and frames and any(comm.startswith(p) for p in prefixes):
            stacks[";".join(reversed(frames))] += 1

    with open(path, errors="replace") as lines:
        for line in lines:
            if not line.strip():
                flush()
                comm, frames = None, []
            elif line[0] in " \t":
                parts = line.strip().split(None, 1)
                name = parts[1] if len(parts) > 1 else parts[0]
                frames.append(short(name))
            else:
                # "comm tid period": the name may hold spaces, the last two fields never.
                comm = line.rsplit(None, 2)[0].strip()
    flush()
    return stacks


def short(name: str) -> str:
    """NAME without its offset, DSO and generic parameters."""
    name = re.sub(r"\+0x[0-9a-f]+$", "", name.split(" (")[0])
    previous = None
    while previous != name:
        previous, name = name, GENERICS.sub("", name)
    return name.replace(";", ":")


def tree(stacks: Counter) -> Dict:
    root: Dict = {"n": 0, "kids": {}}
    for stack, n in stacks.items():
        node = root
        node["n"] += n
        for frame in stack.split(";"):
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += n
    return root


def colour(name: str) -> str:
    h = int(hashlib.md5(name.encode()).hexdigest()[:6], 16)
    return f"rgb({205 + h % 50},{(h >> 8) % 180 + 40},{(h >> 16) % 55})"


def svg(stacks: Counter, title: str) -> str:
    root = tree(stacks)
    total = max(root["n"], 1)
    boxes: List[str] = []
    depth_max = 0

    def draw(node: Dict, name: str, x: float, depth: int) -> None:
        nonlocal depth_max
        w = node["n"] / total * (WIDTH - 20)
        if w < 0.3:
            return
        depth_max = max(depth_max, depth)
        share = 100.0 * node["n"] / total
        label = f"{name} ({node['n']} samples, {share:.2f}%)"
        chars = int(w / (FONT * 0.6))
        text = name if len(name) <= chars else (name[: chars - 2] + ".." if chars > 3 else "")
        boxes.append(
            f'<g><title>{html.escape(label)}</title><rect x="{10 + x:.1f}" y="{{y{depth}}}" '
            f'width="{w:.1f}" height="{ROW - 1}" fill="{colour(name)}" rx="2"/>'
            f'<text x="{13 + x:.1f}" y="{{t{depth}}}">{html.escape(text)}</text></g>'
        )
        offset = x
        for kid_name, kid in sorted(node["kids"].items()):
            draw(kid, kid_name, offset, depth + 1)
            offset += kid["n"] / total * (WIDTH - 20)

    draw(root, "all", 0.0, 0)
    height = (depth_max + 1) * ROW + 60
    body = "\n".join(boxes)
    # Roots at the bottom, leaves on top.
    for depth in range(depth_max + 1):
        y = height - 30 - (depth + 1) * ROW
        body = body.replace(f"{{y{depth}}}", str(y)).replace(f"{{t{depth}}}", str(y + ROW - 4))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="{FONT}">\n'
        f'<rect width="100%" height="100%" fill="#fdfdf6"/>\n'
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">{html.escape(title)}</text>\n'
        f'<text x="10" y="{height - 8}">{total} samples; hover a box for its name and share</text>\n'
        f"{body}\n</svg>\n"
    )


# The parts of the HTTP workers' time. A sample in the kernel is the kernel's (sockets,
# epoll, scheduling); any other goes to the part of the frame nearest its leaf that names one
# (an allocation goes to its caller's part), else to the last part.
KERNEL = ("entry_SYSCALL", "asm_sysvec", "asm_common_interrupt", "irqentry", "do_syscall_64")
PARTS = [
    ("our Redis calls and batching", ("quota_ledger::counters::redis",)),
    ("the Redis client (the redis crate)", ("redis::", "combine::")),
    ("the engine (plan, decide, entries, keys)", ("quota_ledger::engine", "quota_ledger::keys",
                                                  "quota_ledger::domain", "quota_ledger::counters")),
    ("metrics", ("quota_ledger::metrics", "prometheus")),
    ("the request's span, id and log", ("tracing", "request_id", "uuid")),
    ("the API and its middleware (parse, answer, admission, routing)", ("quota_ledger::api", "serde_json", "serde_core")),
    ("actix: reading requests", ("poll_request",)),
    ("actix: writing answers", ("poll_flush", "poll_response", "encode")),
]
REST = "actix, tokio and the allocator: the rest"


def part_of(frames: List[str]) -> str:
    """The part of one sample's stack (frames root first)."""
    if any(frame.startswith(KERNEL) for frame in frames):
        return "the kernel (sockets, epoll, scheduling)"
    for frame in reversed(frames):
        for name, marks in PARTS:
            if any(mark in frame for mark in marks):
                return name
    return REST


def split(stacks: Counter) -> List[Tuple[str, float]]:
    """The share of each part in STACKS, largest first."""
    total = max(sum(stacks.values()), 1)
    shares: Counter = Counter()
    for stack, count in stacks.items():
        shares[part_of(stack.split(";"))] += count
    return [(name, 100.0 * n / total) for name, n in shares.most_common()]


def top(stacks: Counter, n: int) -> Tuple[List[Tuple[str, float]], List[Tuple[str, float]]]:
    total = max(sum(stacks.values()), 1)
    inclusive: Counter = Counter()
    own: Counter = Counter()
    for stack, count in stacks.items():
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return (
        [(f, 100.0 * c / total) for f, c in inclusive.most_common(n)],
        [(f, 100.0 * c / total) for f, c in own.most_common(n)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("perf_script", help="the output of `perf script` (see above)")
    parser.add_argument("--threads", action="append", default=None, help="thread name prefix to keep (repeatable)")
    parser.add_argument("--title", default="flame graph")
    parser.add_argument("-o", "--output", help="the SVG to write")
    parser.add_argument("--top", type=int, default=0, help="print the N largest inclusive and self shares")
    parser.add_argument("--split", action="store_true", help="print the shares of the HTTP workers' parts")
    parser.add_argument("--folded", help="write the folded stacks to this file")
    args = parser.parse_args()
    stacks = read_stacks(args.perf_script, args.threads or [""])
    if not stacks:
        sys.exit("no samples of those threads")
    if args.output:
        with open(args.output, "w") as out:
            out.write(svg(stacks, args.title))
    if args.folded:
        with open(args.folded, "w") as out:
            out.writelines(f"{stack} {n}\n" for stack, n in sorted(stacks.items()))
    if args.split:
        print(f"{sum(stacks.values())} samples")
        for name, share in split(stacks):
            print(f"  {share:5.1f}%  {name}")
    if args.top:
        inclusive, own = top(stacks, args.top)
        print(f"{sum(stacks.values())} samples")
        print("inclusive:")
        for frame, share in inclusive:
            print(f"  {share:5.1f}%  {frame[:150]}")
        print("self:")
        for frame, share in own:
            print(f"  {share:5.1f}%  {frame[:150]}")


if __name__ == "__main__":
    main()
