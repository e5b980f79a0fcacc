"""The library's version, in one place (``pyproject.toml`` repeats it)."""

VERSION = "0.1.0"
