"""benchmarks/compare.py on the tiny package: a short real run writes the table, the JSON and the plot."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from benchmarks import compare

REPO = Path(__file__).resolve().parent.parent


def test_text_sets_are_short_and_medium(tiny_package_dir: Path) -> None:
    package = compare.load_package(tiny_package_dir)
    texts = compare.text_sets(package)
    short = compare.token_stats(package, texts["short"])
    medium = compare.token_stats(package, texts["medium"])
    assert short["max"] <= compare.SHORT_TOKENS
    # the tiny model's max length (24) caps the medium texts
    assert medium["min"] == medium["max"] == package.manifest.max_length


def test_ratio_is_taken_within_rounds() -> None:
    fast = [{"ms": [1.0] * 10, "wall_s": 0.01, "cpu_s": 0.01}, {"ms": [2.0] * 10, "wall_s": 0.02, "cpu_s": 0.02}]
    slow = [{"ms": [2.0] * 10, "wall_s": 0.02, "cpu_s": 0.02}, {"ms": [4.0] * 10, "wall_s": 0.04, "cpu_s": 0.04}]
    segments = {("a", "short", 1): fast, ("b", "short", 1): slow}
    r = compare.ratio(segments, "a", "b", "short", 1)
    # each round shows a 2× speed-up although the load doubled between rounds
    assert r["rounds"] == [2.0, 2.0] and r["throughput_ratio"] == 2.0 and r["p50_ratio"] == 2.0
    assert compare.ratio(segments, "a", "missing", "short", 1) is None


def test_compare_smoke_run(tiny_package_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare.py"), "--model", str(tiny_package_dir), "--out", str(out),
         "--systems", "bare,engine,decide stdin", "--rounds", "1", "--seconds", "0.05", "--batches", "1,4",
         "--cold-runs", "1", "--leak-requests", "300", "--bundle", str(tmp_path / "no-such.zip")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads((out / "compare.json").read_text())
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"bare ORT int8", "bare ORT fp32", "decide in-process int8", "decide in-process fp32",
                         "decide stdin int8", "decide stdin fp32"}
    for row in rows.values():
        assert not row["skipped"], row
        assert row["cells"]["short/1"]["items_per_s"] > 0 and row["cells"]["medium/4"]["calls"] >= 3
        assert row["peak_rss_kb"] >= row["rss_after_warm_up_kb"] > 0
        # every contender computes the same model: same labels as the FP32 reference
        done, total = row["agreement"]["argmax_agree"].split("/")
        assert done == total and int(total) > 0
    assert report["slow_leak"]["requests"] == 300
    assert any(t["target"].startswith("decide stdin int8 per-request overhead") for t in report["targets"])
    table = (out / "compare.md").read_text()
    assert "| decide stdin int8 |" in table and "CPU flags" in table and f"onnxruntime {metadata.version('onnxruntime')}" in table
    assert (out / "compare.png").stat().st_size > 10_000
