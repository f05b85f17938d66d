"""Shared utilities every wing may import, importing nothing else of the package."""
