"""Fine-tuning and distillation loops (torch, single process; progress with ETA on stderr)."""

from __future__ import annotations

import random
import time

import numpy as np
import torch
from torch import nn

from models.data.recipes import TrainConfig
from models.progress import Progress, log
from models.training.metrics import classification_metrics


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pad_tensors(sequences: list, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence: (input_ids, attention_mask) int64.

    Items may also be float [length, hidden] hidden states (cached lower layers): they are
    zero-padded into [batch, seq, hidden].
    """
    width = max(len(s) for s in sequences)
    if isinstance(sequences[0], torch.Tensor):
        states = torch.zeros((len(sequences), width, sequences[0].shape[1]), dtype=sequences[0].dtype)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            states[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return states, mask
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def shuffled_batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches of similar length (less padding, faster on CPU)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def sorted_batches(sequences: list, batch_size: int) -> list[list[int]]:
    """Index batches in length order (inference: least padding); results go back by index."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def warmup_then_linear(optimizer: torch.optim.Optimizer, total_steps: int,
                       warmup_divisor: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning rate rising over the first 1/`warmup_divisor` of the steps, then falling to 0."""
    warmup = max(1, total_steps // warmup_divisor)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.0, 1.0 - step / max(1, total_steps)))


def optimizer_step(optimizer: torch.optim.Optimizer, scheduler, params, loss: torch.Tensor) -> None:
    """One update: backward, gradient norm clipped to 1, step, schedule."""
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()


@torch.no_grad()
def predict_logits(model: nn.Module, sequences: list, pad_id: int,
                   batch_size: int = 64) -> np.ndarray:
    """Logits for every sequence, in input order."""
    model.eval()
    out = np.zeros((len(sequences), 0), dtype=np.float32)
    chunks = []
    progress = Progress("predict", len(sequences), every_s=15.0)
    for index in sorted_batches(sequences, batch_size):
        ids, mask = pad_tensors([sequences[i] for i in index], pad_id)
        chunks.append((index, model(ids, mask).float().numpy()))
        progress.advance(len(index))
    if chunks:
        out = np.zeros((len(sequences), chunks[0][1].shape[1]), dtype=np.float32)
        for index, logits in chunks:
            out[index] = logits
    return out


def freeze_bottom(model: nn.Module, layers: int) -> None:
    """Stop gradients into the embeddings and the first `layers` encoder layers."""
    for name, param in model.named_parameters():
        if name.startswith("encoder.embeddings.") or any(
                name.startswith(f"encoder.encoder.layer.{i}.") for i in range(layers)):
            param.requires_grad_(False)


def class_weights(labels: np.ndarray, num_labels: int) -> torch.Tensor:
    """Inverse square-root frequency weights (mean 1): rare topics count more, not overwhelmingly."""
    counts = np.bincount(labels, minlength=num_labels).astype(np.float64)
    weights = 1.0 / np.sqrt(np.maximum(counts, 1.0))
    return torch.tensor(weights / weights.mean(), dtype=torch.float32)


def cache_lower_states(model: nn.Module, sequences: list[list[int]], layers: int, pad_id: int,
                       batch_size: int = 64, name: str = "lower layers") -> list[torch.Tensor]:
    """Per-sequence hidden states after the frozen `layers` (computed once, reused every epoch)."""
    from models.training.classifier import lower_states

    model.eval()
    out: list[torch.Tensor | None] = [None] * len(sequences)
    progress = Progress(name, len(sequences))
    for index in sorted_batches(sequences, batch_size):
        ids, mask = pad_tensors([sequences[i] for i in index], pad_id)
        states = lower_states(model, ids, mask, layers)
        for row, i in enumerate(index):
            out[i] = states[row, : len(sequences[i])].clone()
        progress.advance(len(index))
    return out  # type: ignore[return-value]


def fit(model: nn.Module, train_seqs: list, train_labels: np.ndarray,
        val_seqs: list, val_labels: np.ndarray, labels: tuple[str, ...],
        config: TrainConfig, pad_id: int, teacher_logits: np.ndarray | None = None,
        name: str = "train") -> dict:
    """Train with early stopping on validation macro-F1; leaves the best weights in `model`."""
    set_seed(config.seed)
    rng = random.Random(config.seed)
    if config.freeze_layers:
        freeze_bottom(model, config.freeze_layers)
    head_params = [p for n, p in model.named_parameters() if n.startswith("head.") and p.requires_grad]
    body_params = [p for n, p in model.named_parameters() if not n.startswith("head.") and p.requires_grad]
    optimizer = torch.optim.AdamW([
        {"params": body_params, "lr": config.lr},
        {"params": head_params, "lr": config.head_lr},
    ], weight_decay=config.weight_decay)
    steps_per_epoch = (len(train_seqs) + config.batch_size - 1) // config.batch_size
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    scheduler = warmup_then_linear(optimizer, total_steps, 10)
    weights = class_weights(train_labels, len(labels))
    lengths = [len(s) for s in train_seqs]
    best_f1, best_state, best_epoch, stale, step = -1.0, None, 0, 0, 0
    progress = Progress(name, total_steps)
    started = time.monotonic()
    history = []
    for epoch in range(1, config.epochs + 1):
        model.train()
        for index in shuffled_batches(lengths, config.batch_size, rng):
            ids, mask = pad_tensors([train_seqs[i] for i in index], pad_id)
            target = torch.tensor(train_labels[index], dtype=torch.long)
            logits = model(ids, mask)
            loss = nn.functional.cross_entropy(logits, target, weight=weights)
            if teacher_logits is not None:
                t = config.temperature
                soft = torch.softmax(torch.tensor(teacher_logits[index]) / t, dim=-1)
                kd = nn.functional.kl_div(torch.log_softmax(logits / t, dim=-1), soft,
                                          reduction="batchmean") * t * t
                loss = config.distill_alpha * kd + (1 - config.distill_alpha) * loss
            optimizer_step(optimizer, scheduler, model.parameters(), loss)
            step += 1
            progress.advance(note=f"epoch {epoch} loss {loss.item():.3f}")
            if config.max_steps and step >= config.max_steps:
                break
        val_pred = predict_logits(model, val_seqs, pad_id).argmax(1)
        val = classification_metrics(val_labels, val_pred, labels)
        history.append({"epoch": epoch, "val_accuracy": round(val["accuracy"], 4),
                        "val_macro_f1": round(val["macro_f1"], 4)})
        log(f"{name} epoch {epoch}: val accuracy {val['accuracy']:.4f} macro-F1 {val['macro_f1']:.4f}")
        if val["macro_f1"] > best_f1:
            best_f1, best_epoch, stale = val["macro_f1"], epoch, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
        if stale >= config.patience or (config.max_steps and step >= config.max_steps):
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return {"best_epoch": best_epoch, "best_val_macro_f1": round(best_f1, 4), "history": history,
            "seconds": round(time.monotonic() - started, 1)}
