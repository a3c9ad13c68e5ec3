"""The package's version, from its installed metadata: pyproject.toml's, written once."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("speclane")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
