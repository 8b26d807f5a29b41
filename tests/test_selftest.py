"""selftest's golden check on the tiny package and on the real model when present."""

import pytest

from runtime.engine import Engine
from runtime.package import load_package
from runtime.selftest import check_golden


@pytest.mark.parametrize("variant", ["fp32", "int8-u8u8"])
def test_golden_check_passes(tiny_package_dir, variant):
    result = check_golden(Engine(load_package(tiny_package_dir), variant))
    assert result.passed, result.problems
    assert result.examples == result.label_matches == 8
    assert result.max_prob_diff <= result.tolerance


def test_tolerance_is_enforced(tiny_package_dir):
    # The int8 stand-in is off by more than fp32's tolerance: checking it against 1e-5 must fail.
    engine = Engine(load_package(tiny_package_dir), "int8-u8u8")
    result = check_golden(engine)
    assert result.max_prob_diff > 1e-5


def test_real_model_selftest(real_model_dir):
    package = load_package(real_model_dir)
    for name in package.manifest.variants:
        result = check_golden(Engine(package, name))
        assert result.passed, (name, result.problems[:5])
