"""CONFIG_MODEL_PATH as transformers loads it: a model directory or hub id as it is, or one
GGUF file, whose tokenizer, config and weights all come from that file.

A GGUF is recognised as SGLang 0.5.23 recognises one (a file named `*.gguf`, or any file
that starts with the GGUF magic), so that a run and a server given the same path read the
same model: transformers gets the file's folder and `gguf_file=<its name>`, and
dequantises the weights to floats as it loads them.

Before transformers reads a GGUF its header is read with the `gguf` package: a file
holding tensors of a type the package cannot dequantise (transformers' GGUF loader
dequantises every tensor with it) is refused there; anything transformers itself then
refuses (an architecture it has no GGUF mapping for) is refused in the same one line,
which names the file's architecture and quantisation.

A model's weights are checked against the architecture its config or header names before
any work (`model_context`: the tensors' names and shapes from the files' headers, no weight
read), and again as transformers loads them: a tensor missing, unexpected or of another
shape would be filled with random numbers, another model in every process.

Reading a GGUF costs seconds whatever the model's size (its metadata arrays are parsed
whole: 2.7 s of CPU for SmolLM2-135M's 49k-token vocabulary, and transformers' conversion
of that tokenizer 4 s more), so a process reads each file's header and tokenizer once:
both are kept, keyed by the file's path, size and modification time.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from compressor_2.common import ConfigError, file_kind

if TYPE_CHECKING:
    from transformers import PreTrainedModel

T = TypeVar("T")

GGUF_MAGIC = b"GGUF"
# The header's end-of-generation ids, which llama.cpp stops at: end of text, of a turn, of a message.
_END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@dataclass(frozen=True)
class GgufHeader:
    architecture: str  # general.architecture: llama, qwen2, ...
    quantisation: str  # the file type (Q4_1, Q4_K_M, F16), else its weights' commonest tensor type
    undequantisable: tuple[str, ...]  # tensor types the gguf package cannot turn back into floats
    end_ids: tuple[int, ...]  # eos, and eot / eom where the header names them
    tensors: frozenset[str]  # the names of the tensors it holds


def gguf_file(model_path: str | Path) -> Path | None:
    """The GGUF file `model_path` names; None for a directory or a hub id."""
    path = Path(model_path)
    if not path.is_file():
        return None
    if path.suffix == ".gguf":
        return path
    try:
        with path.open("rb") as handle:
            return path if handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC else None
    except OSError:
        return None


# A model folder holds at least one of these (a tokenizer alone serves an SGLang run's clusters).
_FOLDER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def check_model_path(model_path: str) -> None:
    """What can be said of CONFIG_MODEL_PATH without loading anything, in one line: a
    symbolic link that loops or leads nowhere, a file that is no GGUF or whose header the
    gguf package cannot read (or whose tensors it cannot dequantise), a folder holding no
    model, or a config.json that is no JSON object. Where nothing stands the path is left to
    the loaders: a hub id, or the link `make run-real` makes."""
    path = Path(model_path)
    shown = f"CONFIG_MODEL_PATH={model_path!r}"
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{shown} is a symbolic-link loop: point it at the model itself") from None
        if path.is_symlink():
            raise ConfigError(f"{shown} is a symbolic link to '{os.readlink(path)}', where nothing stands") from None
        return
    if stat.S_ISREG(mode):
        if gguf_file(path) is None:
            raise ConfigError(f"{shown} is a file but no GGUF (not named *.gguf, no GGUF magic): name a GGUF file "
                              "or a model folder")
        pretrained_args(model_path)
    elif not stat.S_ISDIR(mode):
        raise ConfigError(f"{shown} is {file_kind(mode)}, not a GGUF file or a model folder")
    elif not any((path / name).is_file() for name in _FOLDER_FILES):
        raise ConfigError(f"{shown} is a folder without a model: it holds none of {', '.join(_FOLDER_FILES)}")
    elif (path / "config.json").is_file():
        try:
            parsed = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"{shown}: its config.json cannot be read as JSON ({_first_line(exc)})") from None
        if not isinstance(parsed, dict):
            raise ConfigError(f"{shown}: its config.json holds no JSON object")


def gguf_header(model_path: str) -> GgufHeader:
    """What the GGUF `model_path` says of itself (read once per process); ConfigError when
    the `gguf` package cannot read it."""
    path = gguf_file(model_path)
    if path is None:
        raise ValueError(f"{model_path!r} is not a GGUF file")
    found = path.stat()
    try:
        return _read_header(str(path.resolve()), found.st_size, found.st_mtime_ns)
    except ImportError:
        raise ConfigError(f"CONFIG_MODEL_PATH={model_path!r} is a GGUF file, which needs the gguf package: "
                          "pip install 'gguf>=0.10' (make install does)") from None
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ConfigError(f"CONFIG_MODEL_PATH={model_path!r}: the gguf package cannot read it as a GGUF file "
                          f"({_first_line(exc)})") from None


@functools.lru_cache(maxsize=4)
def _read_header(path: str, size: int, mtime_ns: int) -> GgufHeader:
    """`size` and `mtime_ns` only key the cache: a file changed in place is read again. gguf's
    reader parses every metadata array whole (the tokens, the merges): the cost is paid here once."""
    del size, mtime_ns
    import gguf

    reader = gguf.GGUFReader(path)

    def scalar(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.parts[field.data[0]]
        return bytes(value).decode("utf-8") if field.types[0] == gguf.GGUFValueType.STRING else value[0]

    architecture = scalar("general.architecture")
    if architecture is None:
        raise KeyError("it has no general.architecture")
    weight_types = Counter(t.tensor_type for t in reader.tensors if len(t.shape) > 1)
    present = {t.tensor_type for t in reader.tensors}
    return GgufHeader(
        architecture=architecture,
        quantisation=_file_type(scalar("general.file_type"), weight_types),
        undequantisable=tuple(sorted(t.name for t in present if not _dequantisable(t))),
        end_ids=tuple(dict.fromkeys(int(i) for key in _END_KEYS if (i := scalar(key)) is not None)),
        tensors=frozenset(t.name for t in reader.tensors),
    )


def _file_type(value: Any, weight_types: Counter[Any]) -> str:
    """`general.file_type` by llama.cpp's name without its MOSTLY_/ALL_ prefix (Q4_K_M), else
    (absent, GUESSED or a number this gguf does not know) the commonest 2-D tensor type."""
    import gguf

    try:
        name = gguf.LlamaFileType(int(value)).name if value is not None else "GUESSED"
    except ValueError:
        name = "GUESSED"
    if name != "GUESSED":
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return weight_types.most_common(1)[0][0].name if weight_types else "unknown"


def _dequantisable(qtype: Any) -> bool:
    """Whether `gguf.dequantize`, which transformers' GGUF loader calls on every tensor,
    handles `qtype`: asked of one block of zeros."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, dequantize

    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros(type_size, dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def pretrained_args(model_path: str) -> tuple[str, dict[str, str]]:
    """`from_pretrained`'s first argument and extra keyword arguments for `model_path`: itself,
    or a GGUF's folder and `gguf_file`, once the GGUF's header has been checked."""
    path = gguf_file(model_path)
    if path is None:
        return model_path, {}
    header = gguf_header(model_path)
    if header.undequantisable:
        kinds = ", ".join(header.undequantisable)
        raise _gguf_refusal(model_path, f"the gguf package {version('gguf')} cannot dequantise its {kinds} tensors")
    return str(path.parent), {"gguf_file": path.name}


def _gguf_refusal(model_path: str, why: str) -> ConfigError:
    header = gguf_header(model_path)
    return ConfigError(f"CONFIG_MODEL_PATH={model_path!r}: transformers {version('transformers')} cannot load "
                       f"this GGUF (architecture {header.architecture!r}, quantisation {header.quantisation}): {why}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _load(model_path: str, what: str, loader: Callable[..., T], **kwargs: Any) -> T:
    """`loader(*pretrained_args(model_path), **kwargs)`; ConfigError in one line when it fails."""
    name, extra = pretrained_args(model_path)
    try:
        return loader(name, **extra, **kwargs)
    except (OSError, ValueError, TypeError, KeyError, NotImplementedError,
            RuntimeError) as exc:  # RuntimeError: transformers' own refusal of the weights' shapes
        if extra:
            raise _gguf_refusal(model_path, _first_line(exc)) from None
        raise ConfigError(f"CONFIG_MODEL_PATH={model_path!r}: cannot load {what} from it ({_first_line(exc)})") from None


def load_tokenizer(model_path: str) -> Any:
    """`model_path`'s tokenizer, a copy of its own to each caller (they set padding, and a
    fast tokenizer is not to be shared between threads); a GGUF's is converted once."""
    path = gguf_file(model_path)
    if path is None:
        return _load(model_path, "a tokenizer", _auto_tokenizer)
    found = path.stat()
    tokenizer = _gguf_tokenizer(model_path, str(path.resolve()), found.st_size, found.st_mtime_ns)
    return copy.deepcopy(tokenizer)


@functools.lru_cache(maxsize=2)
def _gguf_tokenizer(model_path: str, resolved: str, size: int, mtime_ns: int) -> Any:
    del resolved, size, mtime_ns  # the key: the same file unchanged
    return _load(model_path, "a tokenizer", _auto_tokenizer)


def _auto_tokenizer(name: str, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, **kwargs)


def generation_eos(model_path: str) -> Any:
    """The ids `generate()` ends at besides the tokenizer's eos (an int, a list or None): a
    GGUF's header end ids; else the generation config's, else the model config's."""
    if gguf_file(model_path) is not None:
        return list(gguf_header(model_path).end_ids)
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError):
        pass
    try:
        return getattr(AutoConfig.from_pretrained(model_path), "eos_token_id", None)
    except (OSError, ValueError):
        # A bare tokenizer directory has no model config: its eos token is all there is.
        return None


def load_causal_lm(model_path: str, gpu: bool) -> PreTrainedModel:
    """The model, its weights loaded (a GGUF's dequantised) once: in float32 on a CPU, its fast
    path; on a GPU in the checkpoint's own precision, and a GGUF, which has none, in float16,
    the precision SGLang serves one in."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype: Any = torch.float32
    if gpu:
        dtype = torch.float16 if gguf_file(model_path) is not None else "auto"
    with _quiet(progress=True):
        model, info = _load(model_path, "the model", AutoModelForCausalLM.from_pretrained, dtype=dtype,
                            output_loading_info=True, ignore_mismatched_sizes=True)
    _check_loading_info(model_path, model, info)
    return model


def model_context(model_path: str) -> int | None:
    """The context length of the model at `model_path` (None when its config names none, or
    for a hub id, which transformers fetches and checks as it loads it), once its weights are
    found to be its architecture's: ConfigError naming the first tensors missing, unexpected
    or of another shape. Read from headers only: a folder's model is loaded on the meta
    device, a GGUF's tensor names are compared with the ones transformers maps its
    architecture's weights from (its shapes are compared when the weights load)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = gguf_file(model_path)
    if path is None and not Path(model_path).is_dir():
        return None
    with _quiet(progress=False):
        if path is None:
            model, info = _load(model_path, "the model", AutoModelForCausalLM.from_pretrained, device_map="meta",
                                output_loading_info=True, ignore_mismatched_sizes=True)
            _check_loading_info(model_path, model, info)
        else:
            config = _load(model_path, "the model's config", AutoConfig.from_pretrained)
            try:
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(config)
            except (ValueError, KeyError, TypeError) as exc:
                raise _gguf_refusal(model_path, _first_line(exc)) from None
            architecture = f"its header's architecture {gguf_header(model_path).architecture!r}"
            refusal = _weights_refusal(model_path, architecture, _gguf_missing(model_path, model), (), ())
            if refusal is not None:
                raise refusal
    return getattr(model.config, "max_position_embeddings", None)


def _gguf_missing(model_path: str, model: Any) -> list[str]:
    """The GGUF tensors (by their names in the file) that `model`'s weights are mapped from
    and the file lacks; a tied weight (lm_head as the embeddings) is there when one of its
    names is."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    header = gguf_header(model_path)
    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=model.config.to_dict())
    with _one_name_map_per_architecture():
        gguf_of = {hf: name for name, hf in get_gguf_hf_weights_map(model, processor).items()}
    tied: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(parameter), []).append(name)
    named = {name for names in tied.values() for name in names}
    groups = [*tied.values(), *([name] for name in model.state_dict() if name not in named)]
    return [gguf_of.get(names[0], names[0]) for names in groups
            if not any(gguf_of.get(name) in header.tensors for name in names)]


@contextlib.contextmanager
def _one_name_map_per_architecture() -> Iterator[None]:
    """transformers' `get_gguf_hf_weights_map` asks gguf for the architecture's tensor-name
    map once per module of the model (397 times for SmolLM2-135M, 24 ms each: 11.7 s of CPU);
    the map depends on the architecture and layer count alone, so it is made once here."""
    import gguf

    made = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=4)(made)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = made


def _weights_refusal(model_path: str, architecture: str, missing: Collection[str], unexpected: Collection[str],
                     mismatched: Collection[str]) -> ConfigError | None:
    """The one line refusing a model whose weights are not its `architecture`'s; None when they are."""
    found = [(missing, "missing"), (unexpected, "unexpected (not its architecture's)"),
             (mismatched, "of another shape than its architecture's")]
    parts = [f"{len(names)} tensor(s) {what}: {_first_names(names)}" for names, what in found if names]
    if not parts:
        return None
    return ConfigError(f"CONFIG_MODEL_PATH={model_path!r}: its weights do not fit {architecture} "
                       f"({'; '.join(parts)}): transformers would fill them with random numbers, another model in "
                       "every process; use a complete copy of the model")


_SHOWN = 3  # the tensors a refusal names, before "and N more"


def _first_names(names: Collection[str]) -> str:
    ordered = sorted(names, key=lambda name: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)])
    more = f" and {len(ordered) - _SHOWN} more" if len(ordered) > _SHOWN else ""
    return ", ".join(ordered[:_SHOWN]) + more


def _check_loading_info(model_path: str, model: Any, info: dict[str, Any]) -> None:
    architecture = f"its architecture {model.config.model_type!r}"
    refusal = _weights_refusal(model_path, architecture, info["missing_keys"], info["unexpected_keys"],
                              [key[0] for key in info["mismatched_keys"]])
    if refusal is not None:
        raise refusal


@contextlib.contextmanager
def _quiet(progress: bool) -> Iterator[None]:
    """transformers' warnings (its load report of missing weights, which a refusal says in one
    line) silenced, and its progress bars too unless `progress`."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
