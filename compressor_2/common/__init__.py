"""Utilities every wing may import, importing nothing else: errors, console lines, atomic writes, keys."""

from compressor_2.common.api_key import ScrubFilter, api_key_from_env, masked, remember, scrub
from compressor_2.common.atomic import (
    atomic_write_bytes, atomic_write_json, atomic_write_text, remove_orphans, why_unwritable,
)
from compressor_2.common.chat_reply import MAX_TOKENS, BadReply, read_completion
from compressor_2.common.console import answers_bar, ordinal, plural, say, timed
from compressor_2.common.endpoint import TUNNEL_HINT, check_reachable, is_loopback
from compressor_2.common.errors import ConfigError, ReflectorUnavailable, RunError
from compressor_2.common.file_kinds import check_readable_file, file_identity, file_kind
from compressor_2.common.interrupts import gather_or_cancel, signals_ignored, stop_on_first_signal, stopping
from compressor_2.common.json_values import as_count, as_float, loads_or_reason, shown

__all__ = ["MAX_TOKENS", "TUNNEL_HINT", "BadReply", "ConfigError", "ReflectorUnavailable", "RunError", "ScrubFilter",
           "answers_bar", "api_key_from_env", "as_count", "as_float", "atomic_write_bytes", "atomic_write_json",
           "atomic_write_text", "check_reachable", "check_readable_file", "file_identity", "file_kind",
           "gather_or_cancel", "is_loopback", "loads_or_reason", "masked", "ordinal", "plural", "read_completion",
           "remember", "remove_orphans", "say", "scrub", "shown", "signals_ignored", "stop_on_first_signal",
           "stopping", "timed", "why_unwritable"]
