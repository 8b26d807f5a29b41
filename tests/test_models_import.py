"""`python -m models import`: a tiny transformers classifier made here → package with the same probabilities."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
LABELS = ["leak", "jam", "overheating"]
TEXTS = [
    "oil leaking under the press", "Förderband blockiert", "温度过高，请检查电机",
    "перегрев подшипника на насосе", "bourrage papier sur la ligne 2", "पंप से तेल रिस रहा है",
    "hydraulic hose leaking " * 40,  # longer than max length: truncated the same way on both sides
]


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    chars = sorted(set("".join(TEXTS).lower()) - {" "})
    words = sorted({w for t in TEXTS for w in t.lower().split()})
    vocab = {tok: i for i, tok in enumerate(["[CLS]", "[PAD]", "[SEP]", "[UNK]", *words, *chars,
                                              *(f"##{c}" for c in chars)])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 2)])
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer, len(vocab)


def make_hf_folder(path: Path, architecture: str) -> Path:
    tokenizer, vocab_size = _tokenizer()
    common = dict(vocab_size=vocab_size, pad_token_id=1, initializer_range=0.5, id2label=dict(enumerate(LABELS)),
                  label2id={label: i for i, label in enumerate(LABELS)})
    torch.manual_seed(0)
    if architecture == "bert":
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=40, **common)
        model = transformers.BertForSequenceClassification(config)
    elif architecture == "xlm-roberta":
        config = transformers.XLMRobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=64, max_position_embeddings=42, bos_token_id=0,
                                               eos_token_id=2, **common)
        model = transformers.XLMRobertaForSequenceClassification(config)
    else:
        config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                               max_position_embeddings=40, **common)
        model = transformers.DistilBertForSequenceClassification(config)
    with torch.no_grad():  # a confident random model: clear margins, so the golden set can be chosen
        for name, param in model.named_parameters():
            if "classifier" in name:
                param.mul_(1.5)
    model.save_pretrained(str(path))
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def hf_vocab_rows(hf: Path) -> int:
    return json.loads((hf / "config.json").read_text())["vocab_size"]


def run_models(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "models", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))


@pytest.mark.parametrize("architecture", ["bert", "xlm-roberta", "distilbert"])
def test_import_gives_the_transformers_probabilities(tmp_path, architecture):
    hf = make_hf_folder(tmp_path / "hf", architecture)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(hf)).eval()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    tokenizer.enable_truncation(40)
    texts = [f"{t} {k}" for k in range(4) for t in TEXTS]

    def probs_of(text):
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            return torch.softmax(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits, -1)[0].numpy()

    # the evaluation data is labelled with what the model answers: the import is under test, not the model
    rows = [f'"{t}",{LABELS[int(probs_of(t).argmax())]},xx' for t in texts]
    data = tmp_path / "data.csv"
    data.write_text("text,label,lang\n" + "\n".join(rows), encoding="utf-8")
    out = tmp_path / "imported"
    result = run_models("import", "--from", str(hf), "--data", str(data), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"] == LABELS and "--data" in manifest["provenance"]["gate_set"]

    from runtime.engine import Engine
    from runtime.package import load_package

    assert manifest["max_length"] == 40
    # the word table is stored once, beside the graphs, and every variant references it
    table = out / "embeddings.bin"
    assert table.stat().st_size == hf_vocab_rows(hf) * 32 * 4  # float32 rows of hidden size 32, as trained
    for variant in manifest["variants"].values():
        assert [f["file"] for f in variant["data_files"]] == ["embeddings.bin"]
        graph = onnx.load(str(out / variant["file"]["file"]), load_external_data=False)
        rows = [i for i in graph.graph.initializer if list(i.dims)[:1] == [hf_vocab_rows(hf)]]
        assert len(rows) == 1 and rows[0].data_location == onnx.TensorProto.EXTERNAL and not rows[0].raw_data
    engine = Engine(load_package(out), "fp32")
    got = np.array([c.probs for c in engine.classify(TEXTS)])
    expected = np.array([probs_of(text) for text in TEXTS])
    assert np.abs(got - expected).max() <= 1e-4
    selftest = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr


def test_import_refuses_a_folder_without_id2label_or_of_another_architecture(tmp_path):
    hf = make_hf_folder(tmp_path / "hf", "bert")
    config = json.loads((hf / "config.json").read_text())
    config["architectures"] = ["GPT2ForSequenceClassification"]
    (hf / "config.json").write_text(json.dumps(config))
    result = run_models("import", "--from", str(hf), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "GPT2ForSequenceClassification is not supported" in result.stderr
    config["architectures"] = ["BertForSequenceClassification"]
    del config["id2label"]
    (hf / "config.json").write_text(json.dumps(config))
    result = run_models("import", "--from", str(hf), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "no id2label" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
