"""Frozen e5 layer combinations (from frozen_layers.py features) + LR; val temperature -> test calibration."""
import numpy as np, torch
from models.research.common import *
torch.set_num_threads(1)
F = {k: v.astype(np.float32) for k, v in np.load("/tmp/mx/frozen_layers_query.npz").items()}
train, val = split_train(); test = load_rows("test.csv")
def lr_fit(X, y, Xs, reg=1e-4):
    W = torch.zeros(X.shape[1], len(LABELS), requires_grad=True); b = torch.zeros(len(LABELS), requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=500); Xt, Yt = torch.tensor(X), torch.tensor(y)
    def closure():
        opt.zero_grad(); l = torch.nn.functional.cross_entropy(Xt @ W * 20 + b, Yt) + reg * (W ** 2).sum(); l.backward(); return l
    opt.step(closure); return [(torch.tensor(x) @ W * 20 + b).detach().numpy() for x in Xs]
for name, sel in [("L12", [11]), ("L10-12 concat", [9,10,11]), ("L6+L12", [5,11]), ("L4-12 concat", list(range(3,12)))]:
    f = lambda s: F[s][:, sel].reshape(len(F[s]), -1) / np.float32(np.sqrt(len(sel)))
    for reg in (1e-4, 1e-3):
        lv, lt = lr_fit(f("train"), y_of(train), [f("val"), f("test")], reg)
        T = fit_temperature(lv, y_of(val))
        print(name, reg, "val", round((lv.argmax(1)==y_of(val)).mean(),4), "test", round((lt.argmax(1)==y_of(test)).mean(),4), calibration(lt, y_of(test), T))
