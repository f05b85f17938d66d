"""What kind of file stands at a path, for the checks that refuse the wrong kind before
anything blocks on it or is written over it: a FIFO opened for reading waits for a writer
for ever, and a rename replaces a device node or a link rather than writing through it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from compressor_2.common.errors import ConfigError


def file_kind(mode: int) -> str:
    """What kind of file `mode` (an lstat's) is, for a message."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def file_identity(path: Path) -> tuple[int, int] | Path:
    """The same file whatever the path's spelling: (device, inode) when it exists (hard links
    included), else the absolute path with symbolic links resolved (as spelt where they loop:
    no file stands there)."""
    try:
        found = os.stat(path)
    except OSError:
        try:
            return path.resolve()
        except RuntimeError:  # a symbolic-link loop
            return Path(os.path.abspath(path))
    return found.st_dev, found.st_ino


def check_readable_file(path: Path, what: str) -> None:
    """Refuses, in one line, a `path` the user named as a file to read that is something
    else (links are followed); a missing path is left to the reader's own message."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} '{path}' is {file_kind(mode)}, not a regular file: name the file itself")
