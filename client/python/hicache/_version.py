"""The client's version: the wheel's metadata (pyproject.toml) reads it from
here. It is the release's version, written first in version/version.cc (what
hicached and hicachectl report); //tests/packaging:version_test fails when the
two differ."""

__version__ = "0.2.0"
