"""CPU probe: fake CPUs parse, OS-disabled AVX is dropped, the real probe is sane and numpy-free."""

import platform
import subprocess
import sys

from runtime.cpu import (
    drop_unusable_vector_flags,
    hwcap_flags,
    normalise_arch,
    parse_fake_cpu,
    probe,
    usable_cores,
)


def test_fake_cpu_spec_is_parsed():
    features = parse_fake_cpu("AMD64: SSE4_2, popcnt ,avx2", cores=3)
    assert features.arch == "x86_64"
    assert features.flags == {"sse4_2", "popcnt", "avx2"}
    assert features.usable_cores == 3 and features.source == "fake"


def test_arch_spellings_are_normalised():
    assert normalise_arch("arm64") == "aarch64"
    assert normalise_arch("x86_64") == "x86_64"
    assert normalise_arch("riscv64") == "riscv64"


def test_avx_flags_dropped_when_os_does_not_save_ymm_state():
    flags = {"sse4_2", "osxsave", "xcr0", "avx", "avx2", "fma", "avx512f", "avx_vnni"}  # no os_avx
    assert drop_unusable_vector_flags(flags) == {"sse4_2", "osxsave", "xcr0"}


def test_avx512_dropped_when_os_saves_only_ymm_state():
    flags = {"osxsave", "xcr0", "os_avx", "avx", "avx2", "avx512f", "avx512vnni"}
    assert drop_unusable_vector_flags(flags) == {"osxsave", "xcr0", "os_avx", "avx", "avx2"}


def test_flags_kept_when_xgetbv_could_not_run():
    flags = {"osxsave", "avx", "avx2"}  # MLAS re-checks XCR0 itself; a wrong guess costs speed only
    assert drop_unusable_vector_flags(flags) == flags


def test_no_osxsave_means_no_avx():
    assert drop_unusable_vector_flags({"sse4_2", "avx"}) == {"sse4_2"}


def test_real_probe_matches_this_machine(monkeypatch):
    monkeypatch.delenv("DECIDE_FAKE_CPU", raising=False)
    features = probe()
    assert features.arch == normalise_arch(platform.machine())
    assert features.usable_cores == usable_cores() >= 1
    if features.arch == "x86_64":
        assert features.source == "cpuid"
        assert {"sse2", "sse4_2", "popcnt"} <= features.flags  # numpy 2.4 already runs here


def test_probe_imports_no_numeric_stack():
    code = "import sys; from runtime.cpu import probe; probe(); print('numpy' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_arm64_hwcap_bits_map_to_feature_names():
    # Bits from <asm/hwcap.h>: HWCAP_ASIMD = 1 << 1, HWCAP_ASIMDDP = 1 << 20, HWCAP2_I8MM = 1 << 13.
    assert hwcap_flags(0b11, 0) == {"fp", "asimd"}  # Cortex-A53
    assert hwcap_flags(0b11 | 1 << 20, 0) == {"fp", "asimd", "asimddp"}  # Neoverse-N1
    assert {"asimddp", "sve", "i8mm", "bf16"} <= hwcap_flags(0b11 | 1 << 20 | 1 << 22, 1 << 13 | 1 << 14)
