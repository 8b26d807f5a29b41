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
        check=False, cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads((out / "compare.json").read_text())
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"bare ORT int8-u8u8", "bare ORT fp32", "decide in-process int8-u8u8",
                         "decide in-process fp32", "decide stdin int8-u8u8", "decide stdin fp32"}
    for row in rows.values():
        assert not row["skipped"], row
        assert row["cells"]["short/1"]["items_per_s"] > 0 and row["cells"]["medium/4"]["calls"] >= 3
        assert row["peak_rss_kb"] >= row["rss_after_warm_up_kb"] > 0
        # every contender computes the same model: same labels as the FP32 reference
        done, total = row["agreement"]["argmax_agree"].split("/")
        assert done == total and int(total) > 0
    assert report["slow_leak"]["requests"] == 300
    assert any(t["target"].startswith("decide stdin int8-u8u8 per-request overhead") for t in report["targets"])
    table = (out / "compare.md").read_text()
    assert "| decide stdin int8-u8u8 |" in table and "CPU flags" in table and f"onnxruntime {metadata.version('onnxruntime')}" in table
    assert (out / "compare.png").stat().st_size > 10_000


def _row(system: str, precision: str, kind: str, speeds: dict[str, float]) -> dict:
    cells = {cell: {"items_per_s": v, "p50_ms": 1000 / v} for cell, v in speeds.items()}
    return {"system": system, "name": system.rsplit(" ", 2)[0], "precision": precision, "system_kind": kind,
            "skipped": "", "cells": cells}


def test_headline_takes_pytorch_at_its_best_thread_count_per_workload() -> None:
    # 1 thread wins at batch 1, 2 threads win batched: each ORT row is compared with the winner of that cell
    speeds = {"fp32 1t": {"short/1": 50, "short/32": 100}, "fp32 2t": {"short/1": 40, "short/32": 160}}
    rows = [_row(f"PyTorch eager {k}", "fp32", "torch", v) for k, v in speeds.items()]
    rows.append(_row("decide in-process fp32", "fp32", "engine", {"short/1": 200, "short/32": 320}))
    segments = {(r["system"], "short", b): [{"ms": [1000 / r["cells"][f"short/{b}"]["items_per_s"] * b] * 4,
                                             "wall_s": 4 / r["cells"][f"short/{b}"]["items_per_s"] * b, "cpu_s": 0.0}]
                for r in rows for b in (1, 32)}
    report = {"settings": {"batches": [1, 32]}, "texts": {"short": {}}, "rows": rows,
              "ratios": [compare.ratio(segments, "decide in-process fp32", r["system"], "short", b)
                         for r in rows[:2] for b in (1, 32)]}
    head = compare.headline(report)
    assert head["torch_best"]["fp32"] == {"short/1": "PyTorch eager fp32 1t", "short/32": "PyTorch eager fp32 2t"}
    decide = next(r for r in head["rows"] if r["system"] == "decide in-process fp32")
    assert decide["cells"]["short/1"]["vs_torch_fp32"] == 4.0 and decide["cells"]["short/32"]["vs_torch_fp32"] == 2.0
    assert decide["cells"]["short/1"]["vs_torch_int8"] is None  # no PyTorch int8 row measured


def test_pytorch_contender_computes_what_the_package_computes(real_model_dir: Path) -> None:
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from benchmarks.torch_model import dynamic_int8, torch_classifier, torch_logits
    from models.gate.calibration import softmax_t as softmax
    from models.gate.measure import classify_probs, uncalibrated
    from runtime.engine.engine import Engine
    from runtime.package.load import load_package, read_golden

    package = load_package(real_model_dir)
    texts = [g["text"] for g in read_golden(package)]
    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    seqs = [e.ids for e in tokenizer.encode_batch(texts)]
    pad = package.manifest.pad_id
    # the package's FP32 variant as the runtime runs it, without the temperature PyTorch does not apply
    onnx_fp32 = classify_probs(Engine(uncalibrated(package), "fp32"), texts)
    model = torch_classifier(package)
    # the same weights: PyTorch FP32 equals ORT FP32 up to float rounding
    assert np.abs(softmax(torch_logits(model, seqs, pad)) - onnx_fp32).max() < 1e-4
    # ... also saved whole and loaded again, as compare.py hands it to its PyTorch worker
    import io

    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    reloaded = torch.load(buffer, weights_only=False).eval()
    assert np.abs(softmax(torch_logits(reloaded, seqs, pad)) - onnx_fp32).max() < 1e-4
    # PyTorch's dynamic int8 is a real int8 model of the same weights: every nn.Linear replaced by
    # its dynamic quantized form, not equal to FP32, most golden labels kept. (On machine-alarms
    # 2.0.0 its per-call activation scales cost 12 points on test.csv — benchmarks/int8.py torch.)
    quantized = dynamic_int8(torch_classifier(package))
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    int8 = softmax(torch_logits(quantized, seqs, pad))
    assert np.abs(int8 - onnx_fp32).max() > 1e-4
    assert (int8.argmax(1) == onnx_fp32.argmax(1)).mean() >= 0.6
