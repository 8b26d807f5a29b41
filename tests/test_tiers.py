"""Tier choice for a table of fake CPUs, variant fallback, and overrides."""

import json
import os
import re
from pathlib import Path

import pytest

from runtime.platform.cpu import CpuFeatures
from runtime.platform.tiers import (
    CpuUnsupported,
    NoUsableVariant,
    OverrideError,
    load_platform,
    select,
)

PLATFORMS = Path(__file__).resolve().parent.parent / "platforms"
ALL_VARIANTS = ("fp32", "int8-u8u8", "int8-u8s8")
KNOWN_VARIANTS = (*ALL_VARIANTS, "int8-u8s7")  # what models/quantize/int8.py can make (u8s7: opt-in)

CORE2 = {"sse2", "pni", "ssse3"}  # Conroe: pni is py-cpuinfo's name for SSE3
K10 = {"sse2", "pni", "popcnt", "sse4a"}  # AMD Phenom II: SSE3 and POPCNT, no SSSE3
V2 = CORE2 | {"sse4_1", "sse4_2", "popcnt"}
AVX = V2 | {"avx", "os_avx", "osxsave"}
AVX2 = AVX | {"avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "os_avx512"}


def cpu(arch: str, flags: set[str]) -> CpuFeatures:
    return CpuFeatures(arch, frozenset(flags), 4, "fake")


@pytest.mark.parametrize(
    "arch, flags, tier, variant",
    [
        ("x86_64", CORE2, "baseline", "int8-u8u8"),  # below x86-64-v2
        ("x86_64", CORE2 | {"sse4_1"}, "baseline", "int8-u8u8"),  # Penryn: SSE4.1 but no SSE4.2/POPCNT
        ("x86_64", K10, "baseline", "int8-u8u8"),
        ("x86_64", V2, "v2-sse4.2", "fp32"),  # no AVX (Nehalem)
        ("x86_64", AVX, "avx", "fp32"),  # Sandy Bridge
        ("x86_64", AVX2, "avx2", "int8-u8u8"),  # Haswell: u8s8 would saturate
        ("x86_64", AVX512, "avx512", "int8-u8u8"),  # Skylake-X
        ("x86_64", AVX2 | {"avx_vnni"}, "avx-vnni", "int8-u8s8"),  # Alder Lake
        ("x86_64", AVX512 | {"avx512vnni"}, "avx512-vnni", "int8-u8s8"),  # Cascade Lake
        ("aarch64", {"fp", "asimd"}, "armv8.0", "int8-u8s8"),  # Cortex-A53
        ("aarch64", {"fp", "asimd", "asimddp"}, "dotprod", "int8-u8s8"),  # Neoverse-N1
        ("aarch64", {"fp", "asimd", "asimddp", "i8mm", "sve"}, "i8mm", "int8-u8s8"),  # Neoverse-V1
    ],
)
def test_fake_cpu_gets_expected_tier_and_variant(arch, flags, tier, variant):
    choice = select(cpu(arch, flags), load_platform(PLATFORMS, arch), ALL_VARIANTS)
    assert (choice.tier.name, choice.variant) == (tier, variant)
    assert [c.tier.name for c in choice.checks if c.passed][-1] == tier


def test_core2_gets_the_baseline_tier_with_the_legacy_numeric_stack():
    """numpy 2.4 cannot run below x86-64-v2: that tier, and only that one, asks for numpy 1.26."""
    platform = load_platform(PLATFORMS, "x86_64")
    choice = select(cpu("x86_64", CORE2), platform, ALL_VARIANTS)
    assert (choice.tier.name, choice.tier.numeric_stack) == ("baseline", "legacy")
    assert [c.tier.name for c in choice.checks if c.passed] == ["baseline"]
    assert {t.name for t in platform.tiers if t.numeric_stack == "legacy"} == {"baseline"}
    assert all(t.numeric_stack == "standard" for t in platform.tiers if "sse4_2" in t.requires)


def test_x86_without_sse3_is_refused_naming_missing_flags():
    with pytest.raises(CpuUnsupported, match="pni"):  # early Athlon 64 / Pentium 4: SSE2 only
        select(cpu("x86_64", {"sse", "sse2"}), load_platform(PLATFORMS, "x86_64"), ALL_VARIANTS)


def test_arm_without_neon_is_refused():
    with pytest.raises(CpuUnsupported, match="asimd"):
        select(cpu("aarch64", {"fp"}), load_platform(PLATFORMS, "aarch64"), ALL_VARIANTS)


def test_unknown_architecture_is_refused():
    with pytest.raises(CpuUnsupported, match="riscv64"):
        load_platform(PLATFORMS, "riscv64")


def test_only_avx2_picks_int8_u8s7_and_only_when_the_package_has_it():
    # int8-u8s7 is opt-in (a recipe names it) and gated: a package without it gets u8u8 on AVX2 as before
    platform = load_platform(PLATFORMS, "x86_64")
    with_u8s7 = KNOWN_VARIANTS
    choice = select(cpu("x86_64", AVX2), platform, with_u8s7)
    assert choice.variant == "int8-u8s7" and "first of int8-u8s7" in choice.reasons[-1]
    assert select(cpu("x86_64", AVX2), platform, ALL_VARIANTS).variant == "int8-u8u8"
    for flags, variant in ((AVX, "fp32"), (AVX512, "int8-u8u8"), (AVX512 | {"avx512vnni"}, "int8-u8s8")):
        assert select(cpu("x86_64", flags), platform, with_u8s7).variant == variant
    assert [t.name for t in platform.tiers if "int8-u8s7" in t.variants] == ["avx2"]


def test_missing_variant_falls_back_along_preference_list():
    choice = select(cpu("x86_64", AVX512 | {"avx512vnni"}), load_platform(PLATFORMS, "x86_64"), ("fp32", "int8-u8u8"))
    assert choice.variant == "int8-u8u8"
    assert any("int8-u8s8 not in the package" in r for r in choice.reasons)
    choice = select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ("fp32",))
    assert choice.variant == "fp32"


