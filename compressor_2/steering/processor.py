"""The SGLang custom logit processor: each row's logits + that row's cluster deltas.

SGLang calls `SteeringProcessor()(logits, custom_param_list)` once per decode step for
the rows that sent this processor's string, one `custom_params` entry per row:

    {"deltas": [d0, d1, ...],                   # canonical cluster order
     "token_clusters": "/abs/token_clusters.npy",  # optional: the cluster map
     "fingerprint": "<build digest>"}            # optional: checked against the map's record

or, instead of the path, "cluster_map": the map itself (`encode_cluster_map`), which
the steering probe sends to tell a server that cannot import this class from one that
cannot read the map's file.

A row without params (None, or a dict without "deltas") gets the class's baked-in
`default_deltas`; a row without "token_clusters" uses the class's embedded
`default_cluster_map`. `generate-processor` bakes both into a standalone copy of this
class; here both are empty, so such rows stay unsteered.

It never raises: an exception inside a processor kills the SGLang server. A row with
bad params is left unchanged and the problem is logged once per server process.

Once a batch's rows are known, a step costs one gather and one add on the logits'
device (`add_bias`) and no host-GPU synchronisation. SGLang hands over the same
custom_params objects at every step of a batch (it makes each request's dict once, on
arrival, and never changes it), so the batch's (rows, clusters + 1) table of deltas is
made once and kept, keyed by the identity of each row's params: a step's Python work
is that key and one dict look-up, with no per-row loop and no tensor made from a list.
Whatever is kept under a params' identity holds the params too, so no new object can
take that identity while it is kept. When a request joins or leaves, the new batch's
table is stacked from rows already on the device: each request's params are checked
once (kept by identity, as above), and each distinct delta list is copied to the device
once (from pinned memory, without waiting for the GPU) and kept in a bounded LRU cache.
The caches live on the class: SGLang makes a new instance for every batch.

Deltas by answer phase: a row whose params say "phases": P (2 or 3) sends P * clusters
deltas, phase-major, and "token_classes", each token's class (`encode_cluster_map` of
`phases.token_classes`); the standalone copy bakes `default_phases` and
`default_token_classes`. Its phase is the DFA of `steering/phases.py` over the tokens it
has generated, which SGLang holds on the host in the `Req` it adds to dict params as
"__req__" (`output_ids`). Each request's DFA state and the count of output ids it has read
are kept by the params' identity, so a step advances it by the new ids only. The batch's
table then holds one row per request and DFA state; a step builds the rows' index into it
on the host, copies it to the device from pinned memory without waiting, and selects each
row's row with one gather before the add. A batch without a phased row takes the one-phase
step above, unchanged.

The class is self-contained on purpose (imports inside methods, state on the class,
the arithmetic in `add_bias`), so the same source also works pickled by value:
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

# The class reads the build record's file name as FINGERPRINT_FILE: a generated processor,
# which embeds the class's source, defines it under that name.
from compressor_2.clusters.layout import BUILD_RECORD_FILE as FINGERPRINT_FILE
from compressor_2.clusters.layout import UNSTEERED
from compressor_2.steering.bias import add_bias, gather_index
from compressor_2.steering.phases import STATE_PHASES, TRANSITIONS

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
    default_phases: int = 1
    # `encode_cluster_map` of each token's class (steering/phases.py), for phased rows.
    default_token_classes: str = ""
    transitions: tuple = TRANSITIONS  # [DFA state][token class] -> next state
    state_phases: tuple = STATE_PHASES  # [phases - 1][DFA state] -> phase
    # Distinct delta lists kept on the device, and requests' params kept by identity: a
    # few bytes each, far more than one generation of a run sends.
    cache_size: int = 4096
    # Batches kept: a running batch is a new one whenever a request joins or leaves, and
    # SGLang makes one call per processor string a step (prefill and decode batches too).
    batch_cache_size: int = 32
    # Class-level on purpose: SGLang makes a new instance per batch.
    _maps: dict = {}
    # (map, (device, dtype), deltas) -> the deltas and a 0 (the column unsteered tokens
    # read) as a tensor, or None when all zero; and (map, (device, dtype), None) -> the
    # zeros row a steered batch gives its unsteered rows. LRU order: a zeros row can be
    # evicted too, and is then made again on its next use.
    _rows: dict = {}
    # (class, (device, dtype)) -> {id of a row's params -> (map, deltas row or None, the
    # params)}: what a batch that a request joins needs of the rows it had already seen.
    # Insertion order; at most cache_size entries each.
    _known: dict = {}
    # (class, device, dtype, shape, id of each row's params) -> (those params, the batch's
    # (table, index) pairs, one per cluster map its rows use). Insertion order: a look-up
    # that also moved the entry would hash the key twice a step.
    _batches: dict = {}
    # encoded token classes -> their bytes (one class a token id).
    _classes: dict = {}
    # id of a phased row's params -> (those params, [DFA state, output ids read]). Insertion
    # order; at most cache_size entries (one dropped is read again from its Req).
    _states: dict = {}
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
        `recurse` sends only the globals the methods use, such as `add_bias`."""
        import dill

        # By value the class attributes travel too: send empty caches, not the
        # tensors this process may have loaded (they reload on first use).
        cls._maps.clear()
        cls._rows.clear()
        cls._known.clear()
        cls._batches.clear()
        cls._classes.clear()
        cls._states.clear()
        return json.dumps({"callable": dill.dumps(cls, recurse=True).hex()})

    @classmethod
    def _warn_once(cls, message: str) -> None:
        if message not in cls._warned:
            cls._warned.add(message)
            import logging

            logging.getLogger("compressor_2.steering").warning("%s (logged once)", message)

    @classmethod
    def _steer(cls, logits: Any, custom_param_list: Sequence[Any] | None) -> Any:
        params = (None,) * logits.shape[0] if custom_param_list is None else custom_param_list
        key = (cls, logits.device, logits.dtype, logits.shape, tuple(map(id, params)))
        batches = cls._batches
        batch = batches.get(key)
        if batch is None:
            batch = cls._new_batch(logits, tuple(params))
            while len(batches) >= cls.batch_cache_size:
                del batches[next(iter(batches))]  # the oldest, even if still running: made again once
            batches[key] = batch
        if batch[2]:
            rows = cls._phase_index(batch[2], logits)
            for table, index in batch[1]:
                add_bias(logits, table.index_select(0, rows), index)
            return logits
        for table, index in batch[1]:
            add_bias(logits, table, index)
        return logits

    @classmethod
    def _phase_index(cls, phased: tuple, logits: Any) -> Any:
        """Each row's row of the batch's table (row * states + its DFA state), on the logits'
        device: the phased rows' states advanced by the output ids their Req gained since the
        last step, on the host, then one copy from pinned memory that the host does not wait for."""
        import torch

        transitions = cls.transitions
        index = list(phased[0])
        for row, req, classes, entry in phased[1:]:
            output = req.output_ids
            state, seen, count = entry[0], entry[1], len(output)
            if count == seen + 1:  # a decode step: one new token
                token = output[seen]
                state = transitions[state][classes[token] if 0 <= token < len(classes) else 0]
            else:
                if count < seen:  # SGLang dropped the answer (a retraction): read it again
                    state, seen = 0, 0
                for token in output[seen:count]:
                    state = transitions[state][classes[token] if 0 <= token < len(classes) else 0]
            entry[0], entry[1] = state, count
            index[row] += state
        return torch.tensor(index, dtype=torch.long, pin_memory=logits.is_cuda).to(logits.device, non_blocking=True)

    @classmethod
    def _new_batch(cls, logits: Any, params: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple]:
        """(params, one (table, index) per cluster map the rows use, phased): what `add_bias`
        adds at every step of this batch. Holding `params` keeps their ids out of reuse. Rows
        seen in an earlier batch cost a look-up by id, not their params' checks again.
        `phased` is empty unless a row has phases; then it holds each row's first row of the
        tables (one row per DFA state) and (row, Req, token classes, DFA state) per phased row."""
        import torch

        rows, width = logits.shape
        if len(params) != rows:
            cls._warn_once(f"{len(params)} custom_params for {rows} logit rows: batch left unchanged")
            return params, (), ()
        place = (str(logits.device), logits.dtype)
        known = cls._known.setdefault((cls, place), {})
        found = list(map(known.get, map(id, params)))
        for row in [row for row, entry in enumerate(found) if entry is None]:
            found[row] = cls._know(known, params[row], place, logits)
        states = len(cls.transitions)
        phased = tuple((row, params[row]["__req__"], classes, cls._state(params[row]))
                       for row, (_, vector, _, classes) in enumerate(found) if classes is not None and vector is not None)
        adds = []
        # The maps the steered rows use, in the rows' order (a set's would vary with the hash seed).
        for key in dict.fromkeys(key for key, vector, _, _ in found if vector is not None):
            index, needed = cls._cluster_map(key, logits.device)
            vectors = [vector if k == key else None for k, vector, _, _ in found]
            if any(vector is None for vector in vectors):
                zero = cls._zero_row(key, place, needed, logits)
                vectors = [zero if vector is None else vector for vector in vectors]
            if phased:  # every row one row per state: a one-phase row's repeated
                vectors = [v.expand(states, -1) for v in vectors]
                adds.append((torch.stack(vectors).reshape(rows * states, needed + 1), index[:width]))
            else:
                adds.append((torch.stack(vectors), index[:width]))
        return params, tuple(adds), ((tuple(range(0, rows * states, states)),) + phased if phased else ())

    @classmethod
    def _state(cls, params: Any) -> list[int]:
        """The request's [DFA state, output ids read], kept by its params' identity (with the
        params, so no new request takes that identity while it is kept); one dropped from
        the bounded cache is read again from the start by the next batch that needs it."""
        states = cls._states
        if id(params) not in states:
            while len(states) >= cls.cache_size:
                del states[next(iter(states))]  # the oldest
            states[id(params)] = (params, [0, 0])
        return states[id(params)][1]

    @classmethod
    def _know(cls, known: dict, params: Any, place: tuple, logits: Any) -> tuple[Any, Any, Any, Any]:
        """(map key, deltas row, params, token classes) for one row, kept in `known` under the
        params' id; the row is None where it adds nothing (no deltas, all zero, or unusable),
        and a (states, clusters + 1) table with phases, whose row also has its token classes."""
        entry: tuple[Any, Any, Any, Any] = (None, None, params, None)
        plan = cls._row_plan(params)
        if plan is not None:
            loaded = cls._cluster_map(plan[0], logits.device)
            phases, classes = plan[2]
            if loaded is not None and (phases == 1 or classes is not None):
                vector = cls._deltas_row(plan[0], place, plan[1], loaded[1], logits, phases)
                entry = (plan[0], vector, params, classes)
        while len(known) >= cls.cache_size:
            del known[next(iter(known))]  # the oldest: a request still running is looked at again
        known[id(params)] = entry
        return entry

    @classmethod
    def _row_plan(cls, params: Any) -> tuple[Any, Any, tuple[int, Any]] | None:
        """(cluster map key, deltas, (phases, token classes or None)) for one row, or None to
        leave the row unchanged. The deltas themselves are checked once per distinct list, in
        `_deltas_row`."""
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
        phases = params.get("phases", cls.default_phases)
        if phases == 1:
            return key, deltas, (1, None)
        if phases not in (2, 3) or isinstance(phases, bool):
            cls._warn_once(f"custom_params['phases'] is {phases!r}, not 1, 2 or 3: row left unchanged")
            return None
        if "__req__" not in params:
            # SGLang adds its Req (the answer so far) only to a request whose custom_params is a dict.
            cls._warn_once("a phased row without SGLang's '__req__' (send custom_params, {} at least): "
                           "row left unchanged")
            return None
        return key, deltas, (phases, cls._token_classes(params.get("token_classes", cls.default_token_classes)))

    @classmethod
    def _token_classes(cls, encoded: Any) -> Any:
        """The bytes of each token's class (`encode_cluster_map` of `phases.token_classes`),
        decoded once per process; None (logged once) when missing or unusable."""
        classes = cls._classes.get(encoded) if isinstance(encoded, str) else None
        if classes is None:
            try:
                dtype, _, payload = encoded.partition(":")
                classes = zlib.decompress(base64.b64decode(payload)) if dtype == "int8" else None
            except Exception:  # noqa: BLE001 - see __call__
                classes = None
            if not classes or max(classes) >= len(cls.transitions[0]):
                cls._warn_once("a phased row without usable 'token_classes': row left unchanged")
                return None
            cls._classes[encoded] = classes
        return classes

    @classmethod
    def _deltas_row(cls, key: Any, place: tuple, deltas: Any, needed: int, logits: Any, phases: int = 1) -> Any:
        """The row's first `needed` deltas and a 0 as a tensor on the logits' device and dtype
        (with phases, one such row per DFA state), made once per distinct list and kept in the
        class's LRU cache; None for a row that adds nothing (all zero) or cannot be used
        (logged once, and not cached)."""
        rows = cls._rows
        try:
            cache_key = (key, place, tuple(deltas)) if phases == 1 else (key, place, phases, tuple(deltas))
            vector = rows.pop(cache_key, rows)  # `rows` itself marks a miss
        except TypeError:  # a list holding lists or dicts: unhashable
            cls._warn_once("custom_params['deltas'] is not a list of finite numbers: row left unchanged")
            return None
        if vector is rows:
            vector = cls._new_deltas_row(cache_key[-1], needed, logits, phases)
            if vector is False:
                return None
            while len(rows) >= cls.cache_size:
                del rows[next(iter(rows))]  # the least recently used
        rows[cache_key] = vector  # (re)inserted last: the most recently used
        return vector

    @classmethod
    def _new_deltas_row(cls, deltas: tuple, needed: int, logits: Any, phases: int = 1) -> Any:
        """A cache entry: the tensor, None (all zero), or False (unusable)."""
        import torch

        if not all(isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) for d in deltas):
            cls._warn_once("custom_params['deltas'] is not a list of finite numbers: row left unchanged")
            return False
        if len(deltas) < needed * phases or len(deltas) % phases:
            cls._warn_once(f"{len(deltas)} deltas for a cluster map with {needed} clusters"
                           + (f" in {phases} phases" if phases > 1 else "") + ": row left unchanged")
            return False
        if not any(deltas):
            return None
        # This list's one host-to-device copy, from pinned memory so the host need not wait
        # for the GPU; deltas past `needed` (of each phase) name no cluster of the map.
        if phases > 1:
            size = len(deltas) // phases
            values: Any = [[float(d) for d in deltas[p * size:p * size + needed]] + [0.0]
                           for p in cls.state_phases[phases - 1]]
        else:
            values = [float(d) for d in deltas[:needed]] + [0.0]
        row = torch.tensor(values, dtype=logits.dtype, pin_memory=logits.is_cuda)
        return row.to(logits.device, non_blocking=True)

    @classmethod
    def _zero_row(cls, key: Any, place: tuple, needed: int, logits: Any) -> Any:
        """The row an unsteered row of a steered batch adds, made on the device itself once
        per map and place and kept in `_rows` under the deltas None."""
        import torch

        zero_key = (key, place, None)
        zero = cls._rows.get(zero_key)
        if zero is None:
            zero = cls._rows[zero_key] = torch.zeros(needed + 1, dtype=logits.dtype, device=logits.device)
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
                if clusters is None:
                    cls._maps[cache_key] = None
                else:
                    index = gather_index(clusters, needed)
                    index = index.pin_memory() if device.type == "cuda" else index
                    cls._maps[cache_key] = (index.to(device, non_blocking=True), needed)
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


def custom_params(deltas: Sequence[float], clusters: ClusterSet, phases: int = 1,
                  token_classes: str = "") -> dict[str, Any]:
    """One request's `sampling_params.custom_params` for `processor_spec()`; with phases,
    `token_classes` is `encode_cluster_map` of the vocabulary's `phases.token_classes`."""
    if len(deltas) != phases * len(clusters.cluster_ids):
        raise ValueError(f"{len(deltas)} deltas for {len(clusters.cluster_ids)} clusters"
                         + (f" in {phases} phases" if phases > 1 else ""))
    params: dict[str, Any] = {
        "deltas": [float(d) for d in deltas],
        "token_clusters": str(clusters.token_clusters_path),
        "fingerprint": clusters.build_digest,
    }
    if phases > 1:
        params.update(phases=phases, token_classes=token_classes)
    return params
