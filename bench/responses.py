#!/usr/bin/env python3
"""Responses API conversations through a router in front of mock engines, on 127.0.0.1.

Starts `--engines` mock engines (from `--binary`) and one `serve` (from `--router`, default the
same binary: pass an older build to compare), then plays `--conversations` conversations of
`--turns` turns each on `/v1/responses`, `--concurrency` at a time. Every request shares one set
of instructions; each conversation opens with a document of its own, then asks a question per
turn, after a pause (`--think-ms`, as a person or a tool takes between turns); answers are 8 to
32 tokens long (seeded per conversation). Two ways to carry a conversation:

- `stateless`: every turn sends the whole conversation so far as `input`, with `store: false`
  (as agents that keep their own history do);
- `stored`: every turn names the last response with `previous_response_id` (the engine keeps
  the conversation, the first turn's instructions included; only the engine that gave that
  response holds it).

Prints one line per router: requests, failures (non-200 answers; a conversation stops at its
first), the share of input tokens the engines served from cache
(`usage.input_tokens_details.cached_tokens`), the mean and P90 latency of a turn, and the busiest
instance's share of the requests (from the router's `x-prefix-router-instance` header). Standard library only. Loopback only; every child is killed on the way out.

Usage: bench/responses.py [--binary target/release/prefix-router] [--router OTHER_BIN ...]
           [--mode stateless|stored] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_ok(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}w{i}" for i in range(n))


def post(url: str, body: dict) -> tuple[int, dict, float, str, str]:
    """Status, JSON answer, seconds, the instance that answered and why (the router's headers)."""
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
            h = r.headers
            return r.status, out, time.monotonic() - t0, h.get("x-prefix-router-instance", ""), h.get("x-prefix-router-decision", "")
    except urllib.error.HTTPError as e:
        h = e.headers
        return e.code, {}, time.monotonic() - t0, h.get("x-prefix-router-instance", ""), h.get("x-prefix-router-decision", "")


def run_once(args, router_bin: Path, logdir: Path) -> dict:
    procs = []
    ports = free_ports(args.engines + 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIX_ROUTER_")}
    env["RUST_LOG"] = "warn"

    def spawn(name, argv):
        log = open(logdir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        procs.append(p)
        return p

    try:
        engines = []
        for i, port in enumerate(ports[:-1]):
            spawn(f"engine{i}", [str(args.binary), "mock-engine", "--listen", f"127.0.0.1:{port}",
                                 "--preset", "small", "--time-scale", str(args.time_scale)])
            engines.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        for e in engines:
            wait_ok(f"{e}/health", deadline)
        router = f"http://127.0.0.1:{ports[-1]}"
        argv = [str(router_bin), "serve", "--listen", f"127.0.0.1:{ports[-1]}"]
        for e in engines:
            argv += ["--instance", e]
        spawn("router", argv)
        wait_ok(f"{router}/ready", deadline)

        instructions = words("policy", args.instruction_words)
        results = []
        lock = threading.Lock()
        queue = list(range(args.conversations))

        def conversation(c: int) -> None:
            history: list[dict] = []
            previous = None
            # Seeded per conversation: the same turns, answer lengths and pauses on every run.
            rng = random.Random(c)
            for t in range(args.turns):
                if t > 0 and args.think_ms > 0:
                    time.sleep(rng.uniform(0, args.think_ms) / 1000)
                text = (words(f"doc{c}", args.document_words) + " " if t == 0 else "") + words(f"c{c}q{t}", 20)
                body = {"max_output_tokens": rng.randint(8, 32)}
                if args.mode == "stateless":
                    history.append({"role": "user", "content": text})
                    body.update(instructions=instructions, input=history, store=False)
                else:
                    # The engine keeps the first turn's instructions with the conversation (vLLM
                    # puts a turn's own `instructions` before the stored conversation, so sent
                    # on every turn they would pile up and break the shared prefix).
                    if t == 0:
                        body["instructions"] = instructions
                    body.update(input=text, previous_response_id=previous)
                status, out, secs, inst, why = post(f"{router}/v1/responses", body)
                usage = out.get("usage") or {}
                with lock:
                    results.append((status, usage.get("input_tokens", 0),
                                    (usage.get("input_tokens_details") or {}).get("cached_tokens", 0), secs, inst, why))
                if status != 200:
                    # The conversation cannot go on without its last response.
                    return
                answer = "".join(
                    part.get("text", "")
                    for item in out.get("output", [])
                    for part in item.get("content", [])
                )
                history.append({"role": "assistant", "content": answer})
                previous = out.get("id")

        def worker() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    c = queue.pop(0)
                conversation(c)

        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.monotonic() - t0
        ok = [r for r in results if r[0] == 200]
        lat = sorted(r[3] for r in ok)
        shares, decisions = {}, {}
        for r in results:
            shares[r[4]] = shares.get(r[4], 0) + 1
            decisions[r[5]] = decisions.get(r[5], 0) + 1
        return {
            "busiest": max(shares.values(), default=0) / max(1, len(results)),
            "decisions": " ".join(f"{k or '-'}:{v}" for k, v in sorted(decisions.items())),
            "requests": len(results),
            "failed": len(results) - len(ok),
            "hit_rate": sum(r[2] for r in ok) / max(1, sum(r[1] for r in ok)),
            "mean_ms": 1000 * sum(lat) / max(1, len(lat)),
            "p90_ms": 1000 * lat[int(0.9 * (len(lat) - 1))] if lat else 0.0,
            "wall_s": wall,
        }
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "prefix-router",
                    help="the build whose mock engines serve (and whose router runs, by default)")
    ap.add_argument("--router", type=Path, action="append", default=[],
                    help="a router build to run (repeat to compare; default: --binary)")
    ap.add_argument("--mode", choices=["stateless", "stored"], default="stateless")
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--instruction-words", type=int, default=600)
    ap.add_argument("--document-words", type=int, default=800)
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--think-ms", type=float, default=200.0,
                    help="a pause before each turn after the first, uniform in 0..N ms")
    ap.add_argument("--rounds", type=int, default=1, help="alternated rounds over the routers")
    args = ap.parse_args()
    routers = args.router or [args.binary]
    for b in [args.binary, *routers]:
        if not b.is_file():
            print(f"no binary at {b}", file=sys.stderr)
            return 1
    logdir = Path(tempfile.mkdtemp(prefix="prefix-router-responses-"))
    print(f"mode {args.mode}: {args.conversations} conversations x {args.turns} turns, "
          f"{args.concurrency} at a time, {args.engines} mock engines (time scale {args.time_scale}), "
          f"pauses up to {args.think_ms:.0f} ms")
    print("round  router                                    requests  failed  hit rate  mean ms  p90 ms  busiest  decisions")
    for rnd in range(1, args.rounds + 1):
        for r in routers:
            out = run_once(args, r, logdir)
            print(f"{rnd:>5}  {str(r)[-40:]:<40}  {out['requests']:>8}  {out['failed']:>6}  "
                  f"{100 * out['hit_rate']:>7.1f}%  {out['mean_ms']:>7.1f}  {out['p90_ms']:>6.1f}  "
                  f"{100 * out['busiest']:>6.1f}%  {out['decisions']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
