#!/usr/bin/env python3
"""The official OpenAI Python SDK against prefix-router in front of three mock engines.

Starts three `prefix-router mock-engine` processes and one `prefix-router serve` (prefix-aware)
on free loopback ports, then drives the router with `openai.OpenAI` and checks chat and
completions (streaming and not), usage with cached tokens, `/v1/models`, `prompt_cache_key`
routing, the Responses API (a conversation chained by `previous_response_id` over the engines'
stored responses, streamed and not), and the SDK's error classes for our error answers. Every child process is killed on
the way out, and the whole run is bounded by a hard timeout.

Usage: openai_sdk_check.py [--binary target/release/prefix-router] [--timeout 120]
Prints one line per check and ends with `N passed, M failed`; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

import openai

MODEL = "sdk-check-llama"
LORA = "sdk-check-adapter"
ENGINES = 3
ROOT = Path(__file__).resolve().parents[2]


class CheckFailed(Exception):
    pass


class HardTimeout(BaseException):
    """The overall time limit or a termination signal: not an Exception, so that no library
    (httpx maps socket timeouts) catches or rewraps it on its way to main's cleanup."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


# ---------------------------------------------------------------- processes


class Fleet:
    """The mock engines and the router, as child processes with their logs in a temp dir."""

    def __init__(self, binary: Path, logdir: Path):
        self.binary = binary
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.engine_urls: list[str] = []
        self.router_url = ""

    def _env(self) -> dict[str, str]:
        # Settings must come from our flags only, not from the caller's environment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIX_ROUTER_")}
        env["RUST_LOG"] = "warn"
        env.pop("RUST_BACKTRACE", None)
        return env

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.logdir / f"{name}.log"
        fh = open(log, "wb")
        try:
            proc = subprocess.Popen(
                [str(self.binary), *args],
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        finally:
            fh.close()
        self.procs.append((name, proc, log))
        return proc

    def start(self, deadline: float) -> None:
        # Free ports are picked by binding port 0 and closing; a port taken meanwhile makes a
        # child exit at once, and the whole start is tried again on fresh ports.
        for attempt in range(3):
            try:
                self._start_once(deadline)
                return
            except CheckFailed as e:
                if attempt == 2 or "exited" not in str(e):
                    raise
                print(f"startup attempt {attempt + 1} failed ({e}); retrying on other ports")
                self.stop()

    def _start_once(self, deadline: float) -> None:
        self.procs = []
        ports = free_ports(ENGINES + 1)
        self.engine_urls = []
        for i, port in enumerate(ports[:ENGINES]):
            self.spawn(
                f"engine{i}",
                [
                    "mock-engine",
                    "--listen", f"127.0.0.1:{port}",
                    "--preset", "small",
                    "--time-scale", "1",
                    "--model", MODEL,
                    "--lora", LORA,
                ],
            )
            self.engine_urls.append(f"http://127.0.0.1:{port}")
        for url in self.engine_urls:
            self.wait_http(f"{url}/health", deadline, lambda status, body: status == 200)
        router_port = ports[ENGINES]
        # The instances come from a config file that also names the models they serve, so the
        # router itself refuses a model no instance serves.
        config = self.logdir / "router.toml"
        served = json.dumps([MODEL, LORA])
        config.write_text(
            "[routing]\nstrategy = \"prefix-aware\"\n"
            + "".join(f'\n[[instances]]\nurl = "{u}"\nmodels = {served}\n' for u in self.engine_urls)
        )
        self.spawn("router", ["serve", "--config", str(config), "--listen", f"127.0.0.1:{router_port}"])
        self.router_url = f"http://127.0.0.1:{router_port}"

        def all_healthy(status: int, body: bytes) -> bool:
            if status != 200:
                return False
            v = json.loads(body)
            return v.get("ready") is True and v.get("healthy_instances") == ENGINES

        self.wait_http(f"{self.router_url}/ready", deadline, all_healthy)
        self.wait_http(f"{self.router_url}/health", deadline, lambda s, b: s == 200)

        # A second router in front of one engine that cuts every stream part way (it dies
        # mid-answer): the router must end such a stream with an error the SDK raises.
        cut_engine, cut_router = free_ports(2)
        self.spawn(
            "cutting-engine",
            [
                "mock-engine",
                "--listen", f"127.0.0.1:{cut_engine}",
                "--preset", "small",
                "--model", MODEL,
                "--close-stream-after-tokens", "4",
            ],
        )
        self.wait_http(f"http://127.0.0.1:{cut_engine}/health", deadline, lambda s, b: s == 200)
        self.spawn(
            "cut-router",
            ["serve", "--instance", f"http://127.0.0.1:{cut_engine}", "--listen", f"127.0.0.1:{cut_router}"],
        )
        self.cut_router_url = f"http://127.0.0.1:{cut_router}"
        self.wait_http(f"{self.cut_router_url}/ready", deadline, lambda s, b: s == 200)

    def wait_http(self, url: str, deadline: float, ok) -> None:
        last = "no answer"
        while time.monotonic() < deadline:
            for name, proc, log in self.procs:
                if proc.poll() is not None:
                    raise CheckFailed(
                        f"{name} exited with {proc.returncode} during startup:\n{tail(log)}"
                    )
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    status, body = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read()
            except OSError as e:
                status, body = 0, str(e).encode()
            if status and ok(status, body):
                return
            last = f"{status} {body[:200]!r}"
            time.sleep(0.1)
        raise CheckFailed(f"{url} not ready before the startup deadline (last: {last})")

    def stop(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        end = time.monotonic() + 5
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def kill_now(self) -> None:
        """From the watchdog thread: no waiting, no locks."""
        for _, proc, _ in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def logs(self) -> str:
        return "\n".join(f"--- {name} log (tail)\n{tail(log)}" for name, _, log in self.procs)


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


# ---------------------------------------------------------------- the checks


def words(tag: str, n: int) -> str:
    """A prompt of n words (the mock counts one token per word; blocks are 16 tokens)."""
    return " ".join(f"{tag}{i % 97}w{i}" for i in range(n))


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


class Ctx:
    def __init__(self, client: openai.OpenAI, fleet: Fleet):
        self.client = client
        self.fleet = fleet
        self.has_cache_key_param = "prompt_cache_key" in inspect.signature(
            client.chat.completions.create
        ).parameters

    def cache_key(self, key: str) -> dict:
        """prompt_cache_key as a parameter, or through extra_body on SDKs without it."""
        if self.has_cache_key_param:
            return {"prompt_cache_key": key}
        return {"extra_body": {"prompt_cache_key": key}}

    def instance_of(self, raw) -> str:
        inst = raw.headers.get("x-prefix-router-instance")
        expect(bool(inst), f"no x-prefix-router-instance header: {dict(raw.headers)}")
        expect(
            any(inst == u or inst in u for u in self.fleet.engine_urls),
            f"x-prefix-router-instance {inst!r} names none of {self.fleet.engine_urls}",
        )
        expect(
            bool(raw.headers.get("x-prefix-router-decision")),
            "no x-prefix-router-decision header",
        )
        return inst


def cached_tokens(usage):
    """usage.prompt_tokens_details.cached_tokens; SDKs before its typed field keep a dict."""
    details = getattr(usage, "prompt_tokens_details", None)
    if isinstance(details, dict):
        return details.get("cached_tokens")
    return getattr(details, "cached_tokens", None)


def chat_messages(prompt: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a test double."},
        {"role": "user", "content": prompt},
    ]


@check
def models_list(ctx: Ctx) -> str:
    ids = [m.id for m in ctx.client.models.list()]
    expect(MODEL in ids, f"{MODEL} not in models.list(): {ids}")
    expect(LORA in ids, f"LoRA adapter {LORA} not in models.list(): {ids}")
    expect(len(ids) == len(set(ids)), f"duplicate ids in models.list(): {ids}")
    return f"ids={ids}"


@check
def chat_non_streaming(ctx: Ctx) -> str:
    raw = ctx.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=chat_messages(words("chat", 40)), max_tokens=8
    )
    inst = ctx.instance_of(raw)
    r = raw.parse()
    expect(isinstance(r, openai.types.chat.ChatCompletion), f"parsed as {type(r)}")
    expect(r.object == "chat.completion", f"object {r.object!r}")
    expect(r.model == MODEL, f"model {r.model!r}")
    expect(len(r.choices) == 1, f"{len(r.choices)} choices")
    c = r.choices[0]
    expect(c.message.role == "assistant", f"role {c.message.role!r}")
    expect(bool(c.message.content and c.message.content.strip()), "empty content")
    expect(c.finish_reason == "length", f"finish_reason {c.finish_reason!r}")
    expect(r.usage is not None, "no usage")
    expect(r.usage.completion_tokens == 8, f"completion_tokens {r.usage.completion_tokens}")
    expect(r.usage.prompt_tokens == 45, f"prompt_tokens {r.usage.prompt_tokens} (want 5+40)")
    expect(
        r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
        "total_tokens is not the sum",
    )
    return f"instance={inst} content={c.message.content[:40]!r}..."


@check
def chat_repeated_prompt_is_cached(ctx: Ctx) -> str:
    msgs = chat_messages(words("cache", 200))
    first = ctx.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs, max_tokens=4
    )
    second = ctx.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs, max_tokens=4
    )
    a, b = ctx.instance_of(first), ctx.instance_of(second)
    expect(a == b, f"the same prompt went to {a} then {b}")
    u1, u2 = first.parse().usage, second.parse().usage
    c1, c2 = cached_tokens(u1), cached_tokens(u2)
    expect(c1 == 0, f"first request cached_tokens {c1}, want 0")
    expect(c2 is not None and c2 >= 192, f"repeat cached_tokens {c2}, want >= 192 of 205")
    return f"instance={a} cached_tokens {c1} -> {c2} of {u2.prompt_tokens}"


