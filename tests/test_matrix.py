"""The frozen bundle on emulated CPUs: tier, variant, selftest and parity per CPU model.

CI runs a subset (the 45-minute budget is shared): one old x86 (Nehalem, the x86-64-v2 floor),
one x86 below v2 (Conroe: legacy stack or a documented refusal, never SIGILL) and one ARM64
(cortex-a53, no dotprod). DECIDE_MATRIX=full runs every model; `python3 benchmarks/matrix.py`
prints the whole table. Tests skip with the reason when the zip they need has not been built.
"""

from __future__ import annotations

import os

import emulation
import pytest

CI_CELLS = [("x86_64", "Nehalem"), ("x86_64", "Conroe"), ("aarch64", "cortex-a53")]
FULL = os.environ.get("DECIDE_MATRIX") == "full"
CELLS = (
    [("x86_64", m) for m in emulation.X86_CPU_MODELS]
    + [("aarch64", m) for m in emulation.ARM_CPU_MODELS]
    if FULL else CI_CELLS
)
# Which tier each x86 model must land on (platforms/x86_64.json); below v2 is checked apart.
EXPECTED_X86_TIER = {"Nehalem": "v2-sse4.2", "SandyBridge": "avx", "Haswell": "avx2", "max": "avx2"}


_BUNDLES: dict[str, emulation.Bundle] = {}


def bundle_for(arch: str) -> emulation.Bundle:
    """The unpacked zip of one architecture (unzipped once), or skip with how to build it."""
    if arch in _BUNDLES:
        return _BUNDLES[arch]
    zip_path = emulation.find_zip(arch)
    if zip_path is None:
        build = "python build.py" + (" --arch aarch64" if arch == "aarch64" else "")
        pytest.skip(f"no dist/decide-*-linux-{arch}.zip: run `{build}` first")
    if arch == "aarch64" and not (emulation.ARM_LIBC_ROOT / "lib").exists():
        pytest.skip(f"no arm64 root at {emulation.ARM_LIBC_ROOT}: run bundle_spec/aarch64/make_root.sh")
    try:
        emulation.ensure_qemu()
    except emulation.EmulationUnavailable as exc:
        pytest.skip(str(exc))
    _BUNDLES[arch] = emulation.unpack_bundle(zip_path, arch)
    return _BUNDLES[arch]


@pytest.mark.parametrize("arch,cpu", CELLS, ids=[f"{a}-{c}" for a, c in CELLS])
def test_cell(arch: str, cpu: str) -> None:
    bundle = bundle_for(arch)
    cell = emulation.run_cell(bundle, cpu, requests=3)
    print("\n" + emulation.format_table([cell]))
    assert cell.ok, cell.problems
    if cell.refused:
        assert cpu in ("Conroe", "Penryn"), f"{cpu} must not be refused: {cell.refused}"
        return
    assert cell.selftest == "pass"
    assert cell.max_dp is not None and cell.max_dp <= cell.tolerance + 1e-6
    if arch == "x86_64" and cpu in EXPECTED_X86_TIER:
        assert cell.tier == EXPECTED_X86_TIER[cpu]
    if arch == "aarch64" and cpu == "cortex-a53":
        assert "asimddp" not in cell.flags
