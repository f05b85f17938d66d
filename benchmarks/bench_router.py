"""Several GPUs: throughput through SGLang's router, and through the client's own round
robin over the same workers, with 1, 2 and 4 workers, side by side in one run.

Each fake worker (tests/fakes/sglang_server.py) takes WORK seconds per request and serves
at most SLOTS at once, as a GPU server with a full batch does; the same batch of BATCH
requests goes through the real sglang-router (round robin) with the engine's
/v1/completions path, and through the engine attached to the worker URLs itself
(CONFIG_SGLANG_URLS round robin, /generate). Ratios are against 1 worker on the same path.
Target through the router: >= 1.8x with 2 workers and >= 3.4x with 4 (the ideal is 2x and
4x).

The parameters measure the router, not this machine: at most 4 x SLOTS / WORK = 40
requests a second, each a few milliseconds of CPU for the client, the router and the
fake, so the 2 shared cores stay mostly idle. (At 8 slots and 50 ms a request, 160
requests a second per worker, 4 workers are CPU-bound here and reach only ~3.3x.)
sglang-router is installed from the package registry into the cache, as the tests do;
without a registry this benchmark says so and exits 0.

Run: .venv/bin/python benchmarks/bench_router.py
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import AutoTokenizer  # noqa: E402

from compressor_2.engines.base import GenerationRequest  # noqa: E402
from compressor_2.engines.chat import chat_prompt  # noqa: E402
from compressor_2.engines.sglang_engine import SGLangEngine  # noqa: E402
from tests.sglang_helpers import probe_clusters  # noqa: E402
from tests.sglang_router import ROUTER_VERSION, RouterUnavailable, fake_workers, router, router_python  # noqa: E402

MODEL = REPO / "compressor_2" / "demo" / "model"
WORK = 0.2  # seconds a worker takes per request
SLOTS = 2  # requests a worker serves at once
BATCH = 64  # requests per measurement: whole waves of 1, 2 and 4 workers' slots
IN_FLIGHT = 16  # the client's CONFIG_EVAL_CONCURRENCY: more than 4 workers' slots
MAX_NEW_TOKENS = 4
REPEATS = 2  # the best of these, each path measured in turn
WORKERS = (1, 2, 4)


def engine(urls: list[str], clusters, tokenize, api: str) -> SGLangEngine:
    return SGLangEngine(urls, clusters, tokenize, temperature=0.0, max_new_tokens=MAX_NEW_TOKENS,
                        concurrency=IN_FLIGHT, request_timeout=120.0, api=api)


def throughput(client: SGLangEngine, batch: list[GenerationRequest]) -> float:
    start = time.perf_counter()
    answers = client.generate(batch)
    elapsed = time.perf_counter() - start
    assert len(answers) == len(batch)
    return len(batch) / elapsed


def main() -> int:
    try:
        python = router_python()
    except RouterUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    tokenize = functools.partial(chat_prompt, tokenizer)
    batch = [GenerationRequest(f"Question {i}: what was revenue?", (0.0, 0.0, 0.0)) for i in range(BATCH)]
    print(f"sglang-router {ROUTER_VERSION} (round robin) and the client's own round robin; fake workers taking "
          f"{WORK:g} s per request, {SLOTS} at once; {BATCH} requests, {IN_FLIGHT} in flight; best of {REPEATS}")
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        clusters = probe_clusters(MODEL, folder)
        for count in WORKERS:
            flags = ("--fake-generate-delay", str(WORK), "--fake-max-running", str(SLOTS))
            with fake_workers(MODEL, count, folder / f"workers{count}", *flags) as workers:
                urls = [w.url for w in workers]
                with router(python, urls, folder / f"router{count}.log") as url:
                    paths = {"router": engine([url], clusters, tokenize, "completions"),
                             "client": engine(urls, clusters, tokenize, "generate")}
                    paths["client"].generate(batch[: count * SLOTS])  # every worker loads its toy model
                    best = {name: 0.0 for name in paths}
                    for _ in range(REPEATS):
                        for name, client in paths.items():
                            best[name] = max(best[name], throughput(client, batch))
                    results[count] = best
            print(f"  {count} worker(s): router {best['router']:6.1f} req/s, client round robin "
                  f"{best['client']:6.1f} req/s", flush=True)
    print(f"\n  {'workers':>7}  {'router req/s':>14}   {'client round robin':>18}")
    for count in WORKERS:
        ratios = {name: results[count][name] / results[1][name] for name in ("router", "client")}
        print(f"  {count:>7}  {results[count]['router']:7.1f} {ratios['router']:5.2f}x   "
              f"{results[count]['client']:11.1f} {ratios['client']:5.2f}x")
    two, four = (results[n]["router"] / results[1]["router"] for n in (2, 4))
    print(f"  RATIO through the router: 2 workers {two:.2f}x (target >= 1.8x), 4 workers {four:.2f}x "
          "(target >= 3.4x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