@check
def chat_streaming(ctx: Ctx) -> str:
    msgs = chat_messages(words("stream", 30))
    whole = ctx.client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24)
    stream = ctx.client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=24, stream=True
    )
    expect(isinstance(stream, openai.Stream), f"stream=True gave {type(stream)}")
    pieces, roles, finishes, ids = [], [], [], set()
    for chunk in stream:
        expect(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object!r}")
        ids.add(chunk.id)
        expect(chunk.usage is None, "usage on a chunk without include_usage")
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            if ch.delta.content:
                pieces.append(ch.delta.content)
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    expect(len(pieces) >= 3, f"content came in {len(pieces)} chunk(s), want several")
    expect(roles == ["assistant"], f"roles in deltas {roles}")
    expect(finishes == ["length"], f"finish reasons {finishes}")
    expect(len(ids) == 1, f"chunk ids {ids}")
    text = "".join(pieces)
    expect(
        text == whole.choices[0].message.content,
        f"streamed text {text!r} != non-streamed {whole.choices[0].message.content!r}",
    )
    return f"{len(pieces)} content chunks"


@check
def chat_streaming_usage_with_cached_tokens(ctx: Ctx) -> str:
    msgs = chat_messages(words("usage", 160))
    warm = ctx.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=msgs, max_tokens=2
    )
    raw = ctx.client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=msgs,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    expect(
        raw.headers.get("content-type", "").startswith("text/event-stream"),
        f"content-type {raw.headers.get('content-type')!r}",
    )
    a, b = ctx.instance_of(warm), ctx.instance_of(raw)
    expect(a == b, f"the repeated prompt went to {a} then {b}")
    chunks = list(raw.parse())
    with_usage = [c for c in chunks if c.usage is not None]
    expect(len(with_usage) == 1, f"{len(with_usage)} chunks carry usage, want 1")
    last = chunks[-1]
    expect(last.usage is not None and last.choices == [], "usage is not on a final choice-less chunk")
    u = last.usage
    expect(u.completion_tokens == 12, f"completion_tokens {u.completion_tokens}")
    cached = cached_tokens(u)
    expect(cached is not None and cached >= 160, f"cached_tokens {cached}, want >= 160 of {u.prompt_tokens}")
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    expect(len(content) >= 2, f"{len(content)} content chunks")
    return f"usage={u.prompt_tokens}/{u.completion_tokens} cached_tokens={cached}"


