"""Configuration: one frozen, typed `Config` from `load_config`, the Kconfig `Reader`, the strategy `registry`."""

from compressor_2.config.indices import INDICES, check_each_once, repeated
from compressor_2.config.kconfig import KCONFIG_PATH, MAX_LOGITS, Reader, decimal, require, shown_number
from compressor_2.config.loader import Config, load_config
from compressor_2.config.registry import strategy_module, strategy_names
from compressor_2.config.sglang import (
    ATTENTION_FLAG, PORTABLE_BACKEND, SGLangSettings, bind_host, check_addresses, check_loopback, check_served_model,
    launch_command, option,
)

__all__ = ["ATTENTION_FLAG", "INDICES", "KCONFIG_PATH", "MAX_LOGITS", "PORTABLE_BACKEND", "Config", "Reader",
           "SGLangSettings", "bind_host", "check_addresses", "check_each_once", "check_loopback", "check_served_model",
           "decimal", "launch_command", "load_config", "option", "repeated", "require", "shown_number",
           "strategy_module", "strategy_names"]
