"""The GPU host as the standard library sees it: what `make install-gpu` checks before any
download (`python -m compressor_2.host.check`), and what a launched SGLang server is
adjusted to (the GPUs' compute capability). Standard library only, and Python 3.6 at the
oldest (RHEL 8's python3), annotations from `typing`: it runs before anything is installed,
on whatever interpreter the host has, and must get as far as saying what is wrong."""

from compressor_2.host.probe import compute_capabilities

__all__ = ["compute_capabilities"]
