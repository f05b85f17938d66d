"""A fake SGLang server: a real script, started as a real subprocess, speaking SGLang's
native HTTP protocol on the host and port it is given.

    python tests/fakes/sglang_server.py --model-path DIR --port N --host 127.0.0.1 \
        --enable-custom-logit-processor [real SGLang flags] [--fake-... options]

It behaves like SGLang 0.5.23 where this project depends on it (tests/
test_sglang_contract.py checks those parts against SGLang's own code):

- POST /generate ({"input_ids" or "text", "custom_logit_processor", "sampling_params"}
  -> {"text", "output_ids", "meta_info"}). `sampling_params` passes SGLang's contract
  gate (an unknown field or a wrongly typed one is a 400 naming it), is merged over
  --preferred-sampling-params, and is honoured where the toy model can: max_new_tokens,
  min_new_tokens, ignore_eos, stop_token_ids, temperature and top_k (temperature 0 is
  greedy); the matched stop token is trimmed from the text, as SGLang's detokenizer does.
- POST /v1/completions (SGLang's CompletionRequest: "prompt" as text or token ids,
  max_tokens, min_tokens, the other sampling fields by their own names, unknown fields
  ignored; custom_logit_processor and custom_params at the top level) becomes the same
  generation with the sampling params SGLang builds from it (every field it maps, None
  included, overrides the preferred ones). The answer is {"choices": [{"text",
  "finish_reason", "token_ids", "prompt_token_ids"}], "usage"}, the ids only with
  return_token_ids. A text prompt is tokenized with the model's tokenizer.json, special
  tokens added, as SGLang's tokenizer manager does.
- A prompt plus max_new_tokens past the context (--context-length, else the model's
  config) is a 400 with SGLang's messages; the scheduler's silent cut of max_new_tokens
  to context - 2 - prompt happens too.
- One scheduler thread decodes every running request together, a step at a time. At
  each step the rows are grouped by their exact processor string and each group's
  processor (SGLang's `from_str`: json -> dill.loads, one cached class per string, a new
  instance per call) is called once, on a copy of the group's rows, with one
  custom_params entry per row (None without params; a dict gets SGLang's "__req__"), and
  its result copied back. Logits are float32 and wider than the tokenizer's vocabulary.
  An exception in a processor, or a string that fails to load, kills the server, as in
  SGLang. With --speculative-algorithm (or --fake-steer-first-token-only, which does not
  say so) only an answer's first token goes through the processor, as in SGLang's
  EAGLE/NGRAM verification.
- GET /health, /health_generate (503 while "starting"), /server_info and
  /get_server_info (the flags: speculative_algorithm, enable_deterministic_inference,
  context_length, ...), /model_info and /get_model_info (model_path as given,
  preferred_sampling_params), /v1/models (max_model_len).
- Deterministic inference as SGLang resolves it at start-up, on the GPU `nvidia-smi`
  reports (as SGLang asks CUDA; none: no GPU constraint): without --attention-backend
  the fallback is flashinfer on SM100/SM120 and fa3 elsewhere; flashinfer (any backend
  but fa3, fa4, triton, ascend) turns the radix cache off; fa3 on a GPU outside
  SM80-SM90 dies at start-up with SGLang's assertion. /server_info reports the resolved
  attention_backend and disable_radix_cache.
- --fake-without-compressor-2: the server's Python cannot import compressor_2 (the
  package is hidden from its import system), as on a server where it is not installed.
- For the tests: GET /fake_stats (request counts, requests in flight, processor calls
  and rows per call, prompt tokens prefilled) and --fake-request-log FILE (one JSON line
  per POST); --fake-stall N,M,...: the N-th, M-th, ... generation requests to arrive sit
  unanswered for STALL seconds (past a client's timeout), then are served;
  --fake-gather TEXT:K: requests whose prompt holds TEXT wait until K of them are in
  flight (concurrency proven without a race against the clock). For the router
  benchmark: --fake-generate-delay D with --fake-max-running K, a worker that takes D
  seconds per request and serves at most K at once; --fake-prefill-per-token S with
  --fake-prefix-cache T, a worker that spends S seconds on every prompt token it has not
  cached, and caches the prompts it saw, the least recently used dropped past T tokens
  (the prefix of a prompt matched against the longest cached one, as a radix cache
  matches).

The "model" is a deterministic toy over the tokenizer in --model-path: fixed random
logits per (prompt, position), with an EOS logit that rises with the position, so a
positive EOS delta ends answers earlier; answers do not depend on batching. Readiness
does not wait for torch (a 3 s import here): the toy model loads at the first request
that needs it, so start-up tests stay well under a second. Several instances on
different ports are independent processes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# SGLang's message when the flag is off (the client must surface it).
FLAG_MISSING = ("The server is not configured to enable custom logit processor. "
                "Please set `--enable-custom-logit-processor` to enable this feature.")
EOS_START = -4.0  # the EOS logit at position 0; other logits lie in [0, 4)
EOS_SLOPE = 0.5   # ... rising by this per position: unsteered answers end near position 16
# The fields of SGLang's /generate `sampling_params` (sglang.api.v1.api_types.SamplingParams,
# in its order; the contract test compares this tuple with SGLang's own) by JSON type.
SAMPLING_FIELDS: dict[str, str] = {
    "max_new_tokens": "i64", "stop": "any", "stop_token_ids": "any", "stop_regex": "any",
    "temperature": "f64", "top_p": "f64", "top_k": "i64", "min_p": "f64",
    "frequency_penalty": "f64", "presence_penalty": "f64", "repetition_penalty": "f64",
    "min_new_tokens": "i64", "n": "i64", "json_schema": "any", "regex": "any", "ebnf": "any",
    "structural_tag": "any", "ignore_eos": "a boolean", "skip_special_tokens": "a boolean",
    "spaces_between_special_tokens": "a boolean", "no_stop_trim": "a boolean", "stream_interval": "i64",
    "logit_bias": "any", "sampling_seed": "i64", "custom_params": "any", "beam_width": "i64",
    "watermark": "any", "choice": "any",
}
TOP_K_ALL = 1 << 30
STALL = 30.0  # seconds a --fake-stall-first request waits: far past any test's request timeout
# SGLang 0.5.23's deterministic inference (arg_groups/choices.py, overrides.py, attention_hook.py,
# attention_registry.py; tests/test_sglang_contract.py holds these to its code).
DETERMINISTIC_BACKENDS = ("ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton")
RADIX_DETERMINISTIC_BACKENDS = ("ascend", "fa3", "fa4", "triton")
FLASHINFER_FALLBACK_MAJORS = (10, 12)
FA3_ASSERTION = "FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use `--attention-backend flashinfer`."
# SGLang's CompletionRequest fields that its _build_sampling_params maps into sampling
# params (completions name -> sampling name), with the request's defaults: every one of
# them reaches the merge, None included, so the preferred params never fill them.
COMPLETION_SAMPLING: dict[str, tuple[str, Any]] = {
    "temperature": ("temperature", 1.0), "max_tokens": ("max_new_tokens", 16),
    "min_tokens": ("min_new_tokens", 0), "stop": ("stop", None), "stop_token_ids": ("stop_token_ids", None),
    "stop_regex": ("stop_regex", None), "top_p": ("top_p", 1.0), "top_k": ("top_k", -1),
    "min_p": ("min_p", 0.0), "presence_penalty": ("presence_penalty", 0.0),
    "frequency_penalty": ("frequency_penalty", 0.0), "repetition_penalty": ("repetition_penalty", 1.0),
    "regex": ("regex", None), "json_schema": ("json_schema", None), "ebnf": ("ebnf", None), "n": ("n", 1),
    "no_stop_trim": ("no_stop_trim", False), "ignore_eos": ("ignore_eos", False),
    "skip_special_tokens": ("skip_special_tokens", True), "logit_bias": ("logit_bias", None),
    "custom_params": ("custom_params", None), "seed": ("sampling_seed", None), "watermark": ("watermark", None),
}


def gather_spec(text: str) -> tuple[str, int]:
    marker, _, size = text.rpartition(":")
    return marker, int(size)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", "--model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--enable-custom-logit-processor", action="store_true")
    parser.add_argument("--enable-deterministic-inference", action="store_true")
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument("--speculative-algorithm", default=None)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--preferred-sampling-params", default=None, help="a JSON object")
    parser.add_argument("--fake-start-delay", type=float, default=0.0, help="503 for this long")
    parser.add_argument("--fake-never-ready", action="store_true")
    parser.add_argument("--fake-no-health-generate", action="store_true", help="an old SGLang: /health only")
    parser.add_argument("--fake-info-endpoints", choices=("all", "old", "none"), default="all",
                        help="old: only /get_server_info and /get_model_info; none: neither kind")
    parser.add_argument("--fake-exit-during-startup", type=int, default=None, metavar="CODE")
    parser.add_argument("--fake-crash-after", type=int, default=None, metavar="N",
                        help="die abruptly when request N+1 arrives")
    parser.add_argument("--fake-crash-marker", type=Path, default=None,
                        help="crash only while this file does not exist (created when crashing)")
    parser.add_argument("--fake-generate-delay", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--fake-max-running", type=int, default=None, metavar="K",
                        help="at most K requests past admission at once (the others wait)")
    parser.add_argument("--fake-step-delay", type=float, default=0.0, help="seconds per decode step")
    parser.add_argument("--fake-stall", type=lambda text: {int(n) for n in text.split(",")}, default=set(),
                        metavar="N,M", help="these generation requests (by arrival) wait STALL seconds")
    parser.add_argument("--fake-gather", type=gather_spec, default=None, metavar="TEXT:K",
                        help="requests whose prompt holds TEXT wait until K of them are in flight, then go on "
                             "together (after STALL seconds without K, they go on alone)")
    parser.add_argument("--fake-prefill-per-token", type=float, default=0.0, metavar="S",
                        help="seconds per prompt token not in the prefix cache")
    parser.add_argument("--fake-prefix-cache", type=int, default=0, metavar="T",
                        help="tokens of prompts the prefix cache holds (least recently used dropped)")
    parser.add_argument("--fake-without-compressor-2", action="store_true",
                        help="hide compressor_2 from this server's imports")
    parser.add_argument("--fake-steer-first-token-only", action="store_true",
                        help="apply processors to an answer's first token only, and not say so")
    parser.add_argument("--fake-request-log", type=Path, default=None, help="append each POST as a JSON line")
    parser.add_argument("--fake-ignore-sigterm", action="store_true")
    parser.add_argument("--fake-child", action="store_true", help="spawn a worker process in the group")
    # Other real SGLang flags (--mem-fraction-static ...) pass through the launch command.
    args, _unknown = parser.parse_known_args(argv)
    return args


class ToyModel:
    """Deterministic logits over the tokenizer of a saved tiny model."""

    def __init__(self, model_path: str) -> None:
        import torch
        from tokenizers import Tokenizer

        self.torch = torch
        self.tokenizer = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
        self.config = json.loads((Path(model_path) / "config.json").read_text())
        self.vocab = self.tokenizer.get_vocab_size()
        self.eos = int(self.config["eos_token_id"])
        self.pad = self.config.get("pad_token_id")
        # Like real checkpoints, logits are wider than the tokenizer's vocabulary.
        self.width = (self.vocab // 64 + 1) * 64

    def logits(self, key: str, position: int) -> Any:
        torch = self.torch
        generator = torch.Generator().manual_seed(zlib.crc32(key.encode()) * 1009 + position)
        row = torch.rand(self.width, generator=generator, dtype=torch.float32) * 4.0
        row[self.vocab:] = -30.0
        if self.pad is not None:
            row[self.pad] = -30.0
        row[self.eos] = EOS_START + EOS_SLOPE * position
        return row

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def model_context(model_path: str) -> int:
    """The context SGLang derives from the model's config when --context-length is not given."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        if name in config:
            return int(config[name])
    return 2048


