"""A fake OpenAI-compatible completions server that honours `logit_bias`: a real script,
started as a real subprocess, on 127.0.0.1 and the port it is given.

    python tests/fakes/logit_bias_server.py --model-path DIR --port N [--fake-... options]

It behaves like llama-cpp-python 0.3.36's server where the logit_bias engine depends on
it (read from its source): GET /v1/models lists the one model (its id: --model-path, or
--fake-model-id); POST /v1/completions takes a text prompt (tokenized with the model's
tokenizer.json, special tokens added), `max_tokens`, `temperature` (0: greedy),
`logit_bias` ({token id as a string: bias}, added to the logits), and ignores the fields
it does not know (`stop_token_ids` among them: it stops at the model's EOS, as llama.cpp
stops at its end-of-generation tokens). The answer is {"choices": [{"text",
"finish_reason"}], "usage": {"prompt_tokens", "completion_tokens"}}, the end token left
out of both the text and the count, as llama-cpp-python does; with --fake-counts-end it is
counted, as vLLM, SGLang and llama-server count it. An unknown token id in logit_bias is a
400, as in llama-cpp-python (an IndexError there).

The "model" is a deterministic toy over the tokenizer: fixed random logits per (prompt,
position), an EOS logit rising with the position (unsteered answers end near position 16),
so a positive EOS bias ends answers sooner. Options for the tests: --fake-ignore-logit-bias
(accepts the map and leaves the logits alone), --fake-extra-prompt-token (counts one
prompt token more: a second BOS), --fake-stall N (the N-th completion request waits STALL
seconds, past any test's timeout, then answers), --fake-fail N,M (those requests answer
503), --fake-request-log FILE (one JSON line per POST), --fake-gather TEXT:K (requests
whose prompt holds TEXT wait until K of them are in flight: concurrency without a race
against the clock). GET /fake_stats: requests served and the most in flight at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

EOS_START = -4.0  # the EOS logit at position 0; other logits lie in [0, 4)
EOS_SLOPE = 0.5
STALL = 30.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fake-model-id", default=None)
    parser.add_argument("--fake-ignore-logit-bias", action="store_true")
    parser.add_argument("--fake-counts-end", action="store_true")
    parser.add_argument("--fake-extra-prompt-token", action="store_true")
    parser.add_argument("--fake-stall", type=int, default=None)
    parser.add_argument("--fake-fail", default="")
    parser.add_argument("--fake-request-log", type=Path, default=None)
    parser.add_argument("--fake-gather", default=None)
    return parser.parse_args(argv)


class Toy:
    def __init__(self, model_path: str) -> None:
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        config = json.loads((Path(model_path) / "config.json").read_text())
        self.vocab = self.tokenizer.get_vocab_size()
        self.eos = int(config["eos_token_id"])
        self.pad = config.get("pad_token_id")
        # A byte that is not UTF-8 alone decodes to U+FFFD, three bytes of another text: a real
        # model rarely emits one, and the engine compares its count with the text's.
        self.broken = [t for t in range(self.vocab) if "\ufffd" in self.tokenizer.decode([t])]

    def logits(self, prompt: list[int], position: int) -> np.ndarray:
        seed = zlib.crc32(json.dumps(prompt).encode()) * 1009 + position
        row = np.random.default_rng(seed).random(self.vocab, dtype=np.float32) * 4.0
        row[self.broken] = -30.0
        if self.pad is not None:
            row[self.pad] = -30.0
        row[self.eos] = EOS_START + EOS_SLOPE * position
        return row


class Fake:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.toy = Toy(args.model_path)
        self.lock = threading.Condition()
        self.count = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.failing = {int(n) for n in args.fake_fail.split(",") if n}
        marker, _, size = (args.fake_gather or ":0").rpartition(":")
        self.gather, self.gather_size, self.gathered = marker, int(size), 0

    def complete(self, body: dict[str, Any]) -> tuple[int, Any]:
        prompt = self.toy.tokenizer.encode(str(body.get("prompt", ""))).ids
        bias = np.zeros(self.toy.vocab, dtype=np.float32)
        for key, value in (body.get("logit_bias") or {}).items():
            if not str(key).isdigit() or int(key) >= self.toy.vocab:
                return 400, {"error": {"message": f"index {key} is out of bounds", "type": "IndexError"}}
            if not self.args.fake_ignore_logit_bias:
                bias[int(key)] += float(value)
        tokens: list[int] = []
        finish = "length"
        for position in range(int(body.get("max_tokens", 16))):
            token = int(np.argmax(self.toy.logits(prompt, position) + bias))
            if token == self.toy.eos:
                finish = "stop"
                break
            tokens.append(token)
        counted = len(tokens) + (1 if finish == "stop" and self.args.fake_counts_end else 0)
        prompt_tokens = len(prompt) + (1 if self.args.fake_extra_prompt_token else 0)
        return 200, {"id": "cmpl-fake", "object": "text_completion", "model": body.get("model"),
                     "choices": [{"text": self.toy.tokenizer.decode(tokens), "index": 0, "logprobs": None,
                                  "finish_reason": finish}],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": counted,
                               "total_tokens": prompt_tokens + counted}}

    def wait_for_gather(self, body: dict[str, Any]) -> None:
        if not self.gather or self.gather not in str(body.get("prompt", "")):
            return
        with self.lock:
            self.gathered += 1
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.gathered >= self.gather_size, timeout=STALL)

    def handle(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self.lock:
            self.count += 1
            number = self.count
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if number in self.failing:
                return 503, {"error": {"message": "fake overload", "type": "server_error"}}
            if number == self.args.fake_stall:
                time.sleep(STALL)
            self.wait_for_gather(body)
            return self.complete(body)
        finally:
            with self.lock:
                self.in_flight -= 1


def make_handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/v1/models":
                model = fake.args.fake_model_id or fake.args.model_path
                self.reply(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "me"}]})
            elif self.path == "/fake_stats":
                self.reply(200, {"requests": fake.count, "most_in_flight": fake.most_in_flight})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if fake.args.fake_request_log is not None:
                with fake.lock, fake.args.fake_request_log.open("a") as log:
                    log.write(json.dumps({"path": self.path, "body": body}) + "\n")
            if self.path != "/v1/completions":
                self.reply(404, {"detail": "Not Found"})
                return
            self.reply(*fake.handle(body))

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    return Handler


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    print(f"fake logit_bias server pid {os.getpid()} port {args.port}", flush=True)
    QuietHTTPServer(("127.0.0.1", args.port), make_handler(Fake(args))).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
