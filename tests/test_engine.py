"""Engine on the tiny package (labels, padding invariance, batching, checksum refusal) and on the
real default model when present (int8 vs FP32 agreement on the golden set)."""

import math
import random
import shutil

import numpy as np
import pytest

from runtime.engine.batching import PlannedBatch, plan_batches, spread_batches
from runtime.engine.engine import Engine, EngineLimits, SessionSettings
from runtime.package.load import PackageError, load_package, read_golden


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
    items = fp32_engine.encoder.tokenize(["rain", "goal goal match", "server pump"])
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


def plan_cost(plan, call_cost):
    return sum(call_cost + len(b.indices) * b.length for b in plan)


def test_plan_batches_merges_a_lone_text_into_the_next_bucket_when_cheaper():
    # one text of 3 and one of 5 tokens: one call at 6 (10 + 2×6) beats two calls (10+4 + 10+6)
    plan = plan_batches([3, 5], buckets=(4, 6, 8), call_cost_tokens=10)
    assert [(b.length, b.indices) for b in plan] == [(6, (0, 1))]
    # twenty short texts and one long one: padding the short ones to 128 would cost far more
    plan = plan_batches([3] * 20 + [100], buckets=(4, 128), call_cost_tokens=10)
    assert [(b.length, len(b.indices)) for b in plan] == [(4, 20), (128, 1)]


def all_merges(lengths):
    """Every way to cut the sorted bucket list into contiguous runs."""
    if not lengths:
        yield []
        return
    for cut in range(1, len(lengths) + 1):
        for rest in all_merges(lengths[cut:]):
            yield [lengths[:cut]] + rest


@pytest.mark.parametrize("seed", range(40))
def test_plan_batches_is_as_cheap_as_the_best_merge_found_by_brute_force(seed):
    rng = random.Random(seed)
    buckets = (4, 6, 8, 12, 16, 24, 32, 64, 128)
    counts = [rng.choice([rng.randint(2, 16), rng.randint(2, 128)]) for _ in range(rng.randint(1, 40))]
    max_batch, max_tokens, call_cost = rng.choice([2, 8, 32]), rng.choice([64, 512, 2048]), rng.choice([1, 10, 40])
    plan = plan_batches(counts, buckets, max_batch, max_tokens, call_cost)
    assert sorted(i for b in plan for i in b.indices) == list(range(len(counts)))
    for batch in plan:
        assert len(batch.indices) <= max(1, min(max_batch, max_tokens // batch.length))
        assert all(counts[i] <= batch.length for i in batch.indices)
    rows = {}
    for n in counts:
        bucket = next(b for b in buckets if n <= b)
        rows[bucket] = rows.get(bucket, 0) + 1
    best = math.inf
    for runs in all_merges(sorted(rows)):
        cost = 0
        for run in runs:
            length, n = run[-1], sum(rows[b] for b in run)
            per_batch = max(1, min(max_batch, max_tokens // length))
            cost += math.ceil(n / per_batch) * call_cost + n * length
        best = min(best, cost)
    assert plan_cost(plan, call_cost) == best


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
    from runtime.engine.engine import session_options

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


def test_concurrent_workers_give_the_same_answers_as_one_after_another(tiny_package_dir):
    """Workers run the batches of one call at once; nothing about an answer may change."""
    package = load_package(tiny_package_dir)
    serial = Engine(package, "fp32", SessionSettings(threads=1, workers=1))
    parallel = Engine(package, "fp32", SessionSettings(threads=1, workers=2), EngineLimits(max_batch=3))
    rng = random.Random(7)
    words = [g["text"] for g in read_golden(package)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(40)]
    for expected, got in zip(serial.classify(texts), parallel.classify(texts)):
        assert got.label == expected.label
        assert np.allclose(got.probs, expected.probs, atol=1e-6)


def test_spread_batches_halves_the_biggest_until_every_worker_has_one():
    plan = [PlannedBatch(8, tuple(range(16))), PlannedBatch(32, (16,))]
    spread = spread_batches(plan, 4)
    assert len(spread) == 4
    assert sorted(i for batch in spread for i in batch.indices) == list(range(17))
    assert all(batch.length == (32 if 16 in batch.indices else 8) for batch in spread)
    # 16×8 → 8 + 8, then the biggest by rows × length again (not the lone 32-token text): 4 + 4 + 8 + 1
    assert sorted(len(b.indices) for b in spread) == [1, 4, 4, 8]
    assert spread_batches([PlannedBatch(8, (0,))], 2) == [PlannedBatch(8, (0,))]  # one text cannot be split
    assert spread_batches(plan, 1) == plan