def sampling_error(sampling: Any) -> str | None:
    """SGLang's contract gate on `sampling_params`, in its own words."""
    if not isinstance(sampling, dict):  # (a list is a batch's: this fake serves single requests)
        return f"invalid type: {_serde_kind(sampling)}, expected a value or an array of values for SamplingParamsOrList"
    for name, value in sampling.items():
        kind = SAMPLING_FIELDS.get(name)
        if kind is None:
            expected = ", ".join(f"`{n}`" for n in SAMPLING_FIELDS)
            return f"unknown field `{name}`, expected one of {expected}"
        if value is None or kind == "any":
            continue
        ok = {"f64": isinstance(value, (int, float)) and not isinstance(value, bool),
              "i64": isinstance(value, int) and not isinstance(value, bool),
              "a boolean": isinstance(value, bool)}[kind]
        if not ok:
            return f"invalid type: {_serde_kind(value)}, expected {kind}"
    return None


def _serde_kind(value: Any) -> str:
    """How the gate's decoder names a JSON value of the wrong type."""
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, bool):
        return f"boolean `{json.dumps(value)}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    return "sequence" if isinstance(value, list) else "map"


def context_error(input_tokens: int, max_new_tokens: int | None, context: int) -> str | None:
    """SGLang's tokenizer manager (_validate_one_request): the 400 of a request past the context."""
    if input_tokens >= context:
        return (f"The input ({input_tokens} tokens) is longer than the model's context length "
                f"({context} tokens).")
    if max_new_tokens is not None and max_new_tokens + input_tokens > context:
        return (f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {max_new_tokens + input_tokens} tokens: {input_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the limit.")
    return None


def completion_error(message: str) -> dict[str, Any]:
    """SGLang's OpenAI-compatible error body (its ErrorResponse) of a 400."""
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


class SGLangRequest:
    """Stands for SGLang's `Req`, which the server adds to dict custom_params as "__req__"."""

    def __init__(self, rid: str, input_ids: list[int]) -> None:
        self.rid = rid
        self.origin_input_ids = list(input_ids)


@dataclass
class Running:
    """One request in the scheduler."""

    rid: str
    key: str  # the toy model's logits depend on the prompt only through this
    max_new_tokens: int
    min_new_tokens: int
    ignore_eos: bool
    stop_ids: frozenset[int]  # besides the model's eos
    temperature: float
    top_k: int
    processor: str | None
    params: Any
    generator: Any
    output: list[int] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Scheduler:
    """SGLang's scheduler, as far as the steering sees it: one thread, every running
    request decoded together, processors grouped by their exact string."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.waiting: list[Running] = []
        self.running: list[Running] = []
        self.ready = threading.Condition()
        threading.Thread(target=self._loop, name="scheduler", daemon=True).start()

    def submit(self, request: Running) -> None:
        with self.ready:
            self.waiting.append(request)
            self.ready.notify()
        request.done.wait()

    def _loop(self) -> None:
        while True:
            with self.ready:
                while not (self.waiting or self.running):
                    self.ready.wait()
                self.running += self.waiting
                self.waiting = []
            try:
                self._step()
            except Exception:  # noqa: BLE001 - SGLang's scheduler dies here too
                traceback.print_exc()
                sys.stdout.flush()
                os._exit(1)
            time.sleep(self.server.args.fake_step_delay)

    def _step(self) -> None:
        model = self.server.model()
        torch = model.torch
        rows = self.running
        logits = torch.stack([model.logits(r.key, len(r.output)) for r in rows])
        groups: dict[str, list[int]] = {}
        first_only = self.server.args.speculative_algorithm or self.server.args.fake_steer_first_token_only
        for i, r in enumerate(rows):
            if r.processor is not None and not (first_only and r.output):
                groups.setdefault(r.processor, []).append(i)
        for spec, group in groups.items():
            indices = torch.tensor(group)
            selected = logits.index_select(0, indices)
            result = self.server.load_processor(spec)()(selected, [rows[i].params for i in group])
            logits.index_copy_(0, indices, result.to(logits.dtype))
            self.server.count_call(len(group))
        for i, r in enumerate(rows):
            token = self._sample(model, logits[i], r)
            r.output.append(token)
            if (token == model.eos or token in r.stop_ids) and not r.ignore_eos and len(r.output) > r.min_new_tokens:
                r.finish = {"type": "stop", "matched": token}
            elif len(r.output) >= r.max_new_tokens:
                r.finish = {"type": "length", "length": r.max_new_tokens}
        self.running = [r for r in rows if r.finish is None]
        for r in rows:
            if r.finish is not None:
                r.done.set()

    @staticmethod
    def _sample(model: ToyModel, row: Any, r: Running) -> int:
        torch = model.torch
        if len(r.output) < r.min_new_tokens and not r.ignore_eos:
            row = row.clone()
            row[model.eos] = -math.inf
        if r.temperature < 1e-6 or r.top_k == 1:  # SGLang: greedy
            return int(torch.argmax(row))
        scaled = row / r.temperature
        if r.top_k < scaled.shape[0]:
            kth = torch.topk(scaled, r.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        return int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=r.generator))


def gpu_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability as `nvidia-smi` gives it (SGLang asks CUDA), or
    None on a machine without it."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        major, minor = done.stdout.split()[0].split(".")
        return int(major), int(minor)
    except (OSError, IndexError, ValueError, subprocess.TimeoutExpired):
        return None


def resolve_attention(args: argparse.Namespace, capability: tuple[int, int] | None) -> tuple[str | None, bool]:
    """(attention backend, radix cache off) as SGLang resolves them at start-up."""
    backend, radix_off = args.attention_backend, args.disable_radix_cache
    if args.enable_deterministic_inference:
        if backend is None:
            backend = "flashinfer" if capability and capability[0] in FLASHINFER_FALLBACK_MAJORS else "fa3"
        elif backend not in DETERMINISTIC_BACKENDS:
            raise SystemExit(f"ValueError: Currently only {list(DETERMINISTIC_BACKENDS)} attention backends are "
                             f"supported for deterministic inference, but you explicitly specified '{backend}'.")
        radix_off = radix_off or backend not in RADIX_DETERMINISTIC_BACKENDS
    if backend == "fa3" and capability and capability[0] not in (8, 9):
        raise SystemExit(f"AssertionError: {FA3_ASSERTION}")
    return backend, radix_off


def hide_package(name: str) -> None:
    """Make `name` unimportable here, as where it is not installed: no path entry holds it,
    and no finder (an editable install's) finds it."""
    sys.path[:] = [entry for entry in sys.path if not (Path(entry or ".") / name).exists()]
    importlib.invalidate_caches()
    sys.meta_path[:] = [finder for finder in sys.meta_path
                        if getattr(finder, "find_spec", None) is None or _finds(finder, name) is None]


def _finds(finder: Any, name: str) -> Any:
    try:
        return finder.find_spec(name, None)
    except Exception:  # noqa: BLE001 - a finder that cannot answer does not provide it
        return None


class PrefixCache:
    """A radix cache as prefill sees it: the prompts seen, matched by their longest common
    prefix, the least recently used dropped past `capacity` tokens."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.prompts: collections.OrderedDict[tuple[int, ...], None] = collections.OrderedDict()
        self.tokens = 0

    def uncached(self, ids: list[int]) -> int:
        """Tokens of `ids` to prefill; then `ids` is cached."""
        prompt = tuple(ids)
        matched = max((len(os.path.commonprefix([prompt, seen])) for seen in self.prompts), default=0)
        if prompt in self.prompts:
            self.prompts.move_to_end(prompt)
        elif len(prompt) <= self.capacity:
            self.prompts[prompt] = None
            self.tokens += len(prompt)
            while self.tokens > self.capacity:
                self.tokens -= len(self.prompts.popitem(last=False)[0])
        return len(prompt) - matched


class FakeServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.preferred = json.loads(args.preferred_sampling_params) if args.preferred_sampling_params else {}
        self._model: ToyModel | None = None
        self._model_lock = threading.Lock()
        self.lock = threading.Lock()
        self.processors: dict[str, type] = {}
        self.generate_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.processor_calls = 0
        self.max_rows_per_call = 0
        slots = args.fake_max_running
        self.running_slots = threading.BoundedSemaphore(slots) if slots else contextlib.nullcontext()
        # --fake-gather: proof of concurrency that no scheduling delay can fake or hide.
        self.gathering = threading.Barrier(args.fake_gather[1]) if args.fake_gather else None
        self.attention_backend, self.radix_off = resolve_attention(args, gpu_capability())
        self.prefix_cache = PrefixCache(args.fake_prefix_cache)
        self.prefilled_tokens = 0
        self.scheduler = Scheduler(self)

    def model(self) -> ToyModel:
        with self._model_lock:
            if self._model is None:
                self._model = ToyModel(self.args.model_path)
            return self._model

    @property
    def context(self) -> int:
        """Read when first needed: start-up tests run without a model directory."""
        return self.args.context_length or model_context(self.args.model_path)

    def starting(self) -> bool:
        return self.args.fake_never_ready or time.monotonic() - self.started < self.args.fake_start_delay

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"generate_requests": self.generate_requests, "max_in_flight": self.max_in_flight,
                    "processor_strings": len(self.processors), "processor_calls": self.processor_calls,
                    "max_rows_per_call": self.max_rows_per_call, "host": self.args.host,
                    "port": self.args.port, "pid": os.getpid(), "prefilled_tokens": self.prefilled_tokens}

    def count_call(self, rows: int) -> None:
        with self.lock:
            self.processor_calls += 1
            self.max_rows_per_call = max(self.max_rows_per_call, rows)

    def server_info(self) -> dict[str, Any]:
        args = self.args
        max_req_len = self.context - 1
        return {"model_path": args.model_path, "host": args.host, "port": args.port,
                "speculative_algorithm": args.speculative_algorithm,
                "enable_deterministic_inference": args.enable_deterministic_inference,
                "attention_backend": self.attention_backend, "disable_radix_cache": self.radix_off,
                "enable_custom_logit_processor": args.enable_custom_logit_processor,
                "context_length": args.context_length,
                "preferred_sampling_params": args.preferred_sampling_params,
                "max_req_input_len": max_req_len - 5, "max_total_num_tokens": 1 << 20,
                "launch_command": " ".join(sys.argv), "version": "fake", "frontend": "python"}

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.args.model_path,
                "served_model_name": self.args.served_model_name or self.args.model_path,
                "tokenizer_path": self.args.model_path, "is_generation": True,
                "preferred_sampling_params": self.args.preferred_sampling_params}

    def models(self) -> dict[str, Any]:
        name = self.args.served_model_name or self.args.model_path
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "sglang",
                                            "root": name, "max_model_len": self.context}]}

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

    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        """POST /generate: SGLang's contract gate on sampling_params, then the generation."""
        sampling = body.get("sampling_params") or {}
        problem = sampling_error(sampling)
        if problem is not None:
            return 400, {"error": problem}  # the contract gate's shape: a bare string
        text, input_ids = body.get("text"), body.get("input_ids")
        if not (isinstance(input_ids, list) and all(isinstance(i, int) for i in input_ids)):
            if not isinstance(text, str):
                return 400, {"error": {"message": "text or input_ids is required"}}
            input_ids = None
        status, result = self.admit(text, input_ids, sampling, body.get("custom_logit_processor"), body.get("rid"))
        if status != 200:
            return status, {"error": {"message": result}}
        return 200, {"text": result["text"], "output_ids": result["output_ids"], "meta_info": result["meta_info"]}

    def completions(self, body: dict[str, Any]) -> tuple[int, Any]:
        """POST /v1/completions: SGLang's CompletionRequest made into the same generation."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            text, input_ids = prompt, None
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            text, input_ids = None, prompt
        else:  # (lists of prompts are a batch's: this fake serves single requests)
            return 400, completion_error("Prompt cannot be empty" if not prompt else "prompt: a string or token ids")
        if not (isinstance(body.get("max_tokens", 16), int) and body.get("max_tokens", 16) > 0):
            return 400, completion_error("max_tokens must be positive")
        sampling = {name: body.get(field, default) for field, (name, default) in COMPLETION_SAMPLING.items()}
        status, result = self.admit(text, input_ids, sampling, body.get("custom_logit_processor"), body.get("rid"))
        if status != 200:
            return status, completion_error(result)
        meta = result["meta_info"]
        choice: dict[str, Any] = {"index": 0, "text": result["text"], "logprobs": None,
                                  "finish_reason": meta["finish_reason"]["type"],
                                  "matched_stop": meta["finish_reason"].get("matched")}
        if body.get("return_token_ids"):
            choice.update(token_ids=result["output_ids"], prompt_token_ids=result["prompt_token_ids"])
        return 200, {"id": meta["id"], "object": "text_completion", "created": int(time.time()),
                     "model": body.get("model", "default"), "choices": [choice],
                     "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                               "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}}

    def admit(self, text: str | None, input_ids: list[int] | None, sampling: dict[str, Any],
              spec: str | None, rid: str | None) -> tuple[int, Any]:
        """One generation, counted (and crashed on) as it arrives: (200, the result) or
        (status, SGLang's message)."""
        with self.lock:
            self.generate_requests += 1
            arrived = self.generate_requests
            # Under the lock, so that exactly the first request past the limit crashes and
            # names itself last in the log: concurrent ones wait here until the exit.
            self._maybe_crash(arrived)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if spec is not None and not self.args.enable_custom_logit_processor:
                return 400, FLAG_MISSING
            if arrived in self.args.fake_stall:
                time.sleep(STALL)
            self._gather(text, input_ids)
            with self.running_slots:
                time.sleep(self.args.fake_generate_delay)
                return self._generate(text, input_ids, sampling, spec, rid)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _gather(self, text: str | None, input_ids: list[int] | None) -> None:
        if self.gathering is None:
            return
        prompt = text if text is not None else self.model().decode(input_ids or [])
        if self.args.fake_gather[0] in prompt:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.gathering.wait(timeout=STALL)

    def _maybe_crash(self, arrived: int) -> None:
        after, marker = self.args.fake_crash_after, self.args.fake_crash_marker
        if after is None or arrived <= after or (marker is not None and marker.exists()):
            return
        if marker is not None:
            marker.touch()
        print(f"fake crash on request {arrived}", flush=True)
        os._exit(3)

    def _generate(self, text: str | None, input_ids: list[int] | None, sampling: dict[str, Any],
                  spec: str | None, rid: str | None) -> tuple[int, Any]:
        model = self.model()
        ids = input_ids if input_ids is not None else model.encode(text or "")
        merged = {**self.preferred, **sampling}
        max_new = merged.get("max_new_tokens")
        problem = context_error(len(ids), max_new, self.context)
        if problem is not None:
            return 400, problem
        max_new = 128 if max_new is None else max_new
        self._prefill(ids)
        # The scheduler's silent cut: max_req_len = context - 1, minus one more.
        max_new = max(0, min(max_new, (self.context - 1) - len(ids) - 1))
        rid = rid or uuid.uuid4().hex
        params = merged.get("custom_params")
        if spec is not None and isinstance(params, dict):
            params = {**params, "__req__": SGLangRequest(rid, ids)}
        temperature = merged.get("temperature")
        top_k = merged.get("top_k")
        seed = merged.get("sampling_seed")
        generator = model.torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4)))
        request = Running(
            # The toy model's logits follow the prompt's ids, however they were sent.
            rid=rid, key=" ".join(map(str, ids)),
            max_new_tokens=max_new, min_new_tokens=merged.get("min_new_tokens") or 0,
            ignore_eos=bool(merged.get("ignore_eos")), stop_ids=frozenset(merged.get("stop_token_ids") or ()),
            temperature=1.0 if temperature is None else float(temperature),
            top_k=TOP_K_ALL if top_k in (None, -1) else int(top_k),
            processor=spec, params=params, generator=generator)
        if max_new > 0:
            self.scheduler.submit(request)
        else:
            request.finish = {"type": "length", "length": 0}
        matched = isinstance((request.finish or {}).get("matched"), int)
        kept = request.output[:-1] if matched else request.output  # SGLang trims the stop token
        return 200, {
            "text": model.decode([t for t in kept if t != model.eos]),
            "output_ids": request.output, "prompt_token_ids": list(ids),
            "meta_info": {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(request.output),
                          "finish_reason": request.finish},
        }

    def _prefill(self, ids: list[int]) -> None:
        """The prompt's prefill: its tokens past the longest cached prefix, at the cost given
        (none unless --fake-prefill-per-token)."""
        if not self.args.fake_prefill_per_token:
            return
        with self.lock:
            uncached = self.prefix_cache.uncached(ids)
            self.prefilled_tokens += uncached
        time.sleep(uncached * self.args.fake_prefill_per_token)

    def log_request(self, path: str, body: Any) -> None:
        if self.args.fake_request_log is not None:
            with self.lock, self.args.fake_request_log.open("a", encoding="utf-8") as log:
                log.write(json.dumps({"path": path, "body": body}) + "\n")


def make_handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    info_paths = {"all": ("/server_info", "/get_server_info", "/model_info", "/get_model_info"),
                  "old": ("/get_server_info", "/get_model_info"), "none": ()}[server.args.fake_info_endpoints]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like uvicorn
        # As uvicorn does: without it a client that reuses the connection (a router) waits
        # 40 ms on each answer for the delayed ACK.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path
            if path == "/fake_stats":
                self._reply(200, server.stats())
            elif path == "/health_generate" and server.args.fake_no_health_generate:
                self._reply(404, {"detail": "Not Found"})
            elif path in ("/health", "/health_generate"):
                self._reply(503 if server.starting() else 200, None)
            elif path in info_paths:
                self._reply(200, server.server_info() if path.endswith("server_info") else server.model_info())
            elif path == "/v1/models":
                self._reply(200, server.models())
            else:
                self._reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            server.log_request(self.path, body)
            routes = {"/generate": server.generate, "/v1/completions": server.completions}
            if self.path not in routes:
                self._reply(404, {"detail": "Not Found"})
            elif server.starting():
                self._reply(503, {"error": {"message": "server is starting"}})
            else:
                self._reply(*routes[self.path](body))

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
    if args.fake_without_compressor_2:
        hide_package("compressor_2")
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
    server_class.daemon_threads = True
    httpd = server_class((args.host, args.port), make_handler(server))
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
