"""SGLang's own code, for the tests that hold this project to it: the sglang release that
requirements-gpu.txt pins, downloaded as a wheel without its dependencies (the GPU stack
is gigabytes) into a cache outside the repository, its Python files unpacked there, and
the modules the steering depends on loaded on the CPU.

Nothing of SGLang is copied into the repository. What cannot run on a CPU without
SGLang's whole stack is stood in for by the few stubs in `load_sglang`, each named in
`SGLang.stubs`; everything else is SGLang's code, imported or compiled from its files.
When the wheel cannot be fetched (no registry), the tests that need it skip and say why.

The cache: $COMPRESSOR_2_CACHE, else $XDG_CACHE_HOME/compressor_2, else
~/.cache/compressor_2; one folder per release (sglang-0.5.23/), safe to delete.
"""

from __future__ import annotations

import __future__
import ast
import copy
import email.parser
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
import uuid
import weakref
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
GPU_REQUIREMENTS = REPO / "requirements-gpu.txt"
# The tests read only the wheel's Python files and metadata, the same in its cp311, cp312 and
# cp313 wheels: ask for the cp311 x86_64 one, whatever runs the tests, so the cache holds one.
WHEEL_TARGET = ("--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
                "--abi", "cp311", "--platform", "manylinux_2_34_x86_64")


def pinned(requirements: Path, name: str) -> str:
    """The version `requirements` pins `name` to (`name==X`)."""
    from packaging.requirements import Requirement

    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        requirement = Requirement(line)
        if requirement.name.lower() == name:
            [spec] = requirement.specifier
            assert spec.operator == "==", f"{requirements.name} must pin {name} exactly, not {spec}"
            return spec.version
    raise AssertionError(f"{requirements.name} does not name {name}")


