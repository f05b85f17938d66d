"""Configuration: one frozen, typed `Config`, loaded from a Kconfig `.config` by `load_config`."""

from compressor_2.config.kconfig import KCONFIG_PATH
from compressor_2.config.loader import Config, load_config

__all__ = ["KCONFIG_PATH", "Config", "load_config"]