@check
def completions_non_streaming(ctx: Ctx) -> str:
    raw = ctx.client.completions.with_raw_response.create(
        model=MODEL, prompt=words("cmpl", 50), max_tokens=7
    )
    inst = ctx.instance_of(raw)
    r = raw.parse()
    expect(isinstance(r, openai.types.Completion), f"parsed as {type(r)}")
    expect(r.object == "text_completion", f"object {r.object!r}")
    expect(len(r.choices) == 1 and r.choices[0].text.strip() != "", "no text")
    expect(r.choices[0].finish_reason == "length", f"finish_reason {r.choices[0].finish_reason!r}")
    expect(r.usage.prompt_tokens == 50 and r.usage.completion_tokens == 7, f"usage {r.usage}")
    # The LoRA adapter is served too.
    lora = ctx.client.completions.create(model=LORA, prompt=words("cmpl", 50), max_tokens=3)
    expect(lora.model == LORA, f"LoRA answer names model {lora.model!r}")
    return f"instance={inst} text={r.choices[0].text[:40]!r}..."


@check
def completions_streaming(ctx: Ctx) -> str:
    prompt = words("cstream", 25)
    whole = ctx.client.completions.create(model=MODEL, prompt=prompt, max_tokens=24)
    pieces, finishes = [], []
    usage = None
    for chunk in ctx.client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    ):
        expect(chunk.object == "text_completion", f"chunk object {chunk.object!r}")
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.text:
                pieces.append(ch.text)
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    expect(len(pieces) >= 3, f"text came in {len(pieces)} chunk(s), want several")
    expect(finishes == ["length"], f"finish reasons {finishes}")
    text = "".join(pieces)
    expect(text == whole.choices[0].text, f"streamed {text!r} != non-streamed {whole.choices[0].text!r}")
    expect(usage is not None and usage.completion_tokens == 24, f"usage {usage}")
    return f"{len(pieces)} text chunks"


