"""`python -m models import`: tiny transformers classifiers made here → packages that answer what
transformers answers (AutoTokenizer + AutoModelForSequenceClassification), and folders it cannot
take refused in one line before torch is loaded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from fixtures.factory_cli import run_models, run_without_torch

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
LABELS = ["leak", "jam", "overheating"]
TEXTS = [
    "oil leaking under the press", "Förderband blockiert", "温度过高，请检查电机",
    "перегрев подшипника на насосе", "bourrage papier sur la ligne 2", "पंप से तेल रिस रहा है",
    "hydraulic hose leaking " * 40,  # longer than max length: truncated the same way on both sides
]
# not the importer's own probe texts: what it checked must hold beyond them
VARIED = [
    "   Motor   heiß   ", "  leading spaces only", "trailing spaces only   ", "tab\tand\nnewline  inside",
    "Бурение остановлено:   давление   масла низкое", "オイル漏れ　プレス下", "מנוע חם מדי", "θερμοκρασία   υψηλή",
    "jam " * 80, "  " + "温度过高 " * 30, "PLC  ERR-042\u00a0 offline", "<s> jam </s>",
]
MAX_LENGTH = 40


def _wordpiece_tokenizer_file(path: Path) -> int:
    """A WordPiece tokenizer.json as a user may have saved it with `tokenizers` alone (lower-casing
    only: transformers' BertTokenizer adds its own normalizer on load)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    text = "".join(TEXTS + VARIED).lower()
    chars = sorted(set(text) - set(" \t\n\u00a0\u3000"))
    words = sorted({w for t in TEXTS + VARIED for w in t.lower().split()})
    # dict.fromkeys: a one-character word is also a character; ids stay dense (0 … len - 1)
    tokens = dict.fromkeys(["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]", *words, *chars, *(f"##{c}" for c in chars)])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 2)])
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(path))
    return len(vocab)


def make_hf_folder(path: Path, architecture: str) -> Path:
    """A random-weight classifier of the architecture with a tokenizer.json (XLM-R: the real
    multilingual-e5-small file, Metaspace only, the case transformers 5 pre-tokenizes differently)."""
    from models.assets import e5_tokenizer_file

    path.mkdir(parents=True)
    if architecture == "xlm-roberta":
        shutil.copyfile(e5_tokenizer_file(), path / "tokenizer.json")
        vocab_size, pad = 250_002, 1
    else:
        vocab_size, pad = _wordpiece_tokenizer_file(path / "tokenizer.json"), 1
    common = {"vocab_size": vocab_size, "pad_token_id": pad, "initializer_range": 0.5,
              "id2label": dict(enumerate(LABELS)), "label2id": {label: i for i, label in enumerate(LABELS)}}
    torch.manual_seed(0)
    if architecture == "bert":
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=MAX_LENGTH, **common)
        model = transformers.BertForSequenceClassification(config)
    elif architecture == "xlm-roberta":
        config = transformers.XLMRobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=64, max_position_embeddings=MAX_LENGTH + 2,
                                               bos_token_id=0, eos_token_id=2, **common)
        model = transformers.XLMRobertaForSequenceClassification(config)
    else:
        config = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                               max_position_embeddings=MAX_LENGTH, **common)
        model = transformers.DistilBertForSequenceClassification(config)
    with torch.no_grad():  # a confident random model: clear margins, so the golden set can be chosen
        for name, param in model.named_parameters():
            if "classifier" in name:
                param.mul_(1.5)
    model.save_pretrained(str(path))
    return path


