"""Which numeric stack this process imports: chosen after the tier, before the first numpy import.

- "standard": the pinned numpy 2.4 (its baseline is x86-64-v2: SSE4.2 + POPCNT).
- "legacy": numpy 1.26.4 (baseline SSE2/SSE3) for CPUs below x86-64-v2 (Core 2, AMD K8/K10),
  with the SAME onnxruntime (its x86_64 wheel runs on SSE2 and accepts numpy >= 1.21.6).
  The frozen bundle ships it in `_internal/legacy/`; this module puts that directory first on
  sys.path. That overrides the numpy 2.4 frozen into the PYZ because PyInstaller >= 6 resolves
  PYZ modules through a sys.path entry (its path hook on `_internal`), not a meta-path finder.

Run from source (`python -m runtime`), the legacy stack is either the installed numpy when it is
1.x, or a directory named by DECIDE_LEGACY_PATH (`pip install --target DIR numpy==1.26.4`).
Stdlib only, and numpy is never imported here: importing the wrong one is what we avoid.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from runtime.platform.appdir import find_data_dir
from runtime.platform.tiers import CpuUnsupported, Tier

LEGACY = "legacy"
STANDARD = "standard"
LEGACY_DIR = "legacy"  # inside the bundle: <app>/_internal/legacy (found through appdir)
LEGACY_NUMPY = "numpy==1.26.4"
ENV_LEGACY_PATH = "DECIDE_LEGACY_PATH"


class LegacyStackMissing(CpuUnsupported):
    """The tier needs the legacy numpy and none is available (same exit code as an unsupported CPU)."""


@dataclass(frozen=True)
class NumericStack:
    """The chosen stack: its name, the directory to put first on sys.path (None: as installed), why."""

    name: str
    path: Path | None
    numpy_version: str
    reason: str

    def to_json(self) -> dict[str, str | None]:
        """JSON form for `info --json`."""
        return {"name": self.name, "path": None if self.path is None else str(self.path),
                "numpy": self.numpy_version, "reason": self.reason}


def numpy_version_in(directory: Path) -> str | None:
    """Version of the numpy installed in `directory` (from its dist-info name), without importing it."""
    if not (directory / "numpy" / "__init__.py").is_file():
        return None
    for dist_info in sorted(directory.glob("numpy-*.dist-info")):
        return dist_info.name.removesuffix(".dist-info").partition("-")[2]
    return "unknown"


def installed_numpy_version() -> str | None:
    """Version of the numpy this interpreter would import, from its metadata (not imported)."""
    try:
        return metadata.version("numpy")
    except metadata.PackageNotFoundError:
        return None


def legacy_candidates(env: Mapping[str, str], frozen: bool) -> list[Path]:
    """Directories that may hold the legacy numpy, in the order they are tried."""
    candidates = [Path(env[ENV_LEGACY_PATH])] if env.get(ENV_LEGACY_PATH) else []
    if frozen:
        candidates.append(find_data_dir(LEGACY_DIR))
    return candidates


def choose_stack(
    tier: Tier,
    candidates: list[Path],
    installed_numpy: str | None,
) -> NumericStack:
    """The stack for `tier`: standard, or legacy from the first candidate directory holding numpy
    1.x, or the installed numpy if it is 1.x. Raises LegacyStackMissing naming what to install."""
    if tier.numeric_stack != LEGACY:
        return NumericStack(STANDARD, None, installed_numpy or "unknown",
                            f"tier {tier.name} runs the standard numpy")
    why = f"tier {tier.name} is below x86-64-v2, where numpy 2 cannot run"
    for directory in candidates:
        version = numpy_version_in(directory)
        if version is not None and version.startswith("1."):
            return NumericStack(LEGACY, directory, version, f"{why}: numpy {version} from {directory}")
    if installed_numpy is not None and installed_numpy.startswith("1."):
        return NumericStack(LEGACY, None, installed_numpy, f"{why}: the installed numpy {installed_numpy}")
    looked = ", ".join(str(c) for c in candidates) or f"no {ENV_LEGACY_PATH} set"
    raise LegacyStackMissing(
        f"tier {tier.name} needs the legacy numeric stack ({LEGACY_NUMPY}, SSE2/SSE3 baseline) and "
        f"none was found (installed numpy: {installed_numpy or 'none'}; looked in: {looked}). "
        f"Install it: `pip install --target DIR {LEGACY_NUMPY}` and set {ENV_LEGACY_PATH}=DIR, "
        f"or use the release zip, which ships it"
    )


def stack_for(tier: Tier) -> NumericStack:
    """choose_stack for this process (environment, frozen or not, installed numpy)."""
    frozen = bool(getattr(sys, "frozen", False))
    return choose_stack(tier, legacy_candidates(os.environ, frozen), installed_numpy_version())


# Environment variables that make numpy's OpenBLAS (either stack) run kernels for a CPU named in
# them instead of the one it detects: OPENBLAS_CORETYPE=Haswell, left in a shell profile or an image
# made on a newer machine, is SIGILL at `import numpy` on a CPU without AVX2.
FORCED_BLAS_CORE = ("OPENBLAS_CORETYPE",)


def drop_forced_blas_core(env: dict | None = None) -> list[str]:
    """Remove the forced BLAS core type from the environment (this process and what it starts):
    the CPU probe has chosen the stack, and OpenBLAS detects this CPU's kernels itself. Returns
    the `NAME=value` settings removed."""
    env = os.environ if env is None else env
    return [f"{name}={env.pop(name)}" for name in FORCED_BLAS_CORE if name in env]


def activate(stack: NumericStack) -> list[str]:
    """Put the stack's directory first on sys.path and drop a forced BLAS core type (returned, for
    the log). Must run before anything imports numpy."""
    dropped = drop_forced_blas_core()
    if stack.path is None:
        return dropped
    if "numpy" in sys.modules:
        raise RuntimeError("numpy was imported before the numeric stack was chosen")
    entry = str(stack.path)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    return dropped
