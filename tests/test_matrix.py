"""The frozen bundle on emulated CPUs: tier, variant, selftest and parity per CPU model.

CI runs a subset (the 45-minute budget is shared): one old x86 (Nehalem, the x86-64-v2 floor),
one x86 below v2 (Conroe: served on the legacy numpy 1.26 stack, never SIGILL) and one ARM64
(cortex-a53, no dotprod). DECIDE_MATRIX=full runs every model; `python3 benchmarks/matrix.py
--arch all --fresh` prints the whole table. Both zips are the ones built from the tree under test
(bundle_spec.matrix.zip_for_tree), built here when missing; without root or qemu the cells skip
with the reason, and fail under DECIDE_STRICT=1 (CI).
"""

from __future__ import annotations

import os

import pytest
from zips import zip_of_this_tree

from bundle_spec import matrix as emulation
from bundle_spec import qemu_user

pytestmark = pytest.mark.heavy

CI_CELLS = [("x86_64", "Nehalem"), ("x86_64", "Conroe"), ("aarch64", "cortex-a53")]
FULL = os.environ.get("DECIDE_MATRIX") == "full"
CELLS = (
    [("x86_64", m) for m in emulation.X86_CPU_MODELS]
    + [("aarch64", m) for m in emulation.ARM_CPU_MODELS]
    if FULL else CI_CELLS
)
# Which tier each x86 model must land on (platforms/x86_64.json). Conroe and Penryn are below
# x86-64-v2: the baseline tier, whose numeric stack is numpy 1.26 (numpy 2.4 would SIGILL/refuse).
EXPECTED_X86_TIER = {"Conroe": "baseline", "Penryn": "baseline", "Nehalem": "v2-sse4.2",
                     "SandyBridge": "avx", "Haswell": "avx2", "max": "avx2"}
# platforms/aarch64.json: A53/A72 are ARMv8.0 (no dotprod), N1 has dotprod, qemu's max has i8mm.
EXPECTED_ARM_TIER = {"cortex-a53": "armv8.0", "cortex-a72": "armv8.0", "neoverse-n1": "dotprod",
                     "max": "i8mm"}


_BUNDLES: dict[str, emulation.Bundle] = {}


def bundle_for(arch: str) -> emulation.Bundle:
    """The unpacked zip of one architecture (unzipped once), or skip with how to build it."""
    if arch in _BUNDLES:
        return _BUNDLES[arch]
    try:
        qemu_user.ensure_qemu()
    except qemu_user.EmulationUnavailable as exc:
        pytest.skip(str(exc))
    zip_path = zip_of_this_tree(arch)
    _BUNDLES[arch] = emulation.unpack_bundle(zip_path, arch)
    return _BUNDLES[arch]


@pytest.mark.parametrize("arch,cpu", CELLS, ids=[f"{a}-{c}" for a, c in CELLS])
def test_cell(arch: str, cpu: str) -> None:
    bundle = bundle_for(arch)
    cell = emulation.run_cell(bundle, cpu, requests=3)
    print("\n" + emulation.format_table([cell]))
    assert cell.ok, cell.problems
    assert not cell.refused, f"{cpu} must be served: {cell.refused}"
    assert cell.selftest == "pass"
    assert cell.max_dp is not None and cell.max_dp <= cell.tolerance + 1e-6
    if arch == "x86_64" and cpu in EXPECTED_X86_TIER:
        assert cell.tier == EXPECTED_X86_TIER[cpu]
    if arch == "aarch64":
        assert cell.tier == EXPECTED_ARM_TIER[cpu], cell.flags
        assert ("asimddp" in cell.flags) == (cpu in ("neoverse-n1", "max"))