def transformers_probs(hf: Path, texts: list[str]) -> np.ndarray:
    """What a transformers user gets: AutoTokenizer (truncation at the package's max length) + model."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(hf)).eval()
    with torch.no_grad():
        batch = tokenizer(texts, truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
        return torch.softmax(model(**batch).logits, -1).numpy()


def _labelled_csv(path: Path, hf: Path) -> Path:
    """Texts labelled with what the model answers: the import is under test, not the model."""
    texts = [f"{t} {k}" for k in range(4) for t in TEXTS]
    rows = [f'"{t}",{LABELS[int(p.argmax())]},xx' for t, p in zip(texts, transformers_probs(hf, texts))]
    path.write_text("text,label,lang\n" + "\n".join(rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("architecture", ["bert", "xlm-roberta", "distilbert"])
def test_import_gives_the_transformers_probabilities(tmp_path, architecture):
    hf = make_hf_folder(tmp_path / "hf", architecture)
    out = tmp_path / "imported"
    result = run_models("import", "--from", str(hf), "--data", str(_labelled_csv(tmp_path / "d.csv", hf)),
                        "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"] == LABELS and "--data" in manifest["provenance"]["gate_set"]
    assert manifest["max_length"] == MAX_LENGTH
    vocab_rows = json.loads((hf / "config.json").read_text())["vocab_size"]
    # the word table is stored once, beside the graphs, and every variant references it
    assert (out / "embeddings.bin").stat().st_size == vocab_rows * 32 * 4  # float32 rows of hidden size 32
    # the other weights are stored once too (fp16, shared by the FP32 graph and every int8 one)
    for variant in manifest["variants"].values():
        assert [f["file"] for f in variant["data_files"]] == ["embeddings.bin", "weights.bin"]
        graph = onnx.load(str(out / variant["file"]["file"]), load_external_data=False)
        rows = [i for i in graph.graph.initializer if list(i.dims)[:1] == [vocab_rows]]
        assert len(rows) == 1 and rows[0].data_location == onnx.TensorProto.EXTERNAL and not rows[0].raw_data

    from runtime.engine.engine import Engine
    from runtime.package.load import load_package

    package = load_package(out)
    texts = TEXTS + VARIED
    got = np.array([c.probs for c in Engine(package, "fp32").classify(texts)])
    assert np.abs(got - transformers_probs(hf, texts)).max() <= 1e-4
    # the package's tokenizer is transformers', also on texts the importer never looked at
    auto = transformers.AutoTokenizer.from_pretrained(str(hf))
    ours = Engine(package, "fp32").encoder.tokenize(VARIED)
    assert [list(e.ids) for e in ours] == auto(VARIED, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    selftest = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(out)], check=False, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr


def test_xlm_roberta_tokenizer_file_is_not_what_transformers_runs(tmp_path):
    # the case the importer must not copy: transformers 5 splits on whitespace first, the file does not
    from tokenizers import Tokenizer

    hf = make_hf_folder(tmp_path / "hf", "xlm-roberta")
    text = "   leading and trailing spaces   "
    raw = Tokenizer.from_file(str(hf / "tokenizer.json")).encode(text).ids
    assert raw != transformers.AutoTokenizer.from_pretrained(str(hf))(text)["input_ids"]


def test_import_without_data_gates_on_confident_fp32_answers(tmp_path):
    hf = make_hf_folder(tmp_path / "hf", "xlm-roberta")
    out = tmp_path / "imported"
    result = run_models("import", "--from", str(hf), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    provenance = manifest["provenance"]
    assert "near-ties" in provenance["gate_set"] and "labelled by FP32" in provenance["gate_set"]
    int8 = [n for n in manifest["variants"] if n != "fp32"]
    # each int8 variant is either published with its gate record or rejected with the gate's reason
    for name in ("int8-u8u8", "int8-u8s8"):
        if name in int8:
            assert manifest["variants"][name]["metrics"]["gate"]["passed"]
        else:
            assert provenance["rejected_variants"][name]
    kept = int(provenance["gate_set"].split(": ")[1].split()[0])
    assert manifest["variants"]["fp32"]["metrics"]["test"]["n"] == kept


def _pickle_only(hf: Path) -> None:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(hf))
    (hf / "model.safetensors").unlink()
    torch.save(model.state_dict(), hf / "pytorch_model.bin")


def _config_edit(**changes):
    def edit(hf: Path) -> None:
        config = json.loads((hf / "config.json").read_text())
        config.update(changes)
        (hf / "config.json").write_text(json.dumps(config))
    return edit


def _garbage_tokenizer(hf: Path) -> None:
    (hf / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')


def _other_models_tokenizer(hf: Path) -> None:
    from models.assets import e5_tokenizer_file

    shutil.copyfile(e5_tokenizer_file(), hf / "tokenizer.json")  # 250k pieces for a tiny vocabulary


def _token_id_past_the_rows(hf: Path) -> None:
    # as many pieces as rows, but one id beyond them (ids with a gap): that piece has no row
    data = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] += 7
    (hf / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")


BAD_FOLDERS = {
    "pickle-only weights": (_pickle_only, ["pytorch_model.bin", "safetensors"]),
    "more layers in config than in the weights": (_config_edit(num_hidden_layers=3), ["2 layers", "says 3"]),
    "vocabulary size not the weights'": (_config_edit(vocab_size=999), ["word_embeddings.weight", "does not match"]),
    "garbage tokenizer": (_garbage_tokenizer, ["tokenizer.json", "not a tokenizers tokenizer"]),
    "another model's tokenizer": (_other_models_tokenizer, ["tokenizer.json", "embedding rows"]),
    "a token id past the embedding rows": (_token_id_past_the_rows, ["tokenizer.json", "embedding rows"]),
    "architecture not supported": (_config_edit(architectures=["GPT2ForSequenceClassification"]),
                                   ["GPT2ForSequenceClassification is not supported"]),
    "no id2label": (_config_edit(id2label=None), ["no id2label"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_a_folder_it_cannot_take_is_one_line_exit_2_without_torch(tmp_path, case):
    damage, expected = BAD_FOLDERS[case]
    hf = make_hf_folder(tmp_path / "hf", "bert")
    damage(hf)
    out = tmp_path / "out"
    result = run_without_torch("import", "--from", str(hf), "--out", str(out))
    assert result.returncode == 2, result.stderr
    assert result.cpu_seconds <= 2.0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(fragment in lines[0] for fragment in expected), result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
