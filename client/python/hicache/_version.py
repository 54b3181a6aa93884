"""The client's version: the wheel's metadata (pyproject.toml) reads it from
here, so it is written in this one place. It follows the daemon's release
(HICACHE_VERSION in daemon/core/build_info.cc)."""

__version__ = "0.1.0"
