"""A transformers `*ForSequenceClassification` save_pretrained folder, checked before torch is loaded.

Everything that can be known from the files alone is checked here, so that a folder the importer
cannot take is refused in a second with one line (`DataError`): config.json (architecture, labels,
single-label), weights in safetensors (pickle files are not loaded: unpickling runs code) whose
tensor shapes fit the config (read from the safetensors header, no tensor is loaded), and a
tokenizer.json that `tokenizers` can read, with ids inside the model's vocabulary.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from models.data.userdata import DataError

SUPPORTED = {  # architectures[0] in config.json → model_type
    "BertForSequenceClassification": "bert",
    "XLMRobertaForSequenceClassification": "xlm-roberta",
    "DistilBertForSequenceClassification": "distilbert",
}
_LAYER = re.compile(r"(?:^|\.)layer\.(\d+)\.")
_HEADER_LIMIT = 100 << 20  # a safetensors header is JSON of tensor names: megabytes at most


@dataclass(frozen=True)
class HfFolder:
    """What the checks found."""

    path: Path
    config: dict
    labels: tuple[str, ...]
    weights_bytes: int

    @property
    def architecture(self) -> str:
        return self.config["architectures"][0]

    def size(self, *keys: str) -> int:
        """The first of `keys` the config has (BERT and DistilBERT name their sizes differently)."""
        return int(next((self.config[k] for k in keys if self.config.get(k) is not None), 0))


def _read_config(hf_dir: Path) -> tuple[dict, tuple[str, ...]]:
    config_path = hf_dir / "config.json"
    if not hf_dir.is_dir():
        raise DataError(f"{hf_dir}: no such directory")
    if not config_path.is_file():
        raise DataError(f"{hf_dir}: no config.json (expected a transformers save_pretrained folder)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{config_path}: not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise DataError(f"{config_path}: not a JSON object")
    architectures = config.get("architectures") or []
    architecture = architectures[0] if isinstance(architectures, list) and architectures else "(none)"
    if architecture not in SUPPORTED:
        raise DataError(f"{config_path}: architecture {architecture} is not supported "
                        f"(supported: {', '.join(sorted(SUPPORTED))})")
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise DataError(f"{config_path}: no id2label (the label names, e.g. {{\"0\": \"leak\", \"1\": \"jam\"}})")
    try:
        labels = tuple(str(id2label[str(i)]) for i in range(len(id2label)))
    except KeyError:
        raise DataError(f"{config_path}: id2label keys must be 0..{len(id2label) - 1}") from None
    if len(set(labels)) != len(labels) or len(labels) < 2:
        raise DataError(f"{config_path}: id2label needs at least 2 different label names")
    if config.get("problem_type") == "multi_label_classification":
        raise DataError(f"{config_path}: multi-label (sigmoid) classifiers are not supported; decide answers "
                        "one label per text (softmax)")
    return config, labels


def _safetensors_files(hf_dir: Path) -> list[Path]:
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{index}: not a safetensors index ({exc})") from None
        missing = [s for s in shards if not (hf_dir / s).is_file()]
        if missing:
            raise DataError(f"{index}: shard {missing[0]} is missing")
        return [hf_dir / s for s in shards]
    pickled = [p.name for p in hf_dir.glob("*.bin")] + [p.name for p in hf_dir.glob("*.pt")]
    if pickled:
        raise DataError(f"{hf_dir}: weights only as a pickle file ({', '.join(sorted(pickled))}); loading one "
                        "runs code from it, so decide imports safetensors only. Convert once with "
                        "`model.save_pretrained(DIR, safe_serialization=True)`")
    raise DataError(f"{hf_dir}: no weights (model.safetensors)")


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name → shape, from a safetensors file's JSON header (no tensor data is read)."""
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if not 0 < length <= _HEADER_LIMIT:
                raise ValueError(f"header length {length}")
            header = json.loads(fh.read(length))
        return {name: list(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
    except (OSError, ValueError, struct.error, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: not a safetensors file ({exc.__class__.__name__}: {exc})") from None


def _find(shapes: dict[str, list[int]], *suffixes: str) -> tuple[str, list[int]] | None:
    for suffix in suffixes:
        for name, shape in shapes.items():
            if name == suffix or name.endswith("." + suffix):
                return name, shape
    return None


def _check_shapes(folder: HfFolder, shapes: dict[str, list[int]], where: Path) -> None:
    """The weights' sizes against config.json: a mismatch would load a different model silently
    (transformers initialises missing layers at random and drops extra ones with a warning)."""
    hidden = folder.size("hidden_size", "dim")
    expected = {
        "word_embeddings.weight": [folder.size("vocab_size"), hidden],
        "position_embeddings.weight": [folder.size("max_position_embeddings"), hidden],
        "classifier.weight|classifier.out_proj.weight": [len(folder.labels), None],
    }
    for names, shape in expected.items():
        found = _find(shapes, *names.split("|"))
        if found is None:
            raise DataError(f"{where}: no {names.split('|')[0]} tensor: the weights are not a "
                            f"{folder.architecture}")
        name, actual = found
        if len(actual) != len(shape) or any(e is not None and e != a for e, a in zip(shape, actual)):
            raise DataError(f"{where}: {name} has shape {actual}, config.json says "
                            f"{[a if e is None else e for e, a in zip(shape, actual)]}: the config does not "
                            "match the weights")
    layers = {int(m.group(1)) for name in shapes for m in [_LAYER.search(name)] if m}
    declared = folder.size("num_hidden_layers", "n_layers")
    if len(layers) != declared:
        raise DataError(f"{where}: the weights have {len(layers)} layers, config.json says {declared}: the "
                        "config does not match the weights")


def _declared_tokens(data: object) -> int | None:
    """How many token ids a tokenizer.json declares (its model's vocabulary and the added tokens),
    read from the JSON alone; None when the file does not have that shape."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return None
    vocab = data["model"].get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] in id order
        size = len(vocab)
    elif isinstance(vocab, dict):  # WordPiece, BPE, WordLevel: piece -> id
        size = max((v for v in vocab.values() if isinstance(v, int)), default=-1) + 1
    else:
        return None
    added = [t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)]
    return max([size, *(i + 1 for i in added if isinstance(i, int))])


def _check_tokenizer(hf_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer

    path = hf_dir / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"{hf_dir}: no tokenizer.json (save the fast tokenizer with save_pretrained)")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        declared = _declared_tokens(json.loads(text))
    except (ValueError, RecursionError):
        declared = None
    # the size first, from the JSON: building a 250k-piece tokenizer costs a second of CPU, and a
    # tokenizer of another model is refused without it
    if declared is not None and declared > vocab_size:
        raise DataError(f"{path}: {declared} tokens, but the model has {vocab_size} embedding rows: this tokenizer "
                        "belongs to another model")
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 — tokenizers raises its own exception types for a broken file
        raise DataError(f"{path}: not a tokenizers tokenizer ({str(exc)[:200]})") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise DataError(f"{path}: {size} tokens, but the model has {vocab_size} embedding rows: this tokenizer "
                        "belongs to another model")


def read_hf_folder(hf_dir: Path) -> HfFolder:
    """Check a save_pretrained folder (see the module docstring); DataError for anything it cannot take."""
    config, labels = _read_config(hf_dir)
    files = _safetensors_files(hf_dir)
    folder = HfFolder(hf_dir, config, labels, sum(p.stat().st_size for p in files))
    shapes: dict[str, list[int]] = {}
    for path in files:
        shapes.update(safetensors_shapes(path))
    _check_shapes(folder, shapes, files[0] if len(files) == 1 else hf_dir)
    _check_tokenizer(hf_dir, folder.size("vocab_size"))
    return folder
