"""Several GPUs: throughput through SGLang's router, and through the client's own round
robin over the same workers, with 1, 2 and 4 workers, side by side in one run; then the
router's round_robin policy against its cache_aware policy on workers that model prefill.

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
Prefix affinity: every genome of a run asks the same training prompts, so where a prompt
goes decides how often it is prefilled. Each fake worker now also spends PREFILL seconds
per prompt token its prefix cache does not hold, and caches CACHE_PROMPTS prompts' worth
of tokens (least recently used dropped): GENOMES genomes x QUESTIONS long prompts go
through the router with `--policy round_robin` and with `--policy cache_aware`, fresh
workers each, and the prompt tokens the workers prefilled and the throughput are printed
side by side. Round robin sends every prompt to every worker in turn, which must each
prefill it (and, with more prompts than its cache holds, again every time); cache_aware
sends a prompt to the worker that holds its prefix.

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

from compressor_2.engines import GenerationRequest  # noqa: E402
from compressor_2.engines.chat import chat_prompt  # noqa: E402
from compressor_2.engines.sglang.engine import SGLangEngine  # noqa: E402
from tests.sglang_helpers import fake_stats, probe_clusters  # noqa: E402
from tests.sglang_router import ROUTER_VERSION, RouterUnavailable, fake_workers, router, router_python  # noqa: E402

MODEL = REPO / "compressor_2" / "demo" / "model"
WORK = 0.2  # seconds a worker takes per request
SLOTS = 2  # requests a worker serves at once
BATCH = 64  # requests per measurement: whole waves of 1, 2 and 4 workers' slots
IN_FLIGHT = 16  # the client's CONFIG_EVAL_CONCURRENCY: more than 4 workers' slots
MAX_NEW_TOKENS = 4
REPEATS = 2  # the best of these, each path measured in turn
WORKERS = (1, 2, 4)
# Prefix affinity: 4 workers, 15 questions of ~400 prompt tokens each, 6 genomes. 15, not 16: with
# a pool a multiple of the workers, round robin over an orderly stream would send each prompt to
# the same worker every time by accident.
AFFINITY_WORKERS = 4
QUESTIONS = 15
GENOMES = 6
PREFILL = 0.001  # seconds per uncached prompt token: a 400-token prompt costs 0.4 s
DECODE = 0.1  # seconds per request besides its prefill
AFFINITY_SLOTS = 4
CACHE_PROMPTS = 6  # prompts a worker's prefix cache holds: fewer than QUESTIONS, more than QUESTIONS / workers
POLICIES = ("round_robin", "cache_aware")


def engine(urls: list[str], clusters, tokenize, api: str) -> SGLangEngine:
    return SGLangEngine(urls, clusters, tokenize, temperature=0.0, max_new_tokens=MAX_NEW_TOKENS,
                        concurrency=IN_FLIGHT, request_timeout=120.0, api=api)


def throughput(client: SGLangEngine, batch: list[GenerationRequest]) -> float:
    start = time.perf_counter()
    answers = client.generate(batch)
    elapsed = time.perf_counter() - start
    assert len(answers) == len(batch)
    return len(batch) / elapsed


def question(i: int) -> str:
    """A long, FinanceBench-like prompt of its own: evidence, then the question."""
    lines = [f"Company {i}, fiscal year {2000 + i}: segment {j} revenue was ${i * 37 + j * 11},{j}00 million, "
             f"up {i + j}.{j}% from the prior year." for j in range(8)]
    return "\n".join(lines) + f"\nQuestion {i}: what was total revenue?"


def affinity(python: Path, clusters, tokenize, folder: Path) -> dict[str, dict[str, float]]:
    """Per policy: prompt tokens prefilled, and requests a second, for GENOMES x QUESTIONS."""
    prompts = [question(i) for i in range(QUESTIONS)]
    tokens = [len(tokenize(prompt).ids) for prompt in prompts]
    capacity = CACHE_PROMPTS * max(tokens)
    batch = [GenerationRequest(prompt, (0.1 * genome, 0.0, 0.0)) for genome in range(GENOMES) for prompt in prompts]
    flags = ("--fake-generate-delay", str(DECODE), "--fake-max-running", str(AFFINITY_SLOTS),
             "--fake-prefill-per-token", str(PREFILL), "--fake-prefix-cache", str(capacity))
    print(f"\nprefix affinity: {AFFINITY_WORKERS} fake workers, {PREFILL * 1000:g} ms per uncached prompt token, "
          f"{DECODE:g} s per request besides, {AFFINITY_SLOTS} at once, a prefix cache of {capacity:,} tokens "
          f"({CACHE_PROMPTS} prompts) each; {GENOMES} genomes x {QUESTIONS} prompts of {min(tokens)}-{max(tokens)} "
          f"tokens ({sum(tokens) * GENOMES:,} prompt tokens in all), {IN_FLIGHT} in flight")
    found = {}
    for policy in POLICIES:
        with fake_workers(MODEL, AFFINITY_WORKERS, folder / policy, *flags) as workers:
            urls = [w.url for w in workers]
            with router(python, urls, folder / f"router-{policy}.log", policy=policy) as url:
                # Every worker loads its toy model (seconds) before the clock starts.
                engine(urls, clusters, tokenize, "generate").generate([GenerationRequest("warm", (0.0, 0.0, 0.0))]
                                                                     * AFFINITY_WORKERS)
                client = engine([url], clusters, tokenize, "completions")
                before = sum(fake_stats(u)["prefilled_tokens"] for u in urls)
                rate = throughput(client, batch)
                prefilled = sum(fake_stats(u)["prefilled_tokens"] for u in urls) - before
        found[policy] = {"prefilled": prefilled, "rate": rate}
        print(f"  {policy:<12} {prefilled:8,} prompt tokens prefilled  {rate:6.1f} req/s", flush=True)
    return found


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
    with tempfile.TemporaryDirectory() as scratch:
        found = affinity(python, probe_clusters(MODEL, Path(scratch)), tokenize, Path(scratch))
    rr, ca = found["round_robin"], found["cache_aware"]
    print(f"\n  {'policy':<12} {'prompt tokens prefilled':>24} {'req/s':>8}")
    for policy in POLICIES:
        print(f"  {policy:<12} {found[policy]['prefilled']:>24,} {found[policy]['rate']:>8.1f}")
    print(f"  RATIO cache_aware against round_robin: {rr['prefilled'] / max(ca['prefilled'], 1):.2f}x fewer prompt "
          f"tokens prefilled, {ca['rate'] / rr['rate']:.2f}x the throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
