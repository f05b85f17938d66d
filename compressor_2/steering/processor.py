"""The SGLang custom logit processor: each row's logits + that row's cluster deltas.

SGLang calls `SteeringProcessor()(logits, custom_param_list)` once per decode step for
the rows that sent this processor's string, one `custom_params` entry per row:

    {"deltas": [d0, d1, ...],                   # canonical cluster order
     "token_clusters": "/abs/token_clusters.npy",  # optional: the cluster map
     "fingerprint": "<build fingerprint>"}       # optional: checked against the map

or, instead of the path, "cluster_map": the map itself (`encode_cluster_map`), which
the steering probe sends to tell a server that cannot import this class from one that
cannot read the map's file.

A row without params (None, or a dict without "deltas") gets the class's baked-in
`default_deltas`; a row without "token_clusters" uses the class's embedded
`default_cluster_map`. `generate-processor` bakes both into a standalone copy of this
class; here both are empty, so such rows stay unsteered.

It never raises: an exception inside a processor kills the SGLang server. A row with
bad params is left unchanged and the problem is logged once per server process.

A step costs one gather and one add on the logits' device: each distinct delta list
becomes a small tensor there once, kept in a bounded LRU cache on the class (SGLang
makes a new instance for every batch), so no step builds a Python matrix or copies
from host memory to the GPU (a pageable copy would also stall the host until the GPU
catches up).

The class is self-contained on purpose (imports inside methods, state on the class,
the arithmetic in `apply_bias`), so the same source also works pickled by value:
dill sends the class and what its methods reference, never this module's globals.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor_2.clusters.layout import FINGERPRINT_FILE, UNSTEERED
from compressor_2.steering.bias import apply_bias, gather_index

if TYPE_CHECKING:
    from compressor_2.clusters.clusterset import ClusterSet


class SteeringProcessor:
    """SGLang custom logit processor adding per-cluster deltas (plain class: SGLang
    accepts any callable class, and clients then need only dill, not sglang)."""

    default_deltas: tuple[float, ...] = ()
    # "<torch dtype>:<base64 of zlib of the little-endian id array>", see encode_cluster_map.
    default_cluster_map: str = ""
    fingerprint_file: str = FINGERPRINT_FILE
    unsteered: int = UNSTEERED  # the map's id of a special or added token: bias 0, whatever the deltas
    # Distinct delta lists kept on the device: a few bytes each, far more than one
    # generation of a run sends.
    cache_size: int = 4096
    # Class-level on purpose: SGLang makes a new instance per batch.
    _maps: dict = {}
    # (map, (device, dtype), deltas) -> deltas tensor, or None when all zero; and
    # (map, (device, dtype), None) -> the zeros row a steered batch gives its unsteered rows.
    # LRU order: a zeros row can be evicted too, and is then made again on its next use.
    _rows: dict = {}
    _warned: set = set()

    def __call__(self, logits: Any, custom_param_list: Sequence[Any] | None = None) -> Any:
        try:
            return type(self)._steer(logits, custom_param_list)
        except Exception as exc:  # noqa: BLE001 - an exception here kills the SGLang server
            type(self)._warn_once(f"steering skipped for a batch: {type(exc).__name__}: {exc}")
            return logits

    @classmethod
    def to_str(cls) -> str:
        """The `custom_logit_processor` request field: SGLang's own `to_str` format.

        A class from an importable module goes by reference (the server imports it);
        one defined in `__main__` goes by value (same Python minor version needed).
        `recurse` sends only the globals the methods use, such as `apply_bias`."""
        import dill

        # By value the class attributes travel too: send empty caches, not the
        # tensors this process may have loaded (they reload on first use).
        cls._maps.clear()
        cls._rows.clear()
        return json.dumps({"callable": dill.dumps(cls, recurse=True).hex()})

    @classmethod
    def _warn_once(cls, message: str) -> None:
        if message not in cls._warned:
            cls._warned.add(message)
            import logging

            logging.getLogger("compressor_2.steering").warning("%s (logged once)", message)

    @classmethod
    def _steer(cls, logits: Any, custom_param_list: Sequence[Any] | None) -> Any:
        import torch

        rows = logits.shape[0]
        params_list = [None] * rows if custom_param_list is None else list(custom_param_list)
        if len(params_list) != rows:
            cls._warn_once(f"{len(params_list)} custom_params for {rows} logit rows: batch left unchanged")
            return logits
        groups: dict[Any, dict[int, Any]] = {}
        for row, params in enumerate(params_list):
            plan = cls._row_plan(params)
            if plan is not None:
                groups.setdefault(plan[0], {})[row] = plan[1]
        place = (str(logits.device), logits.dtype)
        for key, row_deltas in groups.items():
            loaded = cls._cluster_map(key, logits.device)
            if loaded is None:
                continue
            clusters, needed = loaded
            steered = {}
            for row, deltas in row_deltas.items():
                vector = cls._deltas_row(key, place, deltas, needed, logits)
                if vector is not None:
                    steered[row] = vector
            if not steered:
                continue  # all zero (or unusable): nothing to add
            zero = cls._zero_row(key, place, needed, logits) if len(steered) < rows else None
            apply_bias(logits, torch.stack([steered.get(row, zero) for row in range(rows)]), clusters)
        return logits

    @classmethod
    def _row_plan(cls, params: Any) -> tuple[Any, Any] | None:
        """(cluster map key, deltas) for one row, or None to leave the row unchanged. The
        deltas themselves are checked once per distinct list, in `_deltas_row`."""
        if params is None:
            params = {}
        if not isinstance(params, dict):
            cls._warn_once(f"custom_params is a {type(params).__name__}, not a dict: row left unchanged")
            return None
        deltas = params.get("deltas", cls.default_deltas)
        if not isinstance(deltas, (list, tuple)):
            cls._warn_once("custom_params['deltas'] is not a list of finite numbers: row left unchanged")
            return None
        if not deltas:
            return None  # none: the unsteered row needs no work
        path = params.get("token_clusters")
        inline = params.get("cluster_map")
        if isinstance(inline, str) and inline:
            key: Any = ("embedded", inline)
        elif path is None:
            key = ("embedded", cls.default_cluster_map)
        elif isinstance(path, str):
            key = ("path", path, str(params.get("fingerprint", "")))
        else:
            cls._warn_once("custom_params['token_clusters'] is not a path string: row left unchanged")
            return None
        return key, deltas

    @classmethod
    def _deltas_row(cls, key: Any, place: tuple, deltas: Any, needed: int, logits: Any) -> Any:
        """The row's first `needed` deltas as a tensor on the logits' device and dtype, made
        once per distinct list and kept in the class's LRU cache; None for a row that adds
        nothing (all zero) or cannot be used (logged once, and not cached)."""
        rows = cls._rows
        try:
            cache_key = (key, place, tuple(deltas))
            vector = rows.pop(cache_key, rows)  # `rows` itself marks a miss
        except TypeError:  # a list holding lists or dicts: unhashable
            cls._warn_once("custom_params['deltas'] is not a list of finite numbers: row left unchanged")
            return None
        if vector is rows:
            vector = cls._new_deltas_row(cache_key[2], needed, logits)
            if vector is False:
                return None
            while len(rows) >= cls.cache_size:
                del rows[next(iter(rows))]  # the least recently used
        rows[cache_key] = vector  # (re)inserted last: the most recently used
        return vector

    @classmethod
    def _new_deltas_row(cls, deltas: tuple, needed: int, logits: Any) -> Any:
        """A cache entry: the tensor, None (all zero), or False (unusable)."""
        import torch

        if not all(isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) for d in deltas):
            cls._warn_once("custom_params['deltas'] is not a list of finite numbers: row left unchanged")
            return False
        if len(deltas) < needed:
            cls._warn_once(f"{len(deltas)} deltas for a cluster map with {needed} clusters: row left unchanged")
            return False
        if not any(deltas):
            return None
        # This list's one host-to-device copy; deltas past `needed` name no cluster of the map.
        return torch.tensor([float(d) for d in deltas[:needed]], dtype=logits.dtype, device=logits.device)

    @classmethod
    def _zero_row(cls, key: Any, place: tuple, needed: int, logits: Any) -> Any:
        """The row an unsteered row of a steered batch adds, made on the device itself once
        per map and place and kept in `_rows` under the deltas None."""
        import torch

        zero_key = (key, place, None)
        zero = cls._rows.get(zero_key)
        if zero is None:
            zero = cls._rows[zero_key] = torch.zeros(needed, dtype=logits.dtype, device=logits.device)
        return zero

    @classmethod
    def _cluster_map(cls, key: Any, device: Any) -> tuple[Any, int] | None:
        """(the map's gather index on `device`, number of clusters it uses), loaded once per
        process; None when unusable. The count is kept so no step pays a device sync for it."""
        cache_key = (key, str(device))
        if cache_key not in cls._maps:
            try:
                clusters = cls._load_map(key)
                needed = int(clusters.max()) + 1 if clusters is not None and clusters.numel() else 0
                cls._maps[cache_key] = None if clusters is None else (
                    gather_index(clusters, needed).to(device), needed)
            except Exception as exc:  # noqa: BLE001 - see __call__
                name = "embedded in the class" if key[0] == "embedded" else key[1]
                cls._warn_once(f"cannot load the cluster map {name}: {type(exc).__name__}: {exc}")
                cls._maps[cache_key] = None
        return cls._maps[cache_key]

    @classmethod
    def _load_map(cls, key: Any) -> Any:
        import torch

        if key[0] == "embedded":
            if not key[1]:
                cls._warn_once("no cluster map: the row has no 'token_clusters' and the class embeds none")
                return None
            dtype, _, payload = key[1].partition(":")
            raw = bytearray(zlib.decompress(base64.b64decode(payload)))
            clusters = torch.frombuffer(raw, dtype=getattr(torch, dtype)).long()
        else:
            import os

            import numpy

            _, path, fingerprint = key
            if fingerprint:
                record_path = os.path.join(os.path.dirname(path), cls.fingerprint_file)
                with open(record_path, encoding="utf-8") as handle:
                    built = json.load(handle).get("fingerprint")
                if built != fingerprint:
                    # Rebuilt since the client read it: these deltas mean other clusters.
                    raise ValueError(f"{path} now holds clusters {built!r}, not {fingerprint!r}")
            array = numpy.load(path, allow_pickle=False)
            if array.ndim != 1 or array.dtype.kind not in "iu":
                raise ValueError(f"{path} is not a 1-D integer array")
            clusters = torch.from_numpy(array.astype("int64"))
        if clusters.numel() and int(clusters.min()) < cls.unsteered:
            raise ValueError(f"cluster id below {cls.unsteered} in the cluster map")
        return clusters


def encode_cluster_map(token_clusters: np.ndarray) -> str:
    """`SteeringProcessor.default_cluster_map` for an int array: the smallest signed integer
    dtype (unsteered tokens are -1), zlib, base64 (a 152k-token map with 12 clusters is
    ~100 kB of text)."""
    top = int(token_clusters.max(initial=0))
    dtype = "int8" if top < 2**7 else "int16" if top < 2**15 else "int32"
    raw = np.ascontiguousarray(token_clusters, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    return f"{dtype}:{base64.b64encode(zlib.compress(raw, 9)).decode('ascii')}"


def processor_spec() -> str:
    """The `custom_logit_processor` string for a server that can import compressor_2
    (the CLI starts its server in this environment): the class by reference, ~150 bytes."""
    return SteeringProcessor.to_str()


def steer(logits: Any, custom_param_list: Sequence[Any] | None = None) -> Any:
    """`SteeringProcessor()(logits, custom_param_list)`: what the string of
    `steering.guarded.guarded_spec` loads to on a server that can import compressor_2."""
    return SteeringProcessor()(logits, custom_param_list)


def custom_params(deltas: Sequence[float], clusters: ClusterSet) -> dict[str, Any]:
    """One request's `sampling_params.custom_params` for `processor_spec()`."""
    if len(deltas) != len(clusters.cluster_ids):
        raise ValueError(f"{len(deltas)} deltas for {len(clusters.cluster_ids)} clusters")
    return {
        "deltas": [float(d) for d in deltas],
        "token_clusters": str(clusters.token_clusters_path),
        "fingerprint": clusters.fingerprint,
    }
