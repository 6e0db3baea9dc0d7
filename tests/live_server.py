"""A tiny fake inference server on 127.0.0.1 for the load generator's tests.

It answers the users' batch endpoint (``POST /``), the streamed OpenAI endpoints
(``/v1/completions``, ``/v1/chat/completions``) and a plain completion of a list of prompts
(as ``simctl serve --backend openai`` asks its engines). What it does with a request is told
by markers in the prompt text: ``[delay=S]`` answers after S seconds (else the server's
``delay``), ``[stall]`` never answers (until the server stops), ``[500]`` answers HTTP 500,
``[error]`` answers HTTP 200 with ``{"error", "traceback"}`` (as the users' server does),
``[drop]`` closes the connection without an answer, ``[hold=N]`` answers only once N
requests have arrived (at most 30 s; a test of concurrency then needs no timing). Streams send ``tokens`` events,
``itl`` seconds apart. It records when each request arrived and the most requests it held
at once.

Run as a script (``python live_server.py PORTFILE``) it serves until killed, writing its
port to PORTFILE.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeServer:
    def __init__(self, delay: float = 0.0, tokens: int = 3, itl: float = 0.01) -> None:
        self.delay, self.tokens, self.itl = delay, tokens, itl
        self.released = threading.Event()
        self.lock = threading.Lock()
        #: notified (under ``lock``) whenever a request arrives
        self.arrived = threading.Condition(self.lock)
        self.received: list[tuple[float, str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.arrived:
                    server.received.append((time.monotonic(), self.path, body))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.arrived.notify_all()
                try:
                    server.answer(self, body)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.released.set()
        with self.arrived:
            self.arrived.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _text(self, body: dict) -> str:
        if "messages" in body:
            return " ".join(m.get("content", "") for m in body["messages"])
        prompt = body.get("prompt", "")
        return " ".join(prompt) if isinstance(prompt, list) else str(prompt)

    def answer(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        text = self._text(body)
        m = re.search(r"\[delay=([0-9.]+)\]", text)
        delay = float(m.group(1)) if m else self.delay
        hold = re.search(r"\[hold=([0-9]+)\]", text)
        if hold:
            with self.arrived:
                self.arrived.wait_for(lambda: len(self.received) >= int(hold.group(1)) or self.released.is_set(), 30)
        if "[stall]" in text:
            self.released.wait(30)
            return
        if "[drop]" in text:
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        time.sleep(delay)
        if "[500]" in text:
            self._json(handler, 500, {"detail": "Internal Server Error"})
        elif "[error]" in text:
            self._json(handler, 200, {"error": "Already borrowed", "traceback": "..."})
        elif handler.path.startswith("/v1/") and body.get("stream"):
            self._stream(handler, body)
        elif handler.path.startswith("/v1/"):  # a plain completion of a list of prompts (an engine behind serve)
            prompts = body["prompt"] if isinstance(body.get("prompt"), list) else [text]
            self._json(handler, 200, {"choices": [{"text": f" answer {i}", "index": i, "finish_reason": "length"}
                                                  for i in range(len(prompts))], "model": "fake"})
        else:
            prompts = body["prompt"]
            self._json(handler, 200, {"choices": [{"text": f"answer {i}", "index": i, "finish_reason": "length"}
                                                  for i in range(len(prompts))],
                                      "model": "fake", "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    def _json(self, handler: BaseHTTPRequestHandler, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def _stream(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        chat = handler.path.endswith("/chat/completions")
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        n = min(self.tokens, int(body.get("max_tokens", self.tokens)))
        for i in range(n):
            if i:
                time.sleep(self.itl)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
            if chat:
                choice["delta"] = {"content": f"tok{i} "}
            else:
                choice["text"] = f"tok{i} "
            handler.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            handler.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}
        handler.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        handler.wfile.flush()


if __name__ == "__main__":
    with FakeServer(delay=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0) as fake:
        with open(sys.argv[1], "w") as fh:
            fh.write(str(fake.port))
        fake.thread.join()
