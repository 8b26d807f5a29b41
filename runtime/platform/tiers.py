"""Tier selection: probed CPU features + platforms/<arch>.json → tier, model variant, reasons.

The tiers are data (platforms/*.json); `select` is one pure function over that data, so tests
can feed it any fake CPU and `decide info` prints exactly the table the picker used.
Stdlib only: runs before numpy/onnxruntime are imported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.platform.cpu import CpuFeatures
from runtime.platform.safefile import FileRefused, open_dir, read_inside


class CpuUnsupported(Exception):
    """No tier of this architecture can run on the probed CPU (or the architecture is unknown)."""


class OverrideError(Exception):
    """A --tier/--variant (or DECIDE_TIER/DECIDE_VARIANT) override that cannot be honoured."""


class NoUsableVariant(Exception):
    """The model package has none of the variants the chosen tier can use."""


class PlatformDataError(Exception):
    """platforms/<arch>.json is damaged: not a regular file, too big, not JSON, or a field is wrong."""


MAX_PLATFORM_BYTES = 1 << 20  # the x86_64 table is ~5 KB


# py-cpuinfo names that users would not recognise in an error message
_FLAG_DISPLAY = {"pni": "pni (SSE3)", "asimd": "asimd (NEON)"}

@dataclass(frozen=True)
class Tier:
    """One CPU tier: what it requires and which model variants it prefers, best first."""

    name: str
    requires: tuple[str, ...]
    variants: tuple[str, ...]
    threads_max: int = 0  # 0 = every usable core
    ort: dict[str, Any] = field(default_factory=dict)  # session settings, see engine.SessionSettings
    note: str = ""
    numeric_stack: str = "standard"  # "legacy": numpy 1.26 below x86-64-v2, see runtime/platform/stack.py


@dataclass(frozen=True)
class PlatformTiers:
    """All tiers of one architecture, baseline first."""

    arch: str
    tiers: tuple[Tier, ...]

    def tier(self, name: str) -> Tier | None:
        """The tier called `name`, or None."""
        return next((t for t in self.tiers if t.name == name), None)


@dataclass(frozen=True)
class TierCheck:
    """A tier evaluated against the CPU: passed, or which required flags are missing."""

    tier: Tier
    missing: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """True if the CPU has every flag the tier requires."""
        return not self.missing


@dataclass(frozen=True)
class Choice:
    """The picker's answer. `variant` is None when no package was given to choose from."""

    tier: Tier
    variant: str | None
    reasons: tuple[str, ...]
    checks: tuple[TierCheck, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form for `info --json` and the ready event."""
        return {
            "tier": self.tier.name,
            "variant": self.variant,
            "reasons": list(self.reasons),
            "tiers": [
                {"name": c.tier.name, "pass": c.passed, "missing": list(c.missing),
                 "variants": list(c.tier.variants), "numeric_stack": c.tier.numeric_stack}
                for c in self.checks
            ],
        }


def parse_platform(data: dict[str, Any]) -> PlatformTiers:
    """Build PlatformTiers from a platforms/<arch>.json object (tier fields override defaults)."""
    defaults = data.get("defaults", {})
    tiers = []
    for raw in data["tiers"]:
        threads = {**defaults.get("threads", {}), **raw.get("threads", {})}
        tiers.append(
            Tier(
                name=raw["name"],
                requires=tuple(raw["requires"]),
                variants=tuple(raw["variants"]),
                threads_max=int(threads.get("max", 0)),
                ort={**defaults.get("ort", {}), **raw.get("ort", {})},
                note=raw.get("note", ""),
                numeric_stack=raw.get("numeric_stack", "standard"),
            )
        )
    return PlatformTiers(arch=data["arch"], tiers=tuple(tiers))


def load_platform(platforms_dir: Path, arch: str) -> PlatformTiers:
    """Read platforms_dir/<arch>.json (a regular file, capped: runtime/platform/safefile.py); an unknown
    architecture is CpuUnsupported, a damaged table PlatformDataError."""
    name = f"{arch}.json"
    try:
        dir_fd = open_dir(platforms_dir)
        try:
            raw = read_inside(dir_fd, name, MAX_PLATFORM_BYTES, "platform table")
        finally:
            os.close(dir_fd)
    except FileNotFoundError as exc:
        known = sorted(p.stem for p in platforms_dir.glob("*.json"))
        raise CpuUnsupported(
            f"architecture {arch!r} is not supported (supported: {', '.join(known) or 'none found'})"
        ) from exc
    except (FileRefused, OSError) as exc:
        raise PlatformDataError(f"{platforms_dir}: {exc}") from exc
    try:
        return parse_platform(json.loads(raw.decode("utf-8")))
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
        raise PlatformDataError(f"{platforms_dir / name} is damaged: {type(exc).__name__}: {exc}") from exc


def check_tiers(features: CpuFeatures, platform: PlatformTiers) -> tuple[TierCheck, ...]:
    """Evaluate every tier against the CPU flags."""
    return tuple(
        TierCheck(tier, tuple(flag for flag in tier.requires if not features.has(flag)))
        for tier in platform.tiers
    )


def select(
    features: CpuFeatures,
    platform: PlatformTiers,
    available_variants: Collection[str] | None,
    tier_override: str | None = None,
    variant_override: str | None = None,
) -> Choice:
    """Pick the tier (best passing, or the override) and the variant (tier preference ∩ package).

    `available_variants` are the package's variant names; None = no package (choose tier only).
    Raises CpuUnsupported, OverrideError or NoUsableVariant with a one-line message.
    """
    checks = check_tiers(features, platform)
    passing = [c for c in checks if c.passed]
    reasons: list[str] = []
    if tier_override:
        check = next((c for c in checks if c.tier.name == tier_override), None)
        if check is None:
            names = ", ".join(t.name for t in platform.tiers)
            raise OverrideError(f"unknown tier {tier_override!r} for {platform.arch} (tiers: {names})")
        if not check.passed:
            raise OverrideError(
                f"tier {tier_override!r} needs {', '.join(check.missing)}, which this CPU lacks"
            )
        tier = check.tier
        reasons.append(f"tier {tier.name} forced by override")
    elif passing:
        tier = passing[-1].tier
        reasons.append(f"tier {tier.name}: best tier whose requirements this CPU meets")
    else:
        baseline = checks[0]
        raise CpuUnsupported(
            f"this {platform.arch} CPU lacks {', '.join(_FLAG_DISPLAY.get(f, f) for f in baseline.missing)} "
            f"(needed by {baseline.tier.name!r}, the lowest tier decide supports)"
        )

    if available_variants is None:
        reasons.append("no model package: variant not chosen")
        return Choice(tier, None, tuple(reasons), checks)

    if variant_override:
        if variant_override not in available_variants:
            raise OverrideError(
                f"variant {variant_override!r} is not in the model package "
                f"(it has: {', '.join(sorted(available_variants)) or 'none'})"
            )
        reasons.append(f"variant {variant_override} forced by override"
                       + ("" if variant_override in tier.variants else
                          f" (tier {tier.name} never picks it: its kernels on this CPU may differ from "
                          "the ones its golden outputs were recorded with)"))
        return Choice(tier, variant_override, tuple(reasons), checks)

    for name in tier.variants:
        if name in available_variants:
            reasons.append(f"variant {name}: first of {', '.join(tier.variants)} in the package")
            return Choice(tier, name, tuple(reasons), checks)
        reasons.append(f"variant {name} not in the package (not built or failed its gate)")
    raise NoUsableVariant(
        f"the model package has none of {', '.join(tier.variants)} "
        f"(it has: {', '.join(sorted(available_variants)) or 'none'})"
    )