def test_package_without_any_usable_variant_is_an_error():
    with pytest.raises(NoUsableVariant):
        select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ("bf16",))


def test_tier_override_to_lower_tier_is_honoured():
    choice = select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ALL_VARIANTS, tier_override="avx")
    assert (choice.tier.name, choice.variant) == ("avx", "fp32")
    assert "forced" in choice.reasons[0]


def test_tier_override_beyond_cpu_is_refused():
    with pytest.raises(OverrideError, match="avx512f"):
        select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ALL_VARIANTS, tier_override="avx512")


def test_unknown_tier_override_is_refused():
    with pytest.raises(OverrideError, match="unknown tier"):
        select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ALL_VARIANTS, tier_override="sse9")


def test_variant_override():
    choice = select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ALL_VARIANTS, variant_override="fp32")
    assert choice.variant == "fp32"
    with pytest.raises(OverrideError, match="not in the model package"):
        select(cpu("x86_64", AVX2), load_platform(PLATFORMS, "x86_64"), ("fp32",), variant_override="int8-u8s8")


def test_no_package_chooses_tier_only():
    choice = select(cpu("aarch64", {"asimd", "asimddp"}), load_platform(PLATFORMS, "aarch64"), None)
    assert choice.tier.name == "dotprod" and choice.variant is None


@pytest.mark.parametrize("path", sorted(PLATFORMS.glob("*.json")), ids=lambda p: p.name)
def test_platform_files_are_consistent(path):
    data = json.loads(path.read_text())
    assert data["arch"] == path.stem
    platform = load_platform(PLATFORMS, path.stem)
    for tier in platform.tiers:
        assert set(tier.variants) <= set(KNOWN_VARIANTS)
        assert tier.ort["graph_optimization_level"] != "all"  # ALL ties the graph to one CPU
        assert tier.numeric_stack in ("standard", "legacy")  # runtime/platform/stack.py knows no other
    # Baseline first: each tier's requirements include the baseline's.
    baseline = set(platform.tiers[0].requires)
    assert all(baseline <= set(t.requires) for t in platform.tiers)


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "x86_64.json").unlink() or (d / "x86_64.json").symlink_to(PLATFORMS / "x86_64.json"),
     "x86_64.json is a symbolic link"),
    (lambda d: (d / "x86_64.json").unlink() or os.mkfifo(d / "x86_64.json"), "x86_64.json is a FIFO"),
    (lambda d: (d / "x86_64.json").write_text(" " * (2 << 20)), "more than the 1048576 a platform table may have"),
    (lambda d: (d / "x86_64.json").write_text("{not json"), "x86_64.json is damaged"),
    (lambda d: (d / "x86_64.json").write_text('{"arch": "x86_64"}'), "x86_64.json is damaged: KeyError"),
])
def test_a_damaged_platform_table_is_refused_with_one_line(tmp_path, damage, words):
    import shutil

    from runtime.platform.tiers import PlatformDataError

    tables = Path(shutil.copytree(PLATFORMS, tmp_path / "platforms"))
    damage(tables)
    with pytest.raises(PlatformDataError, match=re.escape(words)):
        load_platform(tables, "x86_64")
