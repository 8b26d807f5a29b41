"""decide's version: one place, imported by every layer that reports it (and by pyproject.toml)."""

__version__ = "0.1.0"
