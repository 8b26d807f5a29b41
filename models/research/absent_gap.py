"""Where a machine-alarms student loses the languages its training lacks (issue 22).

One logistic regression (models.training.distill.fit_linear on the recipe's training split, no
standardisation) over each feature set, leaning accuracy (best case label) on the validation files
(dev, dev absent: where choices are made) and, for the record only, on the held-out cases:

- teacher-full / teacher-table: frozen 12-layer e5-small, masked means of chosen layers, with the
  full vocabulary or with the recipe's own word table (what the student reads);
- student-*: a package's student, from its own FP32 graph: the pooled head's input, the masked mean
  of each of its layers.

If the student's own features fall short of its teacher's on the same word table, the loss is in
the student's layers, not in the table or the head.

    python -m models.research.absent_gap [--package models/packages/machine-alarms] [--teacher-layers 4,6,6+12] [--student-only]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from models.research.ceiling import evaluation_sets, frozen_teacher
from models.research.harness import OUT, Clock, record

SPLITS = ("dev", "dev_absent", "test")
HIDDEN = 384  # e5-small's width


def teacher_layer_means(prepared, recipe, full_vocabulary: bool, texts: list[str]) -> np.ndarray:
    """[texts, 12, 384] L2-normalised masked means of every e5 layer (models.research.harness)."""
    from models.research.harness import layer_means
    from models.training.distill import TEACHER_PREFIX

    model, tokenizer = frozen_teacher(recipe, prepared, full_vocabulary)
    return layer_means(model, tokenizer, texts, TEACHER_PREFIX)


def student_features(package: Path, texts: list[str]) -> tuple[np.ndarray, int, int]:
    """The package's FP32 graph: the head's input and the masked mean of each layer's output, joined;
    the head input's width and the number of layers."""
    import onnx
    import onnxruntime as ort

    from runtime.engine.batching import pad_batch
    from runtime.engine.text import TextEncoder

    manifest = json.loads((package / "manifest.json").read_text())
    graph = package / manifest["variants"]["fp32"]["file"]["file"]
    model = onnx.load(str(graph), load_external_data=False)
    layers = sorted(((n.input[2], n.output[0]) for n in model.graph.node if n.op_type == "SkipLayerNormalization"
                     and n.input[2].endswith(".output.LayerNorm.weight")),
                    key=lambda item: int(item[0].split(".layer.")[1].split(".")[0]))
    head = next(n.input[0] for n in model.graph.node if n.op_type == "Gemm" and n.input[1].endswith("head.mlp.1.weight"))
    names = [head] + [out for _, out in layers]
    for name in names:
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    probe = graph.with_name(f".absent-gap-{graph.name}")
    onnx.save(model, str(probe))  # beside the graph: its external data resolves
    try:
        session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
        encoder = TextEncoder.shared((package / "tokenizer.json").read_text(encoding="utf-8"),
                                     manifest["max_length"], manifest["pad_id"])
        rows = []
        for start in range(0, len(texts), 32):
            items = encoder.tokenize(texts[start:start + 32])
            ids, mask = pad_batch(items, max(len(item.ids) for item in items), manifest["pad_id"])
            out = session.run(names, {"input_ids": ids, "attention_mask": mask})
            weights = mask[..., None].astype(np.float32)
            means = [(o * weights).sum(1) / weights.sum(1) for o in out[1:]]
            rows.append(np.concatenate([out[0], *means], axis=1))
    finally:
        probe.unlink(missing_ok=True)
    features = np.concatenate(rows)
    return features, features.shape[1] - HIDDEN * len(layers), len(layers)


def score(x_train, y_train, evals, labels, negatives, trained, reg) -> dict:
    from models.training.distill import fit_linear

    weight, bias = fit_linear(x_train, y_train, len(labels), reg)
    case_ix = [i for i, label in enumerate(labels) if label not in negatives]
    result = {}
    for split, (x, examples) in evals.items():
        logits = x @ weight.T + bias
        right = np.array([labels[case_ix[j]] == e.label for j, e in zip(logits[:, case_ix].argmax(1), examples)])
        absent = np.array([e.language not in trained for e in examples])
        by_lang = defaultdict(list)
        for r, e in zip(right, examples):
            if e.language not in trained:
                by_lang[e.language].append(r)
        result[split] = {"acc": round(float(right.mean()), 4),
                         "absent": round(float(right[absent].mean()), 4) if absent.any() else None,
                         "absent_by_lang": {k: round(float(np.mean(v)), 3) for k, v in sorted(by_lang.items())}}
    return result


def main() -> None:
    import torch

    from models.data.recipe_data import label_ids, prepare_data
    from models.data.recipes import load_recipe

    parser = argparse.ArgumentParser()
    parser.add_argument("--package", type=Path, default=Path("models/packages/machine-alarms"))
    parser.add_argument("--teacher-layers", default="4,6,6+12", help="e5 layers (1-12) whose means are joined, per set")
    parser.add_argument("--reg", type=float, default=1e-3)
    parser.add_argument("--student-only", action="store_true", help="skip the teacher's sets")
    args = parser.parse_args()
    torch.set_num_threads(2)
    recipe = load_recipe("machine-alarms")
    prepared = prepare_data(recipe)
    labels, negatives = prepared.labels, set(recipe.negative_labels)
    train = prepared.splits.train
    trained = {e.language for e in train if e.label not in negatives}
    y_train = label_ids(train, labels)
    sets = evaluation_sets()
    everything = [e.text for e in train] + [e.text for split in SPLITS for e in sets[split]]
    bounds = np.cumsum([0, len(train)] + [len(sets[s]) for s in SPLITS])

    def split_up(x: np.ndarray, columns) -> tuple[np.ndarray, dict]:
        parts = [x[bounds[i]:bounds[i + 1]][:, columns] for i in range(len(bounds) - 1)]
        return parts[0], {s: (parts[i + 1], sets[s]) for i, s in enumerate(SPLITS)}

    for source in () if args.student_only else ("teacher-full", "teacher-table"):
        clock = Clock()
        means = teacher_layer_means(prepared, recipe, source == "teacher-full", everything)
        for spec in args.teacher_layers.split(","):
            taps = [int(t) for t in spec.split("+")]
            flat = np.concatenate([means[:, t - 1] for t in taps], axis=1)
            x_train, evals = split_up(flat, slice(None))
            record(f"absent-gap-{source}-L{spec}", {**score(x_train, y_train, evals, labels, negatives, trained, args.reg),
                                                    **clock.read()})
    clock = Clock()
    features, head_width, layer_count = student_features(args.package, everything)
    columns = {"head-input": slice(0, head_width),
               "last-two-layer-means": slice(head_width + HIDDEN * (layer_count - 2), None),
               "all-layer-means": slice(head_width, None),
               "everything": slice(None)}
    for name, cols in columns.items():
        x_train, evals = split_up(features, cols)
        record(f"absent-gap-student-{name}", {"package": str(args.package),
                                              **score(x_train, y_train, evals, labels, negatives, trained, args.reg),
                                              **clock.read()})
    print(f"results in {OUT / 'results.jsonl'}")


if __name__ == "__main__":
    main()
