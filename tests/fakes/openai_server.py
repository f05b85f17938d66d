"""A fake OpenAI-compatible server on 127.0.0.1 for tests: real HTTP, scripted answers.

The responder sees each request body and returns (status, JSON body), or `HANG`: the
request is accepted and never answered (until the server closes). Every request (path,
headers, body, arrival time) is recorded so tests can assert what the client sent.

A client that hangs up (a run that abandoned its calls) is not an error here: nothing is
printed, since a traceback from a handler thread lands in whatever test captures stderr
at that moment. Leaving the `with` block releases the hanging requests and joins every
handler thread, so no thread of a fake outlives its test.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], tuple[int, Any]]
HANG = "hang"  # a responder's answer: accept the request and never answer it


@dataclass
class SeenRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float  # time.time() when it arrived


def chat_completion(content: str, prompt_tokens: int = 11, completion_tokens: int = 7) -> dict[str, Any]:
    """A minimal, valid Chat Completions response whose message is `content`."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def error_body(message: str, code: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "code": code}}


class QuietHTTPServer(ThreadingHTTPServer):
    """Handler threads are joined on close; a client that hung up is not reported."""

    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeOpenAIServer:
    def __init__(self, responder: Callable[..., Any], with_headers: bool = False) -> None:
        """`with_headers`: the responder also receives the request's headers (to echo them)."""
        self.responder = responder
        self.with_headers = with_headers
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append(SeenRequest(self.path, dict(self.headers), body, time.time()))
                answer = server.responder(body, dict(self.headers)) if server.with_headers else server.responder(body)
                if answer == HANG:
                    server._released.wait()
                    return
                status, payload = answer
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
