"""The cluster build, `build-clusters` (`make.build_clusters`): the vocabulary clustered, described (`describe`) and
written where the config says, each file a build may write at a path the config names in its ledger (`written`)."""

from compressor_2.clusters.builder.make import build_clusters
from compressor_2.clusters.builder.written import builds, why_not_writable, written_here

__all__ = ["build_clusters", "builds", "why_not_writable", "written_here"]
