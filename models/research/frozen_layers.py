"""Frozen e5-small: mean-pooled hidden states of every layer + logistic regression (val; test with --test).

Tells how much each depth carries before any fine-tuning (a floor for students of k layers).
"""
import sys
import numpy as np
import torch
from tokenizers import Tokenizer

from models.encoder import bert_from_e5, e5_tokenizer_file
from models.research.common import (Clock, LABELS, load_rows, per_language, record, split_train, y_of)

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
prefix = sys.argv[1] if len(sys.argv) > 1 else "query: "
clock = Clock()
tok = Tokenizer.from_file(str(e5_tokenizer_file()))
tok.enable_truncation(128)
model = bert_from_e5()
train, val = split_train()
test = load_rows("test.csv")


@torch.no_grad()
def layer_means(texts):
    out = []
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    res = [None] * len(texts)
    for s in range(0, len(order), 64):
        idx = order[s:s + 64]
        enc = tok.encode_batch([prefix + texts[i] for i in idx])
        w = max(len(e.ids) for e in enc)
        ids = torch.tensor([e.ids + [1] * (w - len(e.ids)) for e in enc])
        m = (torch.arange(w)[None, :] < torch.tensor([len(e.ids) for e in enc])[:, None]).long()
        hs = model(input_ids=ids, attention_mask=m, output_hidden_states=True).hidden_states
        v = torch.stack([(h * m[..., None]).sum(1) / m.sum(1, keepdim=True) for h in hs[1:]], 1)  # [b,12,384]
        v = torch.nn.functional.normalize(v, dim=-1).numpy()
        for r, i in enumerate(idx):
            res[i] = v[r]
    return np.stack(res)


def lr_fit(X, y, Xs):
    W = torch.zeros(X.shape[1], len(LABELS), requires_grad=True)
    b = torch.zeros(len(LABELS), requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=500)
    Xt, Yt = torch.tensor(X), torch.tensor(y)
    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(Xt @ W * 20 + b, Yt) + 1e-4 * (W ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return [(torch.tensor(x) @ W * 20 + b).detach().numpy() for x in Xs]


F = {n: layer_means([r["text"] for r in rows]) for n, rows in (("train", train), ("val", val), ("test", test))}
np.savez(f"/tmp/mx/frozen_layers_{prefix.strip(': ') or 'none'}.npz", **F)
emb = clock.read()
for layer in range(12):
    lv, lt = lr_fit(F["train"][:, layer], y_of(train), [F["val"][:, layer], F["test"][:, layer]])
    pv, pt = lv.argmax(1), lt.argmax(1)
    record(f"frozen e5 layers 1-{layer + 1} mean + LR, prefix={prefix!r}", {
        "val_acc": round(float((pv == y_of(val)).mean()), 4), "val_min_lang": per_language(val, pv, 10)["min_acc"],
        "test_acc": round(float((pt == y_of(test)).mean()), 4), "test_min_lang": per_language(test, pt)["min_acc"],
        "embed": emb})
