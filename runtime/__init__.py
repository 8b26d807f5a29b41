"""decide runtime: probe the CPU, pick a model variant, serve JSON lines."""

__version__ = "0.1.0"