@check
def prompt_cache_key_routes(ctx: Ctx) -> str:
    msgs = chat_messages(words("tenant", 20))

    def send(key: str) -> str:
        raw = ctx.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=msgs, max_tokens=1, **ctx.cache_key(key)
        )
        raw.parse()
        return ctx.instance_of(raw)

    homes = {}
    for i in range(16):
        key = f"sdk-tenant-{i}"
        seen = {send(key) for _ in range(3)}
        expect(len(seen) == 1, f"key {key} with one prompt landed on {seen}")
        homes[key] = seen.pop()
    spread = set(homes.values())
    expect(len(spread) >= 2, f"16 keys with one prompt all landed on {spread}")
    # The router reads the key the SDK sent: an invalid one is refused by the router itself.
    try:
        ctx.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=1, **ctx.cache_key("k" * 65)
        )
    except openai.BadRequestError as e:
        expect(e.param == "prompt_cache_key", f"param {e.param!r}")
        expect(e.code == "invalid_group_id", f"code {e.code!r}")
        expect("x-prefix-router-instance" not in e.response.headers, "refusal was proxied")
    else:
        raise CheckFailed("a 65-character prompt_cache_key was accepted")
    how = "parameter" if ctx.has_cache_key_param else "extra_body"
    return f"via {how}: 16 keys on {len(spread)} instances, each key stable over 3 requests"


