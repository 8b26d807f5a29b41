"""Engine on the tiny package (labels, padding invariance, batching, checksum refusal) and on the
real default model when present (int8 vs FP32 agreement on the golden set)."""

import shutil

import numpy as np
import pytest

from runtime.batching import plan_batches
from runtime.engine import Engine, EngineLimits, SessionSettings
from runtime.package import PackageError, load_package, read_golden


@pytest.fixture(scope="module")
def fp32_engine(tiny_package_dir):
    engine = Engine(load_package(tiny_package_dir), "fp32", SessionSettings(threads=1))
    engine.warm_up()
    return engine


def test_golden_labels_and_reference_probabilities(fp32_engine):
    golden = read_golden(fp32_engine.package)
    results = fp32_engine.classify([g["text"] for g in golden])
    assert [r.label for r in results] == [g["label"] for g in golden]
    for result, example in zip(results, golden):
        assert np.allclose(result.probs, example["probs"], atol=1e-6)
        assert result.score == max(result.probs)


def test_bucket_padding_does_not_change_results(fp32_engine):
    items = fp32_engine.encoder.encode(["rain", "goal goal match", "server pump"])
    at_16 = fp32_engine.run_padded(items, 16)
    at_24 = fp32_engine.run_padded(items, 24)
    exact = np.vstack([fp32_engine.run_padded([item], len(item.ids)) for item in items])
    assert np.allclose(at_16, at_24, atol=1e-6) and np.allclose(at_16, exact, atol=1e-6)


def test_mixed_lengths_come_back_in_input_order(tiny_package_dir):
    engine = Engine(load_package(tiny_package_dir), "fp32", limits=EngineLimits(max_batch=2))
    texts = ["rain", " ".join(["goal"] * 30), "server", "sun " * 10, "match", "code code"]
    results = engine.classify(texts)
    assert [r.label for r in results] == ["weather", "sports", "tech", "weather", "sports", "tech"]
    assert [r.truncated for r in results] == [False, True, False, False, False, False]


def test_plan_batches_groups_by_bucket_and_respects_limits():
    plan = plan_batches([3, 40, 5, 20, 7, 100], buckets=(16, 32, 64, 128), max_batch=2, max_batch_tokens=128)
    assert [(b.length, b.indices) for b in plan] == [(16, (0, 2)), (16, (4,)), (32, (3,)), (64, (1,)), (128, (5,))]
    assert sorted(i for b in plan for i in b.indices) == list(range(6))


def test_checksum_mismatch_is_refused_naming_the_file(tiny_package_dir, tmp_path):
    copy = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    data = bytearray((copy / "fp32.data").read_bytes())
    data[0] ^= 0xFF  # same size, different content
    (copy / "fp32.data").write_bytes(bytes(data))
    with pytest.raises(PackageError, match=r"checksum mismatch for .*fp32\.data"):
        Engine(load_package(copy), "fp32")
    Engine(load_package(copy), "int8-u8u8")  # the other variant does not use that file


def test_missing_model_file_is_refused(tiny_package_dir, tmp_path):
    copy = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    (copy / "int8-u8u8.onnx").unlink()
    with pytest.raises(PackageError, match="int8-u8u8.onnx"):
        Engine(load_package(copy), "int8-u8u8")


def test_unknown_variant_is_refused(tiny_package_dir):
    with pytest.raises(PackageError, match="int8-u8s8"):
        Engine(load_package(tiny_package_dir), "int8-u8s8")


def test_spinning_flag_reaches_session_options():
    from runtime.engine import session_options

    assert session_options(SessionSettings(spinning=False)).get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"
    assert session_options(SessionSettings(spinning=True, threads=2)).intra_op_num_threads == 2


def test_real_model_int8_agrees_with_fp32_on_golden_set(real_model_dir):
    package = load_package(real_model_dir)
    golden = read_golden(package)
    assert golden, "the real model must ship a golden set"
    texts = [g["text"] for g in golden]
    fp32 = Engine(package, "fp32").classify(texts)
    assert [r.label for r in fp32] == [g["label"] for g in golden]
    int8_names = [name for name in package.manifest.variants if name.startswith("int8")]
    if not int8_names:
        pytest.skip("the real model has no int8 variant (every int8 variant failed its gate)")
    for name in int8_names:
        results = Engine(package, name).classify(texts)
        agree = sum(a.label == b.label for a, b in zip(results, fp32))
        assert agree == len(golden), f"{name}: {agree}/{len(golden)} labels agree with fp32"
        worst = max(abs(p - q) for r, g in zip(results, golden) for p, q in zip(r.probs, g["probs"]))
        assert worst <= package.manifest.variants[name].golden_tolerance
