"""Hostile servers for ``simctl load``: a server on 127.0.0.1 that answers with whatever
hypothesis draws (wrong types, NaN, fractional and huge numbers, missing fields, the wrong
number of choices, broken event-stream framing, truncated bodies, resets, stalls, HTTP error
statuses, the wrong content type), and the promise ``simctl load`` keeps against each:

* it exits 0 (the server was there) with no traceback, and writes a complete run folder:
  a ``batch_NNNN.json`` per call, every call once in ``simulation_summary.json``, a row per
  prompt in ``requests.parquet``;
* a call is recorded as a success exactly when every answer it got was valid (the server
  knows which answers it broke), and a failed call has a reason, never the one of an
  answer the reader itself failed on;
* ``simctl observed`` reads the folder (exit 0) and agrees on which calls succeeded.

Each generated behaviour starts from a valid answer and applies neutral changes (extra
fields, reordered choices, comments in the stream, CRLF line ends, small delays) and at
most one breaking change, which the server applies to every request of the run and records
whether it did (a change that does not apply, such as a duplicate index in a call of one
prompt, leaves the answer valid). ``CLASSES`` is read by ``benchmarks/hostile_inputs.py``;
``tests/test_load_hostile.py`` runs it with a few cases.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from typer.testing import CliRunner

runner = CliRunner()

#: A stalled or reset answer fails at this timeout (s); every other answer is immediate and
#: has :data:`GUARD_S`, a bound no working machine comes near (so no case depends on speed).
STALL_TIMEOUT_S = 0.3
GUARD_S = 20.0

# -- hostile values ---------------------------------------------------------------------------

_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
JSON = st.recursive(_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                    max_leaves=5)
_NUMBERS = st.sampled_from([float("nan"), float("inf"), -float("inf"), -1, -0.0, 1.5, 3.0, 2**31, 2**63, 2**70,
                            10**30, True, False, "many", "3", [1], {}])


def _not_int(v: Any) -> bool:
    return isinstance(v, bool) or not isinstance(v, int)


#: wrong values per field: every value drawn here breaks the answer it is put in
WRONG = {
    "index": _NUMBERS | st.sampled_from([None, 99, -1, 2**64]) | JSON.filter(_not_int),
    "count": _NUMBERS | JSON.filter(lambda v: v is not None and _not_int(v)),
    "text": JSON.filter(lambda v: not isinstance(v, str)),
    "piece": JSON.filter(lambda v: v is not None and not isinstance(v, str)),
    "finish": JSON.filter(lambda v: v is not None and not isinstance(v, str)),
    "object": JSON.filter(lambda v: not isinstance(v, dict)),
    "maybe object": JSON.filter(lambda v: v is not None and not isinstance(v, dict)),
    "list": JSON.filter(lambda v: not isinstance(v, list)),
    "error": JSON.filter(bool),
}
RAW_BODIES = st.sampled_from([b"", b"{", b"null", b"<html>oops</html>", b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000,
                              b"1" * 5000, b'{"choices": [', b"data: [DONE"]) | st.binary(max_size=40)


@dataclass(frozen=True)
class Behaviour:
    """What the server does with every request of one run."""

    api: str
    neutral: tuple[tuple, ...] = ()          # changes that keep an answer valid
    fault: tuple | None = None               # at most one change that breaks it
    status: int = 200
    content_type: str | None = "default"     # "default": the API's own; None: no header
    framing: str = "length"                  # length | close | chunked
    cut: float | None = None                 # send this share of the body, then close
    reset: str | None = None                 # before | mid: an RST instead of the answer
    stall: str | None = None                 # before | mid: stop answering
    delay: float = 0.0
    raw: bytes | None = None                 # this body instead of the answer

    @property
    def delivered(self) -> bool:
        """Whether the answer arrives whole, with status 200 and the right content type."""
        return (self.status == 200 and self.content_type in ("default", *GOOD_TYPES[self.api]) and self.cut is None
                and self.reset is None and self.stall is None and self.raw is None)


GOOD_TYPES = {"batch": ("application/json", "application/json; charset=utf-8", "application/problem+json"),
              "stream": ("text/event-stream", "text/event-stream; charset=utf-8")}
GOOD_TYPES["completions"] = GOOD_TYPES["chat"] = GOOD_TYPES["stream"]
BAD_TYPES = ("text/html", "text/plain", "application/octet-stream", "application/x-ndjson", "", None)


# -- answers ----------------------------------------------------------------------------------

def batch_answer(b: Behaviour, prompts: int) -> tuple[bytes, bool]:
    """The body of a batch answer for a call of ``prompts`` prompts, and whether it is valid."""
    body: Any = {"id": "call-1", "model": "fake", "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
                 "choices": [{"index": i, "text": f"answer {i}", "task": "mmlu", "finish_reason": "length"}
                             for i in range(prompts)]}
    for change in b.neutral:
        kind = change[0]
        if kind == "reverse":
            body["choices"].reverse()
        elif kind == "no index":
            for c in body["choices"]:
                c.pop("index")
        elif kind == "extra":
            body[change[1]] = change[2]
        elif kind == "choice extra":
            body["choices"][change[1] % prompts]["logprobs"] = change[2]
        elif kind == "no usage":
            body.pop("usage")
        elif kind == "null finish":
            body["choices"][change[1] % prompts]["finish_reason"] = None
    valid = True
    if b.fault is not None:
        kind, k = b.fault[0], b.fault[1] % prompts
        choice = body["choices"][k]
        if kind == "body":
            body = b.fault[2]
        elif kind == "choices":
            body["choices"] = b.fault[2]
        elif kind == "no choices":
            body.pop("choices")
        elif kind == "fewer":
            body["choices"].pop()
        elif kind == "more":
            body["choices"].append(dict(choice))
        elif kind == "choice":
            body["choices"][k] = b.fault[2]
        elif kind == "index":
            choice["index"] = b.fault[2]
        elif kind == "duplicate index":
            other = body["choices"][(k + 1) % prompts]
            choice["index"] = other.get("index", (k + 1) % prompts)
        elif kind == "text":
            choice["text"] = b.fault[2]
        elif kind == "no text":
            choice.pop("text")
        elif kind == "finish":
            choice["finish_reason"] = b.fault[2]
        elif kind == "usage":
            body["usage"] = b.fault[2]
        elif kind == "count":
            body["usage"] = {"prompt_tokens": 7, "completion_tokens": 5, b.fault[2]: b.fault[3]}
        elif kind == "error":
            body = {"error": b.fault[2], "traceback": "Traceback (most recent call last): ..."}
        # a call of one prompt has no other index to duplicate: its answer stays valid
        valid = kind == "duplicate index" and prompts == 1
    return json.dumps(body).encode(), valid


def stream_answer(b: Behaviour, chat: bool) -> tuple[bytes, bool]:
    """The body of one streamed answer (server-sent events) and whether it is valid."""
    def choice(t: int, last: bool) -> dict:
        c: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
        if chat:
            c["delta"] = {"content": f"tok{t} "}
        else:
            c["text"] = f"tok{t} "
        return c

    events: list[Any] = [{"id": "x", "choices": [choice(t, t == 2)]} for t in range(3)]
    events.append({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
    raw_events: dict[int, bytes] = {}
    lines_before: list[bytes] = []
    garbage: bytes | None = None
    done, crlf, nospace = True, False, False
    for change in b.neutral:
        kind = change[0]
        if kind == "comment":
            lines_before.append(b": keep-alive")
        elif kind == "fields":
            lines_before += [b"event: message", b"id: 7", b"retry: 1000"]
        elif kind == "crlf":
            crlf = True
        elif kind == "nospace":
            nospace = True
        elif kind == "no usage":
            events.pop()
        elif kind == "extra":
            events[change[1] % len(events)][change[2]] = change[3]
        elif kind == "empty piece":
            events.insert(0, {"choices": [{"index": 0, "delta": {"role": "assistant"}} if chat else
                                          {"index": 0, "text": ""}]})
    valid = True
    if b.fault is not None:
        kind = b.fault[0]
        k = [i for i, e in enumerate(events) if e.get("choices")][b.fault[1] % 3]  # an event with a choice
        c = events[k]["choices"][0]
        valid = False
        if kind == "event":
            events[k] = b.fault[2]
        elif kind == "not json":
            raw_events[k] = b.fault[2]
        elif kind == "choices":
            events[k]["choices"] = b.fault[2]
        elif kind == "choice":
            events[k]["choices"] = [b.fault[2]]
        elif kind == "two choices":
            events[k]["choices"] = [c, dict(c)]
        elif kind == "index":
            c["index"] = b.fault[2]
        elif kind == "piece":
            if chat:
                c["delta"]["content"] = b.fault[2]
            else:
                c["text"] = b.fault[2]
        elif kind == "delta":
            if chat:
                c["delta"] = b.fault[2]
            else:
                valid = True  # a completion's choice has no delta: nothing broken
        elif kind == "finish":
            c["finish_reason"] = b.fault[2]
        elif kind == "usage":
            events[-1]["usage"] = b.fault[2]
        elif kind == "count":
            events[-1]["usage"] = {"prompt_tokens": 5, b.fault[2]: b.fault[3]}
        elif kind == "error":
            events[k] = {"error": b.fault[2]}
        elif kind == "no done":
            done = False
        elif kind == "garbage":
            garbage = b.fault[2]
    out = list(lines_before)
    for i, event in enumerate(events):
        if garbage is not None and i == 1:
            out.append(garbage)
        payload = raw_events.get(i, json.dumps(event).encode())
        out += [(b"data:" if nospace else b"data: ") + payload, b""]
    if done:
        out += [b"data: [DONE]", b""]
    end = b"\r\n" if crlf else b"\n"
    return end.join(out) + end, valid


@st.composite
def behaviours(draw: Any) -> Behaviour:
    """A server behaviour: an API, neutral changes, at most one breaking change, and how the
    answer is delivered."""
    api = draw(st.sampled_from(["batch", "completions", "chat"]))
    k = draw(st.integers(0, 5))
    if api == "batch":
        neutral = draw(st.lists(st.sampled_from(["reverse", "no index", "extra", "choice extra", "no usage", "null finish"]),
                                max_size=3, unique=True))
        fault_kinds = ["body", "choices", "no choices", "fewer", "more", "choice", "index", "duplicate index", "text",
                       "no text", "finish", "usage", "count", "error"]
    else:
        neutral = draw(st.lists(st.sampled_from(["comment", "fields", "crlf", "nospace", "no usage", "extra", "empty piece"]),
                                max_size=3, unique=True))
        fault_kinds = ["event", "not json", "choices", "choice", "two choices", "index", "piece", "delta", "finish",
                       "usage", "count", "error", "no done", "garbage"]
    changes = []
    for kind in neutral:
        if kind in ("extra", "choice extra") and api == "batch":
            changes.append((kind, draw(st.sampled_from(["meta", "created", "x"])) if kind == "extra" else k, draw(JSON)))
        elif kind == "extra":
            changes.append((kind, k, draw(st.sampled_from(["object", "created", "system_fingerprint"])), draw(JSON)))
        else:
            changes.append((kind, k))
    fault = None
    if draw(st.integers(0, 3)):  # most cases break the answer's content (hypothesis draws 0 often: about half)
        kind = draw(st.sampled_from(fault_kinds))
        value: tuple = ()
        if kind in ("body", "event", "choice"):
            value = (draw(WRONG["object"]),)
        elif kind == "choices":
            value = (draw(WRONG["list"]),)
        elif kind == "index":
            value = (draw(WRONG["index"]) if api == "batch" else draw(WRONG["index"] | st.integers(1, 5)),)
        elif kind == "text":
            value = (draw(WRONG["text"]),)
        elif kind == "piece":
            value = (draw(WRONG["piece"]),)
        elif kind == "delta":
            value = (draw(WRONG["maybe object"]),)
        elif kind == "finish":
            value = (draw(WRONG["finish"]),)
        elif kind == "usage":
            value = (draw(WRONG["maybe object"]),)
        elif kind == "count":
            value = (draw(st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens"])), draw(WRONG["count"]))
        elif kind == "error":
            value = (draw(WRONG["error"]),)
        elif kind == "not json":
            value = (draw(st.sampled_from([b"", b"{", b"nope", b"{'a': 1}", b"[" * 5000, b"1" * 5000, b"\xff"])),)
        elif kind == "garbage":
            value = (draw(st.sampled_from([b"garbage", b"data", b"DATA: {}", b'{"choices": []}', b"  ", b"\x00"])),)
        fault = (kind, k, *value)
    delivery = draw(st.sampled_from(["whole"] * 6 + ["status", "type", "cut", "reset", "stall", "raw"]))
    extra: dict[str, Any] = {}
    if delivery == "status":
        extra["status"] = draw(st.sampled_from([201, 204, 301, 400, 404, 422, 429, 500, 502, 503]))
    elif delivery == "type":
        extra["content_type"] = draw(st.sampled_from(BAD_TYPES + (GOOD_TYPES["stream" if api == "batch" else "batch"][0],)))
    elif delivery == "cut":
        extra["cut"] = draw(st.floats(0.0, 0.99))
    elif delivery == "reset":
        extra["reset"] = draw(st.sampled_from(["before", "mid"]))
    elif delivery == "stall":
        extra["stall"] = draw(st.sampled_from(["before", "mid"]))
    elif delivery == "raw":
        extra["raw"] = draw(RAW_BODIES)
    else:
        extra["content_type"] = draw(st.sampled_from(("default", *GOOD_TYPES[api])))
    return Behaviour(api=api, neutral=tuple(changes), fault=fault, framing=draw(st.sampled_from(["length", "close", "chunked"])),
                     delay=draw(st.sampled_from([0.0, 0.0, 0.01])), **extra)


# -- the server -------------------------------------------------------------------------------

class HostileServer:
    """A raw HTTP/1.1 server on 127.0.0.1 that answers every request as ``behaviour`` says and
    records, per prompt text, whether the answer it sent was valid."""

    def __init__(self, pick: Callable[[list[str]], Behaviour] | None = None) -> None:
        #: the behaviour of a request for these prompt texts (default: ``behaviour``)
        self.pick = pick
        self.behaviour = Behaviour(api="batch")
        self.valid: dict[str, list[bool]] = {}
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closing.set()
        self.sock.close()

    def reset(self, behaviour: Behaviour) -> None:
        with self.lock:
            self.behaviour, self.valid = behaviour, {}

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                head, body = data.split(b"\r\n\r\n", 1)
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    got = conn.recv(65536)
                    if not got:
                        return
                    body += got
                self._answer(conn, json.loads(body or b"{}"))
        except OSError:
            pass

    def _answer(self, conn: socket.socket, request: dict) -> None:
        if "messages" in request:
            texts = [request["messages"][0]["content"]]
        else:
            texts = request["prompt"] if isinstance(request["prompt"], list) else [request["prompt"]]
        b = self.behaviour if self.pick is None else self.pick(texts)
        if b.api == "batch":
            payload, valid = batch_answer(b, len(texts))
        else:
            payload, valid = stream_answer(b, chat="messages" in request)
        if b.raw is not None:
            payload = b.raw
        with self.lock:
            for text in texts:
                self.valid.setdefault(text, []).append(valid and b.delivered)
        if b.delay:
            self.closing.wait(b.delay)
        if b.reset == "before":
            return self._rst(conn)
        if b.stall == "before":
            self.closing.wait(GUARD_S)
            return None
        kind = b.content_type
        if kind == "default":
            kind = GOOD_TYPES[b.api][0]
        headers = [f"HTTP/1.1 {b.status} Whatever", "Connection: close"]
        if kind is not None:
            headers.append(f"Content-Type: {kind}")
        sent = payload
        if b.cut is not None:
            # a share of the body: for a stream, never as far as the end of its [DONE]
            end = payload.find(b"[DONE]") + len(b"[DONE]") if b"[DONE]" in payload else len(payload)
            sent = payload[:min(int(b.cut * len(payload)), max(end - 1, 0))]
        if b.framing == "length":
            headers.append(f"Content-Length: {len(payload)}")
            wire = sent
        elif b.framing == "chunked":
            headers.append("Transfer-Encoding: chunked")
            wire = b"".join(b"%x\r\n%s\r\n" % (len(sent[i:i + 50]), sent[i:i + 50]) for i in range(0, len(sent), 50))
            wire += b"" if b.cut is not None else b"0\r\n\r\n"
        else:
            wire = sent
        conn.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        if b.reset == "mid" or b.stall == "mid":
            conn.sendall(wire[: len(wire) // 2])
            if b.reset == "mid":
                return self._rst(conn)
            self.closing.wait(GUARD_S)
            return None
        conn.sendall(wire)
        conn.shutdown(socket.SHUT_WR)
        return None

    @staticmethod
    def _rst(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


# -- one case ---------------------------------------------------------------------------------

#: the calls each case sends: (prompts of each call); texts are unique so the server's record
#: of what it answered maps back to the call
CALLS = ((0.0, 2), (0.0, 1))


@dataclass
class Workspace:
    base: Path
    trace: Path
    texts: list[list[str]] = field(default_factory=list)
    runs: int = 0


def workspace() -> Workspace:
    from simulator.trace.formats import save_trace
    from simulator.trace.model import Call, Prompt, Trace

    base = Path(tempfile.mkdtemp(prefix="simctl-hostile-load-"))
    texts = [[f"question {i}.{j}" for j in range(n)] for i, (_, n) in enumerate(CALLS)]
    trace = Trace(tuple(Call(str(i), t, tuple(Prompt("mmlu", 10, 4, text) for text in texts[i]))
                        for i, (t, _) in enumerate(CALLS)))
    save_trace(trace, base / "trace.json")
    return Workspace(base, base / "trace.json", texts)


def problems(server: HostileServer, ws: Workspace, behaviour: Behaviour) -> list[str]:
    """Run ``simctl load`` against ``server`` behaving as ``behaviour``; what broke the promise
    (module docstring), empty when it was kept."""
    import pandas as pd

    from simulator.cli import app
    from simulator.live.load import UNEXPECTED
    from simulator.observed import read_observed

    server.reset(behaviour)
    ws.runs += 1
    run = ws.base / f"run{ws.runs}"
    stalls = behaviour.stall is not None or behaviour.reset is not None
    args = ["load", server.url, str(ws.trace), "-o", str(run), "-q", "--api", behaviour.api,
            "--timeout", str(STALL_TIMEOUT_S if stalls else GUARD_S)]
    if behaviour.api != "batch":
        args += ["--model", "m"]
    got = runner.invoke(app, args)
    out: list[str] = []
    said = got.stdout + got.stderr
    if got.exception is not None and not isinstance(got.exception, SystemExit):
        return [f"load raised {type(got.exception).__name__}: {got.exception}"]
    if "Traceback" in said or got.exit_code != 0:
        return [f"load exit {got.exit_code}: {said.strip()[-500:]}"]
    expected = {}
    for i, texts in enumerate(ws.texts):
        answered = [server.valid.get(t) for t in texts]
        if any(a is None or len(a) != 1 for a in answered):
            out.append(f"call {i}: the server got its prompts {answered} times, not once each")
        expected[i] = all(a == [True] for a in answered)
    files = sorted(p.name for p in run.glob("batch_0*.json"))
    if files != [f"batch_{i:04d}.json" for i in range(len(CALLS))]:
        out.append(f"call files {files}")
    summary = json.loads((run / "simulation_summary.json").read_text())
    ids = [r["batch_id"] for r in summary["results"]]
    if sorted(ids) != list(range(len(CALLS))):
        out.append(f"summary results {ids}")
    for r in summary["results"]:
        ok = r["status_code"] == 200 and not r["error"] and isinstance(r["response"], dict)
        if ok != expected.get(r["batch_id"]):
            out.append(f"call {r['batch_id']}: recorded {'ok' if ok else 'failed'} ({r['error']}), "
                       f"the answer was {'valid' if expected.get(r['batch_id']) else 'not valid'}")
        if not ok and not (isinstance(r["error"], str) and r["error"].strip()):
            out.append(f"call {r['batch_id']}: failed with no reason")
        if isinstance(r["error"], str) and UNEXPECTED in r["error"]:
            out.append(f"call {r['batch_id']}: {r['error']}")
    requests = pd.read_parquet(run / "requests.parquet")
    rows = sorted(zip(requests["call_id"], requests["prompt_index"], strict=True))
    if rows != [(str(i), j) for i, (_, n) in enumerate(CALLS) for j in range(n)]:
        out.append(f"request rows {rows}")
    for row in requests.itertuples():
        if (row.status == "ok") != expected.get(int(row.call_id)):
            out.append(f"request {row.call_id}.{row.prompt_index}: {row.status} ({row.error})")
    shown = runner.invoke(app, ["observed", str(run)])
    if shown.exit_code != 0 or (shown.exception is not None and not isinstance(shown.exception, SystemExit)):
        out.append(f"observed exit {shown.exit_code}: {(shown.stdout + shown.stderr).strip()[-300:]} {shown.exception!r}")
    else:
        calls = read_observed(run).calls
        if [bool(v) for v in calls["ok"]] != [expected[i] for i in range(len(CALLS))]:
            out.append(f"observed read ok {list(calls['ok'])}, expected {expected}")
    return out


def try_servers(examples: int, on_problem: Callable[[Behaviour, list[str]], None] | None = None) -> tuple[int, int]:
    """``examples`` generated server behaviours tried (derandomized): (tried, handled)."""
    tally = [0, 0]
    ws = workspace()
    with HostileServer() as server:
        @settings(max_examples=examples, derandomize=True, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(behaviours())
        def attempt(behaviour: Behaviour) -> None:
            found = problems(server, ws, behaviour)
            tally[0] += 1
            tally[1] += not found
            if found and on_problem is not None:
                on_problem(behaviour, found)

        attempt()
    return tally[0], tally[1]


CLASSES: dict[str, Callable[[int], tuple[int, int]]] = {"hostile servers for load": try_servers}
