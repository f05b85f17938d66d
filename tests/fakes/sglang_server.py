"""A fake SGLang server: a real script, started as a real subprocess, speaking SGLang's
native HTTP protocol on the host and port it is given.

    python tests/fakes/sglang_server.py --model-path DIR --port N --host 127.0.0.1 \
        --enable-custom-logit-processor [--fake-... failure modes]

Endpoints: GET /health and /health_generate (503 while "starting"), POST /generate
({"text" or "input_ids", "custom_logit_processor", "sampling_params"} -> {"text", "meta_info"}), and
GET /fake_stats for the tests (request counts, most requests in flight at once).

It loads `custom_logit_processor` exactly as SGLang does (json -> dill.loads of the
hex string, one cached class per string, a new instance per request) and calls it on
float32 logits, one row with that request's `custom_params` (plus the `"__req__"` key
SGLang adds), logits wider than the tokenizer's vocabulary. An exception in the
processor kills the server, as in SGLang. The "model" is a deterministic toy over the
tokenizer in --model-path: fixed random logits per (prompt, position), with an EOS logit
that rises with the position, so a positive EOS delta ends answers earlier.

Readiness does not wait for torch (a 3 s import here): the toy model loads at the
first /generate, so start-up tests stay well under a second and need no model.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# SGLang's message when the flag is off (the client must surface it).
FLAG_MISSING = ("The server is not configured to enable custom logit processor. "
                "Please set `--enable-custom-logit-processor` to enable this feature.")
EOS_START = -4.0  # the EOS logit at position 0; other logits lie in [0, 4)
EOS_SLOPE = 0.5   # ... rising by this per position: unsteered answers end near position 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--enable-custom-logit-processor", action="store_true")
    parser.add_argument("--fake-start-delay", type=float, default=0.0, help="503 for this long")
    parser.add_argument("--fake-never-ready", action="store_true")
    parser.add_argument("--fake-no-health-generate", action="store_true", help="an old SGLang: /health only")
    parser.add_argument("--fake-exit-during-startup", type=int, default=None, metavar="CODE")
    parser.add_argument("--fake-crash-after", type=int, default=None, metavar="N",
                        help="die abruptly when request N+1 arrives")
    parser.add_argument("--fake-crash-marker", type=Path, default=None,
                        help="crash only while this file does not exist (created when crashing)")
    parser.add_argument("--fake-generate-delay", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--fake-ignore-sigterm", action="store_true")
    parser.add_argument("--fake-child", action="store_true", help="spawn a worker process in the group")
    # Real SGLang flags (--mem-fraction-static ...) pass through the launch command.
    args, _unknown = parser.parse_known_args(argv)
    return args


class ToyModel:
    """Deterministic logits over the tokenizer of a saved tiny model."""

    def __init__(self, model_path: str) -> None:
        import torch
        from tokenizers import Tokenizer

        self.torch = torch
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        config = json.loads((Path(model_path) / "config.json").read_text())
        self.vocab = self.tokenizer.get_vocab_size()
        self.eos = int(config["eos_token_id"])
        self.pad = config.get("pad_token_id")
        # Like real checkpoints, logits are wider than the tokenizer's vocabulary.
        self.width = (self.vocab // 64 + 1) * 64

    def logits(self, text: str, position: int) -> Any:
        torch = self.torch
        generator = torch.Generator().manual_seed(zlib.crc32(text.encode()) * 1009 + position)
        row = torch.rand(self.width, generator=generator, dtype=torch.float32) * 4.0
        row[self.vocab:] = -30.0
        if self.pad is not None:
            row[self.pad] = -30.0
        row[self.eos] = EOS_START + EOS_SLOPE * position
        return row.unsqueeze(0)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)


class SGLangRequest:
    """Stands for SGLang's `Req`, which the server puts into dict custom_params."""


class FakeServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self._model: ToyModel | None = None
        self._model_lock = threading.Lock()
        self.lock = threading.Lock()
        # SGLang runs every forward pass and processor call in one scheduler thread.
        self.scheduler = threading.Lock()
        self.processors: dict[str, type] = {}
        self.generate_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def model(self) -> ToyModel:
        with self._model_lock:
            if self._model is None:
                self._model = ToyModel(self.args.model_path)
            return self._model

    def starting(self) -> bool:
        return self.args.fake_never_ready or time.monotonic() - self.started < self.args.fake_start_delay

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"generate_requests": self.generate_requests, "max_in_flight": self.max_in_flight,
                    "processor_strings": len(self.processors), "host": self.args.host,
                    "port": self.args.port, "pid": os.getpid()}

    def load_processor(self, spec: str) -> type:
        """SGLang's CustomLogitProcessor.from_str: the class is cached per string forever."""
        import dill

        with self.lock:
            cls = self.processors.get(spec)
            if cls is None:
                try:
                    cls = self.processors[spec] = dill.loads(bytes.fromhex(json.loads(spec)["callable"]))
                except Exception:  # noqa: BLE001 - nothing validates the string: SGLang dies
                    traceback.print_exc()
                    sys.stdout.flush()
                    os._exit(1)
            return cls

    def generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.generate_requests += 1
            # Under the lock, so that exactly the first request past the limit crashes and
            # names itself last in the log: concurrent ones wait here until the exit.
            self._maybe_crash(self.generate_requests)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._generate(body)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _maybe_crash(self, arrived: int) -> None:
        after, marker = self.args.fake_crash_after, self.args.fake_crash_marker
        if after is None or arrived <= after or (marker is not None and marker.exists()):
            return
        if marker is not None:
            marker.touch()
        print(f"fake crash on request {arrived}", flush=True)
        os._exit(3)

    def _generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        spec = body.get("custom_logit_processor")
        if spec is not None and not self.args.enable_custom_logit_processor:
            return 400, {"error": {"message": FLAG_MISSING}}
        text, input_ids = body.get("text"), body.get("input_ids")
        ids_given = isinstance(input_ids, list) and all(isinstance(i, int) for i in input_ids)
        if not ids_given and not isinstance(text, str):
            return 400, {"error": {"message": "text or input_ids is required"}}
        sampling = body.get("sampling_params") or {}
        max_new_tokens = int(sampling.get("max_new_tokens", 128))
        params = sampling.get("custom_params")
        if isinstance(params, dict):
            params = {**params, "__req__": SGLangRequest()}
        time.sleep(self.args.fake_generate_delay)
        model = self.model()
        # The toy model's logits depend on the prompt only through this key.
        prompt = " ".join(map(str, input_ids)) if ids_given else text
        processor = self.load_processor(spec)() if spec is not None else None
        with self.scheduler:
            output, finish = self._decode(model, prompt, max_new_tokens, processor, params)
        return 200, {
            "text": model.decode([t for t in output if t != model.eos]),
            "meta_info": {"prompt_tokens": len(input_ids) if ids_given else model.prompt_tokens(text),
                          "completion_tokens": len(output), "finish_reason": finish},
        }

    @staticmethod
    def _decode(model: ToyModel, text: str, max_new_tokens: int, processor: Any,
                params: Any) -> tuple[list[int], dict[str, Any]]:
        output: list[int] = []
        for position in range(max_new_tokens):
            logits = model.logits(text, position)
            if processor is not None:
                try:
                    logits = processor(logits, [params])
                except Exception:  # noqa: BLE001 - SGLang's scheduler dies here too
                    traceback.print_exc()
                    sys.stdout.flush()
                    os._exit(1)
            token = int(model.torch.argmax(logits[0]))
            output.append(token)
            if token == model.eos:
                return output, {"type": "stop", "matched": token}
        return output, {"type": "length", "length": max_new_tokens}


def make_handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like uvicorn

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/fake_stats":
                self._reply(200, server.stats())
            elif self.path == "/health_generate" and server.args.fake_no_health_generate:
                self._reply(404, {"detail": "Not Found"})
            elif self.path in ("/health", "/health_generate"):
                self._reply(503 if server.starting() else 200, None)
            else:
                self._reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/generate":
                self._reply(404, {"detail": "Not Found"})
            elif server.starting():
                self._reply(503, {"error": {"message": "server is starting"}})
            else:
                self._reply(*server.generate(body))

        def _reply(self, status: int, payload: Any) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    return Handler


class QuietHTTPServer(ThreadingHTTPServer):
    """A client that hung up (an abandoned request) is not an error worth a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class IPv6HTTPServer(QuietHTTPServer):
    address_family = socket.AF_INET6


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    print(f"fake sglang pid {os.getpid()} host {args.host} port {args.port}", flush=True)
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.fake_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"fake child pid {child.pid}", flush=True)
    if args.fake_exit_during_startup is not None:
        print("Loading model weights...", flush=True)
        time.sleep(0.1)
        print("RuntimeError: CUDA out of memory (fake)", file=sys.stderr, flush=True)
        sys.exit(args.fake_exit_during_startup)
    server = FakeServer(args)
    # As SGLang's own server does, an IPv6 host such as ::1 gets an IPv6 socket.
    server_class = IPv6HTTPServer if ":" in args.host else QuietHTTPServer
    httpd = server_class((args.host, args.port), make_handler(server))
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
