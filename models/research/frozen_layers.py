"""Frozen e5-small: mean-pooled hidden states of every layer + logistic regression (val; test with --test).

Tells how much each depth carries before any fine-tuning (a floor for students of k layers).
"""
import sys

import numpy as np
import torch
from tokenizers import Tokenizer

from models.assets import e5_tokenizer_file
from models.research import harness
from models.training.encoder import bert_from_e5

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
prefix = sys.argv[1] if len(sys.argv) > 1 else "query: "
clock = harness.Clock()
tok = Tokenizer.from_file(str(e5_tokenizer_file()))
tok.enable_truncation(128)
model = bert_from_e5()
train, val = harness.split_train()
test = harness.load_rows("test.csv")


F = {n: harness.layer_means(model, tok, [r["text"] for r in rows], prefix) for n, rows in (("train", train), ("val", val), ("test", test))}
harness.OUT.mkdir(parents=True, exist_ok=True)
np.savez(harness.OUT / f"frozen_layers_{prefix.strip(': ') or 'none'}.npz", **F)
emb = clock.read()
for layer in range(12):
    lv, lt = harness.logistic_regression(F["train"][:, layer], harness.y_of(train), [F["val"][:, layer], F["test"][:, layer]])
    pv, pt = lv.argmax(1), lt.argmax(1)
    harness.record(f"frozen e5 layers 1-{layer + 1} mean + LR, prefix={prefix!r}", {
        "val_acc": round(float((pv == harness.y_of(val)).mean()), 4), "val_min_lang": harness.per_language(val, pv, 10)["min_acc"],
        "test_acc": round(float((pt == harness.y_of(test)).mean()), 4), "test_min_lang": harness.per_language(test, pt)["min_acc"],
        "embed": emb})
