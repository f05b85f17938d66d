"""The GPU host as the standard library sees it: what `make install-gpu` checks before any
download (`python -m compressor_2.host.check`), and what a launched SGLang server is
adjusted to (the GPUs' compute capability). Standard library only, in Python 3.7 syntax:
it runs before anything is installed, on whatever interpreter the host has."""
