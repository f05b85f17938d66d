"""What model attached SGLang servers say they serve, for the run identity: `/model_info`'s
`model_path` and `weight_version` (the `/get_model_info` name on older servers), asked of
every server behind CONFIG_SGLANG_URLS (a router's workers, which its `/workers` lists:
the router has no `/model_info` of its own).

Asked before the engine starts, so a server that cannot be asked yet gives None here:
the engine's own start then reports it, before any work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

ASK_SECONDS = 10.0  # a server that takes longer is not asked: its engine start names it


def served_models(urls: Sequence[str]) -> list[tuple[str, str | None]] | None:
    """(model path, weight version) of every server behind `urls`, in order; None when one
    of them cannot be asked."""
    served: list[tuple[str, str | None]] = []
    try:
        with httpx.Client(timeout=ASK_SECONDS) as client:
            for url in urls:
                found = _model_info(client, url)
                if found is None:
                    workers = _workers(client, url)
                    found_all = [_model_info(client, worker) for worker in workers]
                    if not workers or None in found_all:
                        return None
                    served += [f for f in found_all if f is not None]
                else:
                    served.append(found)
    except httpx.HTTPError:
        return None
    return served


def _model_info(client: httpx.Client, url: str) -> tuple[str, str | None] | None:
    for path in ("/model_info", "/get_model_info"):
        info = _json(client, url + path)
        if isinstance(info, dict) and isinstance(info.get("model_path"), str):
            version = info.get("weight_version")
            return info["model_path"], version if isinstance(version, str) else None
    return None


def _workers(client: httpx.Client, url: str) -> list[str]:
    listed = _json(client, url + "/workers")
    workers = listed.get("workers") if isinstance(listed, dict) else None
    if not isinstance(workers, list):
        return []
    return [str(w["url"]).rstrip("/") for w in workers if isinstance(w, dict) and isinstance(w.get("url"), str)]


def _json(client: httpx.Client, url: str) -> Any:
    response = client.get(url)
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None
