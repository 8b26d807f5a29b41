"""selftest's golden check on the tiny package and on the real model when present."""

import pytest

from runtime.engine.engine import Engine
from runtime.package.load import load_package, read_golden
from runtime.selftest import run_golden


@pytest.mark.parametrize("variant", ["fp32", "int8-u8u8"])
def test_golden_check_passes(tiny_package_dir, variant):
    result = run_golden(Engine(load_package(tiny_package_dir), variant))
    assert result.passed, result.problems
    assert result.examples == result.label_matches == 8
    assert result.max_prob_diff <= result.tolerance


def test_tolerance_is_enforced(tiny_package_dir):
    # The int8 stand-in is off by more than fp32's tolerance: checking it against 1e-5 must fail.
    engine = Engine(load_package(tiny_package_dir), "int8-u8u8")
    result = run_golden(engine)
    assert result.max_prob_diff > 1e-5


def test_real_model_selftest(real_model_dir, host_tier):
    """Every variant this host's tier serves passes; the others are run and marked, not judged."""
    package = load_package(real_model_dir)
    served = [name for name in package.manifest.variants if name in host_tier.variants]
    assert served, f"tier {host_tier.name} serves none of {sorted(package.manifest.variants)}"
    for name in package.manifest.variants:
        result = run_golden(Engine(package, name), for_this_cpu=name in served)
        assert result.for_this_cpu == (name in served)
        if name in served:
            assert result.passed, (name, host_tier.name, result.problems[:5])
        else:
            assert result.summary().startswith("NOT FOR THIS CPU"), result.summary()


def _serve_on_this_host(package, variant, host_tier):
    if variant not in package.manifest.variants:
        pytest.skip(f"{variant} not published in the default package")
    if variant not in host_tier.variants:
        # Its own expected outputs were recorded with other int8 kernels (VNNI/ARM); here even an
        # intact copy differs from them, so a corruption would prove nothing. CI hosts with
        # AVX-512 VNNI, and the emulated ARM64 cell, run it.
        pytest.skip(f"{variant} is not served by this host's tier {host_tier.name} "
                    f"({', '.join(host_tier.variants)}): its corruption check runs where it is served")


def _corrupted_copy(real_model_dir, tmp_path, variant, pick, change):
    """A copy of the real package in which one quantized op of `variant` reads one changed
    quantization parameter (manifest checksums updated, so only selftest can notice).

    The changed value goes into a new initializer that only that op reads: in a package with shared
    weights (models/export/shared_weights.py) the int8 weights are quantized at load with the op's own scale
    and zero point, so changing the shared initializer would re-quantize them consistently and
    change nothing; the fault a factory could make is an op reading a parameter its weights were
    not quantized with."""
    import dataclasses
    import shutil

    import onnx
    from onnx import numpy_helper

    from runtime.package.load import file_entry
    from runtime.package.manifest import write_manifest

    copy = tmp_path / "package"
    shutil.copytree(real_model_dir, copy)
    path = copy / load_package(copy).manifest.variants[variant].file.file
    model = onnx.load(str(path), load_external_data=False)
    node, position = pick(model)
    name = node.input[position]
    init = next(i for i in model.graph.initializer if i.name == name)
    values = numpy_helper.to_array(init).copy()
    values.flat[5] = change(values.flat[5])
    model.graph.initializer.append(numpy_helper.from_array(values, name + "__changed"))
    node.input[position] = name + "__changed"
    onnx.save(model, str(path))
    manifest = load_package(copy).manifest
    entry = dataclasses.replace(manifest.variants[variant], file=file_entry(copy, path.name))
    write_manifest(copy, dataclasses.replace(manifest, variants={**manifest.variants, variant: entry}))
    return copy


def _node_input(op_type, occurrence, position):
    return lambda model: ([n for n in model.graph.node if n.op_type == op_type][occurrence], position)


@pytest.mark.parametrize("variant, pick, change", [
    # one per-channel weight scale of the first layer's QKV projection, 2 % off
    ("int8-u8s8", _node_input("QAttention", 0, 4), lambda v: v * 1.02),
    # one weight zero point of the second layer's QKV projection, off by one (moves outputs ~9e-3)
    ("int8-u8s8", _node_input("QAttention", 1, 7), lambda v: v + 1),
    # one weight zero point of the second MatMul (first FFN projection), off by one
    ("int8-u8u8", _node_input("MatMulIntegerToFloat", 1, 5), lambda v: v + 1),
    # one weight scale of the first MatMul (attention output projection), 2 % off
    ("int8-u8u8", _node_input("MatMulIntegerToFloat", 0, 3), lambda v: v * 1.02),
])
def test_corrupted_int8_variant_fails_selftest(real_model_dir, tmp_path, variant, pick, change, host_tier):
    package = load_package(real_model_dir)
    _serve_on_this_host(package, variant, host_tier)
    copy = _corrupted_copy(real_model_dir, tmp_path, variant, pick, change)
    result = run_golden(Engine(load_package(copy), variant))
    assert not result.passed
    # Labels and the loose FP32-reference bound let such a fault through; the comparison with
    # the variant's own expected outputs is what catches it.
    assert result.label_matches == result.examples
    assert result.max_prob_diff <= result.tolerance
    assert result.max_expected_diff > result.expected_tolerance
    assert any("own expected outputs" in p for p in result.problems)


def test_real_model_golden_has_each_variants_own_outputs(real_model_dir, host_tier):
    package = load_package(real_model_dir)
    golden = read_golden(package)
    for name, variant in package.manifest.variants.items():
        assert variant.expected_tolerance is not None and variant.expected_tolerance <= 1e-2, name
        assert all(set(g["expected"][name]) == {"alone", "batched"} for g in golden), name
        if name not in host_tier.variants:
            continue  # recorded with other int8 kernels than this host has (see _serve_on_this_host)
        result = run_golden(Engine(package, name))
        assert result.max_expected_diff is not None and result.max_expected_diff <= variant.expected_tolerance
