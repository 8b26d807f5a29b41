"""Making a package ready to serve, at start and for a live reload (runtime/serve/swap.py).

At start `runtime.engine.startup.prepare` has already chosen tier, variant, threads and workers; `initial`
builds the warm engine. A reload (`build`) makes the same choices again for the new package with
the CPU probe and the overrides taken at start (so the numeric stack, which the tier decides and
which cannot change inside a process, stays the same), and is stricter than a start: every file
of the package is hashed (a complete package, not just the variant served), the signature is
checked against the trusted keys, and the golden selftest must pass before anything switches.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.engine.classifier import sizes
from runtime.engine.startup import overrides
from runtime.package.load import PackageError, beyond_variant, load_package, verify_files
from runtime.package.signing import TrustedKeys, check_signature
from runtime.platform.tiers import select
from runtime.serve.swap import Loaded

if TYPE_CHECKING:
    from runtime.engine.classifier import Setup

# A Setup → its warm engine, with the command's flags (runtime/cli.py's `warm`).
Warm = Callable[["Setup"], Any]

MAX_PROBLEMS_SHOWN = 3


def initial(setup: Setup, warm: Warm) -> Loaded:
    """The warm engine of the package `prepare` chose."""
    return Loaded(warm(setup), setup.package.root, setup.signer)


def build(setup: Setup, args: argparse.Namespace, warm: Warm, trusted: TrustedKeys, path: Path) -> Loaded:
    """Load, check, choose, warm and self-test the package at `path`; PackageError (or the tier
    picker's errors) say why it cannot serve."""
    from runtime.selftest import run_golden  # imports numpy: never before `prepare` chose its stack

    package = load_package(path)
    signer = check_signature(package.root, package.manifest_bytes, package.signature, trusted)
    choice = select(setup.features, setup.platform, package.manifest.variants.keys(), *overrides(args))
    verify_files(package, beyond_variant(package.manifest, choice.variant))  # the engine hashes the rest
    threads, workers = sizes(setup.features, choice.tier, args.threads, args.workers)
    ready = dataclasses.replace(setup, choice=choice, package=package, threads=threads, workers=workers,
                                signer=signer)
    engine = warm(ready)
    result = run_golden(engine)
    if not result.passed:
        problems = "; ".join(result.problems[:MAX_PROBLEMS_SHOWN])
        raise PackageError(f"{path}: selftest failed: {result.summary()}" + (f" ({problems})" if problems else ""))
    return Loaded(engine, path, signer, result.summary())
