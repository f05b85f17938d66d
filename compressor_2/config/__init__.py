"""Configuration: one frozen, typed `Config`, loaded from a Kconfig `.config` by
`load_config` (the one entry point, in `loader`), each concern parsed by its own module."""

from compressor_2.config.archive import ArchiveOptions
from compressor_2.config.ga import GaOptions
from compressor_2.config.gepa import GepaOptions
from compressor_2.config.kconfig import KCONFIG_PATH
from compressor_2.config.loader import Config, load_config
from compressor_2.config.search import CmaesOptions, RandomOptions

__all__ = ["KCONFIG_PATH", "ArchiveOptions", "CmaesOptions", "Config", "GaOptions", "GepaOptions", "RandomOptions",
           "load_config"]
