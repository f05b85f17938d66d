"""The run's thread pools, kept in one place so that `evolve` ends them all on the way out,
whatever the exit. It does so after the reflector has abandoned its calls in flight, so
stopping them waits only for work that ends by itself (a local proposal, an archive write):
no thread of a run outlives `evolve`, and none keeps a finished or interrupted process
waiting for an HTTP timeout."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


class Workers:
    def __init__(self) -> None:
        self._pools: list[ThreadPoolExecutor] = []

    def pool(self, workers: int, name: str) -> ThreadPoolExecutor:
        """A pool of `workers` threads named `name_0`, `name_1`, ..., stopped with the run."""
        pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._pools.append(pool)
        return pool

    def stop(self) -> None:
        """Drops the work not started and waits for the work in progress."""
        for pool in self._pools:
            pool.shutdown(wait=True, cancel_futures=True)
