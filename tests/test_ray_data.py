"""Ray Data: the same package answers the same on a local 2-CPU Ray instance as `decide score`.

Ray is an optional extra, installed in CI through the `dev` extra. Without it these tests skip
with the reason in pytest's summary; under DECIDE_STRICT=1 (CI) a missing Ray is a failure, so a
green CI run has run them (docs/testing.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_score import BROKEN_CSV_TAIL, long_records, texts, write_jsonl, write_records

REPO = Path(__file__).resolve().parent.parent

try:
    import pyarrow.parquet as pq
    import ray
    import ray.data
except ImportError as exc:  # skipped loudly: the reason shows in the -ra summary
    if os.environ.get("DECIDE_STRICT") == "1":
        raise RuntimeError(f"DECIDE_STRICT=1: Ray Data must be installed for CI (the dev extra): {exc}") from exc
    pytest.skip(f"Ray Data not installed ({exc}): pip install 'decide-classifier[ray]'", allow_module_level=True)


def rows_by_id(path: Path) -> dict:
    table = pq.read_table(path)  # a file, or Ray's directory of files
    return {row["id"]: row for row in table.to_pylist()}


def test_decide_score_on_ray_answers_like_decide_score(tiny_scoped_package_dir, tmp_path):
    records = [{"id": f"r{i}", "text": t} for i, t in enumerate(texts(2000, seed=7) + ["hello and thanks"])]
    records += [{"id": "empty", "text": ""}, {"id": "null", "text": None}]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    common = ["--model", str(tiny_scoped_package_dir), "--variant", "fp32", "-q"]
    local = subprocess.run([sys.executable, "-m", "runtime", "score", str(source), "--output",
                            str(tmp_path / "local.parquet"), *common], cwd=REPO, capture_output=True, text=True,
                           timeout=120, check=False)
    assert local.returncode == 0, local.stderr
    on_ray = subprocess.run([sys.executable, "-m", "runtime", "score", str(source), "--output",
                             str(tmp_path / "ray.parquet"), "--ray", "local", *common], cwd=REPO,
                            capture_output=True, text=True, timeout=600, check=False)
    assert on_ray.returncode == 0, on_ray.stderr
    assert (tmp_path / "ray.parquet").is_dir() and not list(tmp_path.glob(".ray.parquet*"))
    expected, got = rows_by_id(tmp_path / "local.parquet"), rows_by_id(tmp_path / "ray.parquet")
    assert sorted(got) == sorted(expected) and len(got) == len(records)
    for key, row in expected.items():
        other = got[key]
        assert (other["label"], other["leaning"], other["reason"], other["abstained"]) == (
            row["label"], row["leaning"], row["reason"], row["abstained"]), key
        assert (row["score"] is None and other["score"] is None) or abs(other["score"] - row["score"]) <= 1e-6
        assert (other["error"] or "").split(":")[0] == (row["error"] or "").split(":")[0]
    assert expected["r2000"]["reason"] == "out_of_scope" and expected["empty"]["error"].startswith("empty_text")
    again = subprocess.run([sys.executable, "-m", "runtime", "score", str(source), "--output",
                            str(tmp_path / "ray.parquet"), "--ray", "local", "--resume", *common], cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 2 and "--resume is not available with --ray" in again.stderr


def test_the_predictor_with_a_shipped_package_in_map_batches(tiny_package_dir):
    """The documented UDF: ds.map_batches(DecidePredictor, fn_constructor_kwargs={"package": ...})."""
    from runtime import Classifier
    from runtime.score.ray_data import DecidePredictor, ship_package

    items = texts(500, seed=8)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(items)], override_num_blocks=4)
        scored = ds.map_batches(DecidePredictor, fn_constructor_kwargs={"package": ship_package(tiny_package_dir, "fp32")},
                                compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=128)
        rows = {row["id"]: row for row in scored.take_all()}
    finally:
        ray.shutdown()
    answers = Classifier.load(tiny_package_dir, variant="fp32", threads=1).classify(items)
    assert sorted(rows) == list(range(len(items)))
    assert [(rows[i]["label"], rows[i]["score"]) for i in range(len(items))] == [
        (a.label, json.loads(json.dumps(round(a.score, 6)))) for a in answers]


def test_ray_reads_long_fields_and_broken_records_as_decide_score_does(real_model_dir, tmp_path):
    """Issue 38: a CSV with a 200 KB and a 5 MB field (pyarrow's CSV reader failed the whole job on
    the 5 MB one, and on a short row) and broken records: with --ray local every record comes back
    with its id and the answer or error row decide score gives it."""
    source = write_records(tmp_path / "in.csv", long_records(), BROKEN_CSV_TAIL)
    common = ["--model", str(real_model_dir), "--variant", "fp32", "-q"]
    runs = {}
    for name, extra in (("local", []), ("ray", ["--ray", "local"])):
        done = subprocess.run([sys.executable, "-m", "runtime", "score", str(source), "--output",
                               str(tmp_path / f"{name}.parquet"), *extra, *common], cwd=REPO, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        runs[name] = rows_by_id(tmp_path / f"{name}.parquet")
    expected, got = runs["local"], runs["ray"]
    assert sorted(got) == sorted(expected) == sorted(["r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "", "r10"])
    for key, row in expected.items():
        other = got[key]
        assert [other[f] for f in ("label", "leaning", "reason", "abstained", "truncated")] == [
            row[f] for f in ("label", "leaning", "reason", "abstained", "truncated")], key
        assert (row["score"] is None and other["score"] is None) or abs(other["score"] - row["score"]) <= 1e-5
        assert other["error"] == row["error"], key
    assert expected["r3"]["truncated"] and expected["r7"]["error"].startswith("invalid_request: record 7: not CSV")