@check
def unknown_model_is_not_found(ctx: Ctx) -> str:
    try:
        ctx.client.chat.completions.create(
            model="no-such-model", messages=chat_messages("hello"), max_tokens=1
        )
    except openai.NotFoundError as e:
        expect(e.status_code == 404, f"status {e.status_code}")
        body = e.response.json()
        err = body.get("error")
        expect(isinstance(err, dict), f"body is not OpenAI-shaped: {body}")
        for field in ("message", "type", "param", "code"):
            expect(field in err, f"error JSON lacks {field!r}: {body}")
        expect(e.code == "model_not_found", f"code {e.code!r}")
        expect(e.param == "model", f"param {e.param!r}")
        expect("no-such-model" in str(e.message), f"message {e.message!r}")
        expect(
            "x-prefix-router-instance" not in e.response.headers,
            "the router sent a request for a model no instance serves to an instance",
        )
        return f"404 {err}"
    raise CheckFailed("an unknown model was served")


@check
def malformed_request_is_bad_request(ctx: Ctx) -> str:
    seen = []
    # Refused by the router's own parsing (content must be a string or text parts).
    try:
        ctx.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": 5}], max_tokens=1
        )
    except openai.BadRequestError as e:
        expect(e.status_code == 400, f"status {e.status_code}")
        expect(isinstance(e.response.json().get("error"), dict), "error JSON not OpenAI-shaped")
        seen.append(f"content=5 -> {e.code}/{e.param}")
    else:
        raise CheckFailed("a message with content 5 was accepted")
    # Refused by the engine, relayed through the router.
    try:
        ctx.client.chat.completions.create(
            model=MODEL, messages=chat_messages("hello"), max_tokens=0
        )
    except openai.BadRequestError as e:
        expect(e.param == "max_tokens", f"param {e.param!r}")
        seen.append(f"max_tokens=0 -> {e.code}/{e.param}")
    else:
        raise CheckFailed("max_tokens=0 was accepted")
    return "; ".join(seen)


