"""The Julia-1 head for feature-distilled students: [CLS] ⊕ mean ⊕ max of the last states → 2-layer MLP.

models/training/distill.py trains a student's encoder to reproduce the frozen teacher's mean features and
refits a linear head on the student's own mean features (`head: "mean-linear"`, the default).
`head: "pooled-mlp"` replaces that head by `models.training.classifier.PooledHead` (the design note's
"[CLS] ⊕ mean pooling ⊕ max pooling into a two-layer MLP, often one or two points"), trained on the
frozen, distilled encoder: its pooled states are computed once per text, then the MLP learns
cross-entropy on the labelled training rows plus the teacher head's soft targets (KL at the
distillation temperature) on every transfer text, and the epoch with the best validation accuracy
is kept. Inputs are standardised with the training rows' mean and spread, folded into the first
linear layer afterwards, so the exported graph is PooledHead as it is. Works for both student
kinds (TextClassifier, models.training.hybrid.HybridClassifier); the encoder is not changed.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from models.data.recipes import DistillConfig
from models.progress import log
from models.training.classifier import PooledHead
from models.training.distill import fit_linear
from models.training.hybrid import HybridClassifier
from models.training.loops import pad_tensors

EPOCHS = 40
LR = 1e-3
WEIGHT_DECAY = 1e-2
BATCH = 64
INNER = 256  # PooledHead's hidden width


def last_states(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The encoder's last hidden states [batch, seq, hidden] (what PooledHead pools)."""
    if isinstance(model, HybridClassifier):
        return model.encode(input_ids, attention_mask)[1]
    inputs = ({"inputs_embeds": model.word_embedding(input_ids)} if model.word_embedding is not None
              else {"input_ids": input_ids})
    return model.encoder(**inputs, attention_mask=attention_mask).last_hidden_state


def pool(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[CLS] ⊕ masked mean ⊕ masked max, exactly as PooledHead.forward pools."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    maximum = (states + (mask - 1.0) * 1e4).max(dim=1).values
    return torch.cat([states[:, 0], mean, maximum], dim=-1)


@torch.no_grad()
def pooled_inputs(model: nn.Module, sequences: list[list[int]], pad_id: int, batch_size: int = 64) -> np.ndarray:
    """Pooled last states [len(sequences), 3 * hidden] of the frozen encoder, in input order."""
    model.eval()
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    rows: list[tuple[list[int], np.ndarray]] = []
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        ids, mask = pad_tensors([sequences[i] for i in index], pad_id)
        rows.append((index, pool(last_states(model, ids, mask), mask).numpy()))
    out = np.zeros((len(sequences), rows[0][1].shape[1]), dtype=np.float32)
    for index, values in rows:
        out[index] = values
    return out


def _fold_standardisation(head: PooledHead, mean: np.ndarray, scale: np.ndarray) -> None:
    """Make head(x) compute what it learned on (x - mean) / scale."""
    first = head.mlp[1]
    with torch.no_grad():
        weight = first.weight / torch.from_numpy(scale)
        first.bias.sub_(weight @ torch.from_numpy(mean))
        first.weight.copy_(weight)


def fit_pooled_head(model: nn.Module, transfer_seqs: list[list[int]], transfer_features: np.ndarray,
                    y_train: np.ndarray, val_seqs: list[list[int]], y_val: np.ndarray, num_labels: int,
                    config: DistillConfig, pad_id: int) -> dict:
    """Replace model.head by a PooledHead trained on the frozen encoder; returns the report.

    The first len(y_train) transfer texts are the labelled training rows (models.data.recipe_data.transfer_texts
    puts them first); `transfer_features` are the teacher's features of every transfer text.
    """
    started = time.monotonic()
    torch.manual_seed(config.seed)
    n_train = len(y_train)
    w, b = fit_linear(transfer_features[:n_train], y_train, num_labels, config.head_reg)
    soft = torch.softmax(torch.from_numpy((transfer_features @ w.T + b) / config.temperature), dim=-1)
    x = pooled_inputs(model, transfer_seqs, pad_id)
    mean = x[:n_train].mean(0)
    scale = x[:n_train].std(0) + 1e-3
    inputs = torch.from_numpy((x - mean) / scale)
    val = torch.from_numpy((pooled_inputs(model, val_seqs, pad_id) - mean) / scale) if len(val_seqs) else None
    hard = torch.from_numpy(y_train.astype(np.int64))
    head = PooledHead(x.shape[1] // 3, num_labels, inner=INNER)
    optimizer = torch.optim.AdamW(head.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    generator = torch.Generator().manual_seed(config.seed)
    best, best_state, best_epoch, history = -1.0, None, 0, []
    t = config.temperature
    for epoch in range(1, EPOCHS + 1):
        head.train()
        for index in torch.randperm(len(inputs), generator=generator).split(BATCH):
            logits = head.mlp(inputs[index])
            loss = nn.functional.kl_div(torch.log_softmax(logits / t, dim=-1), soft[index],
                                        reduction="batchmean") * t * t
            labelled = index < n_train
            if labelled.any():
                loss = loss + nn.functional.cross_entropy(logits[labelled], hard[index[labelled]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        head.eval()
        with torch.no_grad():
            score = float((head.mlp(val).argmax(1).numpy() == y_val).mean()) if val is not None else float(epoch)
        history.append(round(score, 4))
        if score > best:
            best, best_epoch = score, epoch
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
    head.load_state_dict(best_state)
    _fold_standardisation(head, mean.astype(np.float32), scale.astype(np.float32))
    model.head = head.eval()
    log(f"pooled head: best validation accuracy {best:.4f} at epoch {best_epoch} of {EPOCHS}")
    return {"head": "pooled-mlp", "inner": INNER, "epochs": EPOCHS, "best_epoch": best_epoch,
            "val_accuracy": round(best, 4) if val is not None else None, "val_history": history,
            "lr": LR, "weight_decay": WEIGHT_DECAY, "loss": "CE(train rows) + KL(teacher head, T) on transfer texts",
            "seconds": round(time.monotonic() - started, 1)}
