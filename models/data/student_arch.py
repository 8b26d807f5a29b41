"""A feature-distilled student's shape and head as recipe data (`student_arch`, `head`), checked torch-free.

`python -m models train` checks a recipe before torch loads (models/data/recipes.py), so the shape of
the conv-attention hybrid (models/training/hybrid.py builds it) and the head names live here, without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEADS = ("mean-linear", "pooled-mlp")  # models/training/heads.py fits the second
KINDS = ("transformer", "hybrid")
FUSIONS = ("none", "gated")
E5_LAYERS = 12
E5_FFN = 1536


@dataclass(frozen=True)
class HybridShape:
    """The hybrid student's shape, from the recipe's `student_arch` (see `parse_student_arch`)."""

    conv_layers: int
    attention_layers: int
    kernel: int = 5
    conv_ffn: int = E5_FFN
    fusion: str = "none"
    conv_init: tuple[int, ...] = ()
    attention_init: tuple[int, ...] = ()

    @property
    def layers(self) -> int:
        return self.conv_layers + self.attention_layers


def spread_layers(count: int, total: int = E5_LAYERS) -> tuple[int, ...]:
    """`count` e5 layer indices spread from the first to the last (4 → 0, 4, 8, 11, today's student)."""
    if count == 1:
        return (total - 1,)
    return tuple(math.ceil(i * (total - 1) / (count - 1)) for i in range(count))


def parse_student_arch(data: dict | None) -> HybridShape | None:
    """The recipe's `student_arch` checked: None/{} or kind "transformer" → None (today's student,
    layers from `student_layers`); kind "hybrid" → its HybridShape. Raises ValueError naming the key."""
    if not data:
        return None
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in KINDS:
        raise ValueError(f"student_arch.kind must be one of {', '.join(map(repr, KINDS))}, not {kind!r}")
    if kind == "transformer":
        if data:
            raise ValueError(f"student_arch of kind 'transformer' takes no other keys (got {', '.join(sorted(data))}); "
                             "its layers are student_layers")
        return None
    known = {"conv_layers", "attention_layers", "kernel", "conv_ffn", "fusion", "conv_init", "attention_init"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown student_arch keys: {', '.join(sorted(unknown))}")
    for key in ("conv_layers", "attention_layers"):
        if not isinstance(data.get(key), int) or isinstance(data.get(key), bool) or data[key] < 1:
            raise ValueError(f"student_arch.{key} must be an integer >= 1")
    kernel = data.get("kernel", 5)
    if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0 or kernel > 31:
        raise ValueError("student_arch.kernel must be an odd integer from 1 to 31 (the convolution is centred)")
    ffn = data.get("conv_ffn", E5_FFN)
    if not isinstance(ffn, int) or not 1 <= ffn <= E5_FFN:
        raise ValueError(f"student_arch.conv_ffn must be an integer from 1 to {E5_FFN} (e5's feed-forward width)")
    fusion = data.get("fusion", "none")
    if fusion not in FUSIONS:
        raise ValueError(f"student_arch.fusion must be one of {', '.join(map(repr, FUSIONS))}")
    spread = spread_layers(data["conv_layers"] + data["attention_layers"])
    inits = {}
    for key, count, default in (("conv_init", data["conv_layers"], spread[: data["conv_layers"]]),
                                ("attention_init", data["attention_layers"], spread[data["conv_layers"]:])):
        value = data.get(key, list(default))
        if (not isinstance(value, list) or len(value) != count
                or not all(isinstance(v, int) and 0 <= v < E5_LAYERS for v in value)):
            raise ValueError(f"student_arch.{key} must list {count} e5 layer indices (0-{E5_LAYERS - 1})")
        inits[key] = tuple(value)
    return HybridShape(data["conv_layers"], data["attention_layers"], kernel, ffn, fusion, **inits)