@check
def stream_cut_by_engine_raises(ctx: Ctx) -> str:
    client = openai.OpenAI(
        base_url=f"{ctx.fleet.cut_router_url}/v1", api_key="unused", max_retries=0, timeout=20.0
    )
    got = []
    try:
        for chunk in client.chat.completions.create(
            model=MODEL, messages=chat_messages(words("cut", 20)), max_tokens=24, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
    except openai.APIError as e:
        expect(e.code == "upstream_stream_error", f"code {e.code!r}")
        expect(len(got) >= 1, "no content came before the cut")
        return f"APIError after {len(got)} content chunks: {e.message[:70]}..."
    raise CheckFailed(f"a stream the engine cut ended quietly after {len(got)} content chunks")


@check
def responses_non_streaming(ctx: Ctx) -> str:
    raw = ctx.client.responses.with_raw_response.create(
        model=MODEL,
        instructions=words("rules", 30),
        input=words("resp", 40),
        max_output_tokens=8,
    )
    inst = ctx.instance_of(raw)
    r = raw.parse()
    expect(r.object == "response", f"object {r.object!r}")
    expect(r.status == "completed", f"status {r.status!r}")
    expect(r.id.startswith("resp_"), f"id {r.id!r}")
    text = r.output_text
    expect(len(text.split()) == 8, f"output_text {text!r}, want 8 words")
    expect(r.usage is not None and r.usage.input_tokens == 70, f"usage {r.usage}")
    expect(r.usage.output_tokens == 8, f"output_tokens {r.usage.output_tokens}")
    return f"instance={inst} id={r.id} text={text[:40]!r}..."


@check
def responses_conversation_on_stored_state(ctx: Ctx) -> str:
    """Turns chained by previous_response_id, streamed and not: each engine stores its own
    responses (as vLLM does), so every turn must go where the last response lives."""
    raw = ctx.client.responses.with_raw_response.create(
        model=MODEL, instructions=words("policy", 50), input=words("t0", 20), max_output_tokens=6
    )
    home = ctx.instance_of(raw)
    last = raw.parse()
    cached = []
    for turn in range(1, 5):
        kwargs = dict(
            model=MODEL, previous_response_id=last.id, input=words(f"t{turn}", 20), max_output_tokens=6
        )
        if turn % 2 == 0:
            raw = ctx.client.responses.with_raw_response.create(stream=True, **kwargs)
            inst = ctx.instance_of(raw)
            events = list(raw.parse())
            types = [e.type for e in events]
            expect(types[:2] == ["response.created", "response.in_progress"], f"events {types[:4]}")
            expect(types[-1] == "response.completed", f"last event {types[-1]!r}")
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            last = events[-1].response
            expect(deltas == last.output_text, f"deltas {deltas!r} != {last.output_text!r}")
        else:
            raw = ctx.client.responses.with_raw_response.create(**kwargs)
            inst = ctx.instance_of(raw)
            last = raw.parse()
        decision = raw.headers.get("x-prefix-router-decision")
        expect(inst == home, f"turn {turn} went to {inst}, its conversation lives on {home}")
        expect(decision == "stored_response", f"turn {turn} decision {decision!r}")
        cached.append(last.usage.input_tokens_details.cached_tokens)
    expect(all(c >= 64 for c in cached), f"cached input tokens per turn {cached}")
    got = ctx.client.responses.retrieve(last.id)
    expect(got.id == last.id and got.output_text == last.output_text, f"retrieve gave {got.id}")
    return f"home={home} cached per turn {cached}"


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "prefix-router")
    ap.add_argument("--timeout", type=float, default=120.0, help="hard limit of the whole run, seconds")
    args = ap.parse_args()
    if not args.binary.is_file():
        print(f"no binary at {args.binary}; build it with cargo build --release -p prefix-router")
        print("0 passed, 1 failed")
        return 1

    started = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="prefix-router-sdk-"))
    fleet = Fleet(args.binary, logdir)

    # Hard overall timeout: SIGALRM raises in the main thread (the finally below kills the
    # children); a watchdog thread kills them and exits should that not happen in time.
    def on_alarm(signum, frame):
        raise HardTimeout(f"hard timeout of {args.timeout:.0f} s reached")

    def on_term(signum, frame):
        raise HardTimeout(f"terminated by signal {signum}")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.alarm(max(1, int(args.timeout)))

    def watchdog():
        time.sleep(args.timeout + 15)
        print(f"watchdog: still running {args.timeout + 15:.0f} s after start; killing", flush=True)
        fleet.kill_now()
        print(f"0 passed, {len(CHECKS)} failed", flush=True)
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()

    passed, failed = 0, []
    print(f"openai SDK {openai.__version__}, Python {sys.version.split()[0]}, binary {args.binary}")
    try:
        fleet.start(time.monotonic() + 30)
        print(f"router {fleet.router_url} in front of {', '.join(fleet.engine_urls)}"
              f" (ready after {time.monotonic() - started:.1f} s)")
        client = openai.OpenAI(
            base_url=f"{fleet.router_url}/v1", api_key="unused", max_retries=0, timeout=20.0
        )
        ctx = Ctx(client, fleet)
        for fn in CHECKS:
            t0 = time.monotonic()
            try:
                detail = fn(ctx)
                passed += 1
                print(f"PASS {fn.__name__} ({time.monotonic() - t0:.2f} s): {detail}")
            except HardTimeout:
                raise
            except CheckFailed as e:
                failed.append(fn.__name__)
                print(f"FAIL {fn.__name__}: {e}")
            except Exception as e:  # an SDK exception is a failure of that check
                failed.append(fn.__name__)
                print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}")
                traceback.print_exc(limit=3, file=sys.stdout)
    except (HardTimeout, CheckFailed, OSError) as e:
        failed.append(f"setup: {e}")
        print(f"FAIL setup/run: {type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
        if failed:
            print(fleet.logs())
        fleet.stop()
        if failed:
            print(f"logs kept in {logdir}")
        else:
            shutil.rmtree(logdir, ignore_errors=True)
    # Checks that never ran (setup failure, timeout) count as failed too.
    n_failed = max(len(CHECKS) - passed, len(failed))
    if failed:
        print("failed: " + ", ".join(failed))
    print(f"run time {time.monotonic() - started:.1f} s")
    print(f"{passed} passed, {n_failed} failed")
    return 0 if n_failed == 0 and passed == len(CHECKS) > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
