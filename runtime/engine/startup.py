"""What every command does before it serves: its flags and environment → a Setup (CPU → tier →
package → variant, runtime/engine/classifier.py) → the warm engine.

Shared by the CLI (runtime/cli.py), `decide score` and its Ray job (runtime/score/), and the
live swap's candidate packages (runtime/candidate.py), so none of them reaches up into the CLI.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from runtime.engine import classifier
from runtime.engine.classifier import Setup
from runtime.platform.appdir import default_model_dir
from runtime.protocol import DEFAULT_MAX_BATCH

ENV_MODEL, ENV_TIER, ENV_VARIANT = "DECIDE_MODEL", "DECIDE_TIER", "DECIDE_VARIANT"


class UsageError(Exception):
    """Arguments that parse but make no sense."""


def model_dir(args: argparse.Namespace) -> Path:
    """--model, else $DECIDE_MODEL, else the default package next to the app."""
    if args.model is not None:
        return args.model
    if os.environ.get(ENV_MODEL):
        return Path(os.environ[ENV_MODEL])
    return default_model_dir()


def overrides(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(tier, variant) forced by flags or, failing that, by DECIDE_TIER/DECIDE_VARIANT."""
    return (args.tier or os.environ.get(ENV_TIER) or None, args.variant or os.environ.get(ENV_VARIANT) or None)


def prepare(args: argparse.Namespace) -> Setup:
    """CPU → tier → package → variant (runtime.engine.classifier.prepare) from the command line."""
    for flag in ("threads", "workers"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be at least 1")
    return classifier.prepare(model_dir(args), *overrides(args), threads=args.threads, workers=args.workers,
                              trust_keys=getattr(args, "trust_key", ()))  # a caller-made Namespace may lack it


def load_engine(setup: Setup, args: argparse.Namespace, variant: str | None = None,
                max_batch: int = DEFAULT_MAX_BATCH):
    """Import the numeric stack (only now) and build the warmed engine."""
    return classifier.load_engine(setup, variant, max_batch, spin=args.spin)