def cache_dir() -> Path:
    explicit = os.environ.get("COMPRESSOR_2_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compressor_2"


def sglang_wheel() -> Path:
    """The pinned sglang wheel in the cache, downloaded once; skips the test when it cannot be."""
    version = pinned(GPU_REQUIREMENTS, "sglang")
    folder = cache_dir() / f"sglang-{version}"
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as download:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", f"sglang=={version}", "--no-deps",
                 *WHEEL_TARGET, "--dest", download],
                capture_output=True, text=True, timeout=900)
            problem = (done.stderr.strip().splitlines() or [f"pip exited with {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            done, problem = None, "pip download took more than 15 minutes"
        wheels = list(Path(download).glob("*.whl"))
        if done is None or done.returncode != 0 or not wheels:
            pytest.skip(f"cannot fetch sglang=={version} (pip download --no-deps): {problem}")
        target = folder / wheels[0].name
        os.replace(wheels[0], target)  # atomic: a concurrent run sees the whole wheel or none
    return target


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def sglang_source() -> Path:
    """A folder holding the wheel's `sglang/` Python files, unpacked once beside the wheel."""
    wheel = sglang_wheel()
    root = wheel.parent / "src"
    if (root / "sglang").is_dir():
        return root
    unpacking = Path(tempfile.mkdtemp(dir=wheel.parent))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("sglang/") and name.endswith(".py"):
                archive.extract(name, unpacking)
    try:
        unpacking.rename(root)  # atomic; a concurrent run may have won
    except OSError:
        shutil.rmtree(unpacking)
    return root


def compile_definition(path: Path, name: str, namespace: dict[str, Any], within: str | None = None) -> Any:
    """One top-level function or class of SGLang's `path` (a method when `within` names its
    class), compiled from the file itself into `namespace`."""
    tree = ast.parse(path.read_text())
    body = tree.body
    if within is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == within).body
    node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - SGLang's own source, from the pinned wheel
    return namespace[name]


def compile_statements(path: Path, method: str, within: str, first: str, last: str,
                       namespace: dict[str, Any]) -> Any:
    """A function `run(self, obj)` made of the statements of `within.method` from the one
    whose source starts with `first` to the one that contains `last`; it returns its locals."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == within)
    function = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    source = path.read_text()
    segments = [ast.get_source_segment(source, node) or "" for node in function.body]
    start = next(i for i, text in enumerate(segments) if text.startswith(first))
    end = next(i for i in range(start, len(segments)) if last in segments[i])
    body = function.body[start:end + 1] + ast.parse("return dict(locals())").body
    run = ast.FunctionDef(name="run", args=ast.arguments(
        posonlyargs=[], args=[ast.arg("self"), ast.arg("obj")], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None, type_params=[])
    module = ast.fix_missing_locations(ast.Module(body=[run], type_ignores=[]))
    exec(compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag,  # noqa: S102
                 dont_inherit=True), namespace)
    return namespace["run"]


@dataclass
class SGLang:
    """SGLang's modules and functions the contract tests call, and the stubs they run on."""

    root: Path
    custom_logit_processor: types.ModuleType
    sampling_params: types.ModuleType
    api_types: types.ModuleType
    api_contract: types.ModuleType
    sampling_batch_info: types.ModuleType
    apply_custom_logit_processor: Any
    GenerateReqInput: type
    CompletionRequest: type  # /v1/completions' request (entrypoints/openai/protocol.py)
    completion_sampling: Any  # OpenAIServingCompletion._build_sampling_params(self, request)
    sampling_kwargs: Any  # TokenizerManager: preferred params + the request's -> SamplingParams
    validate_one_request: Any  # TokenizerManager._validate_one_request
    req_custom_params: str  # the lines of Req.__init__ that add "__req__"
    stubs: list[str] = field(default_factory=list)


def _module(name: str, path: Path | None = None, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def load_sglang(root: Path) -> SGLang:
    """Import SGLang's sampling modules from `root` on the CPU. Registers `sglang*` modules in
    sys.modules: callers restore them (see `sglang_modules`)."""
    srt = root / "sglang" / "srt"
    stubs: list[str] = []
    # Only sglang/__init__.py is skipped (it imports the whole serving stack); sglang/srt and
    # below are namespace packages that resolve from this package's path.
    _module("sglang", root / "sglang", __file__=str(root / "sglang" / "__init__.py"))
    stubs.append("sglang: the package itself, its __init__.py not run")
    clp = importlib.import_module("sglang.srt.sampling.custom_logit_processor")
    sampling_params = importlib.import_module("sglang.srt.sampling.sampling_params")
    api_types = importlib.import_module("sglang.api.v1.api_types")
    api_contract = importlib.import_module("sglang.srt.entrypoints.api_contract")

    # sampling_batch_info needs these; their real modules import the GPU stack.
    _module("sglang.srt.utils", srt / "utils", get_compiler_backend=lambda mode=None: "eager",
            is_npu=lambda: False)
    _module("sglang.srt.utils.common", is_pin_memory_available=lambda device=None: False)
    stubs.append("sglang.srt.utils(.common): get_compiler_backend 'eager', is_npu False, no pinned memory")

    class GrammarStandIn:  # only touched by requests with a grammar; these have none
        def __init__(self, *args: Any) -> None:
            self.args = args

    _module("sglang.srt.constrained", srt / "constrained")
    _module("sglang.srt.constrained.base_grammar_backend", BaseGrammarObject=GrammarStandIn,
            GrammarMask=GrammarStandIn, GrammarRow=GrammarStandIn)
    stubs.append("sglang.srt.constrained.base_grammar_backend: grammar classes (no grammar is used)")

    class ScheduleBatch:  # from_schedule_batch only tests isinstance against it
        pass

    _module("sglang.srt.managers", srt / "managers")
    _module("sglang.srt.managers.schedule_batch", ScheduleBatch=ScheduleBatch)
    stubs.append("sglang.srt.managers.schedule_batch: ScheduleBatch (an isinstance check)")
    batch_info = importlib.import_module("sglang.srt.sampling.sampling_batch_info")
    # get_exec() reads the runtime context a launched server publishes: the two features it asks.
    runtime = SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=True),
        features=SimpleNamespace(enable_custom_logit_processor=True, enable_watermark=False))
    batch_info.get_exec = lambda: runtime
    stubs.append("sampling_batch_info.get_exec: --enable-custom-logit-processor on, watermark off")

    import logging

    import torch

    sampler_ns = {"torch": torch, "logger": logging.getLogger("sglang.sampler"),
                  "SamplingBatchInfo": batch_info.SamplingBatchInfo}
    apply = compile_definition(srt / "layers" / "sampler.py", "apply_custom_logit_processor", sampler_ns)

    # dataclasses resolves annotations through the class's module: give it one of its own.
    io_struct = _module("sglang_contract_io_struct", __file__=str(srt / "managers" / "io_struct.py"))
    io_struct.__dict__.update(dataclass=dataclass, field=field, uuid=uuid, Counter=Counter, copy=copy)
    generate_req = compile_definition(srt / "managers" / "io_struct.py", "GenerateReqInput", io_struct.__dict__)

    manager = srt / "managers" / "tokenizer_manager.py"
    kwargs_ns = {"GenerateReqInput": generate_req}
    sampling_kwargs = compile_statements(manager, "_create_tokenized_object", "TokenizerManager",
                                         "if self.preferred_sampling_params", "sampling_params.verify(",
                                         kwargs_ns)
    validate_ns = {"GenerateReqInput": generate_req, "EmbeddingReqInput": type("EmbeddingReqInput", (), {}),
                   "logger": logging.getLogger("sglang.tokenizer_manager"),
                   "get_exec": lambda: SimpleNamespace(features=SimpleNamespace(
                       enable_encoder_swa_bounded_replay=False))}
    validate = compile_definition(manager, "_validate_one_request", validate_ns, within="TokenizerManager")
    stubs.append("TokenizerManager: `self` holds only what _validate_one_request and the sampling-params "
                 "lines of _create_tokenized_object read")

    import json

    # protocol.py imports sglang.utils for this one function, and sglang.utils the GPU stack.
    _module("sglang.utils", convert_json_schema_to_str=json.dumps)
    stubs.append("sglang.utils: convert_json_schema_to_str as json.dumps (only response_format uses it)")
    protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
    completion_sampling = compile_definition(
        srt / "entrypoints" / "openai" / "serving_completions.py", "_build_sampling_params",
        {"CompletionRequest": protocol.CompletionRequest, "convert_json_schema_to_str": json.dumps},
        within="OpenAIServingCompletion")

    lines = (srt / "managers" / "schedule_batch.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if 'custom logit processors read "__req__"' in line)
    end = next(i for i in range(start, len(lines)) if "self.custom_logit_processor = custom_logit_processor" in lines[i])
    req_lines = textwrap.dedent("\n".join(lines[start:end + 1]))
    return SGLang(root=root, custom_logit_processor=clp, sampling_params=sampling_params, api_types=api_types,
                  api_contract=api_contract, sampling_batch_info=batch_info, apply_custom_logit_processor=apply,
                  GenerateReqInput=generate_req, CompletionRequest=protocol.CompletionRequest,
                  completion_sampling=completion_sampling, sampling_kwargs=sampling_kwargs,
                  validate_one_request=validate,
                  req_custom_params=req_lines, stubs=stubs)


class Req:
    """SGLang's `Req` as far as batching reads it; its `__init__` runs SGLang's own lines
    that add "__req__" to a dict custom_params."""

    def __init__(self, sglang: SGLang, rid: str, sampling_params: Any, custom_logit_processor: str | None,
                 input_ids: list[int]) -> None:
        from array import array

        self.rid = rid
        self.origin_input_ids = array("q", input_ids)
        self.output_ids = array("q")
        self.return_sampling_mask = False
        self.sampling_logprobs_mode = "selected"
        namespace = {"self": self, "sampling_params": sampling_params, "copy": copy, "weakref": weakref,
                     "custom_logit_processor": custom_logit_processor}
        # Sets self.sampling_params (with "__req__") and self.custom_logit_processor.
        exec(sglang.req_custom_params, namespace)  # noqa: S102 - SGLang's own lines


class Batch:
    """What SamplingBatchInfo.from_schedule_batch reads of a ScheduleBatch."""

    def __init__(self, reqs: list[Req]) -> None:
        self.reqs = reqs
        self.device = "cpu"
