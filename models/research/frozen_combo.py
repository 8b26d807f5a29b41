"""Frozen e5 layer combinations (from frozen_layers.py's saved features) + LR; val temperature → test calibration.

    python3 -m models.research.frozen_layers && python3 -m models.research.frozen_combo
"""

import numpy as np

from models.gate.calibration import fit_temperature
from models.research import harness

with np.load(harness.OUT / "frozen_layers_query.npz") as saved:
    FEATURES = {k: v.astype(np.float32) for k, v in saved.items()}
train, val = harness.split_train()
test = harness.load_rows("test.csv")
COMBINATIONS = [("L12", [11]), ("L10-12 concat", [9, 10, 11]), ("L6+L12", [5, 11]), ("L4-12 concat", list(range(3, 12)))]


def combined(split: str, layers: list[int]) -> np.ndarray:
    """The split's per-layer mean vectors of `layers`, concatenated and scaled to unit length."""
    return FEATURES[split][:, layers].reshape(len(FEATURES[split]), -1) / np.float32(np.sqrt(len(layers)))


for name, layers in COMBINATIONS:
    for reg in (1e-4, 1e-3):
        lv, lt = harness.logistic_regression(combined("train", layers), harness.y_of(train),
                                     [combined("val", layers), combined("test", layers)], reg)
        T = fit_temperature(lv, harness.y_of(val))
        print(name, reg, "val", round((lv.argmax(1) == harness.y_of(val)).mean(), 4),
              "test", round((lt.argmax(1) == harness.y_of(test)).mean(), 4), harness.calibration(lt, harness.y_of(test), T))
