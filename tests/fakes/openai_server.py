"""A fake OpenAI-compatible server on 127.0.0.1 for tests: real HTTP, scripted answers.

The responder sees each request body and returns (status, JSON body); every request
(path, headers, body) is recorded so tests can assert what the client sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], tuple[int, Any]]


@dataclass
class SeenRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


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


class FakeOpenAIServer:
    def __init__(self, responder: Callable[..., tuple[int, Any]], with_headers: bool = False) -> None:
        """`with_headers`: the responder also receives the request's headers (to echo them)."""
        self.responder = responder
        self.with_headers = with_headers
        self.requests: list[SeenRequest] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append(SeenRequest(self.path, dict(self.headers), body))
                status, payload = (server.responder(body, dict(self.headers)) if server.with_headers
                                   else server.responder(body))
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

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
