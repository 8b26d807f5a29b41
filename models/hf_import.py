"""`python -m models import --from HF_DIR`: a transformers `*ForSequenceClassification` folder → package.

The reference is what a transformers user gets: `AutoTokenizer` (truncation at the package's max
length) and `AutoModelForSequenceClassification`, softmax. The package's tokenizer.json is the
tokenizer transformers actually runs (`backend_tokenizer`, which may differ from the folder's
file: transformers 5's XLM-R tokenizer splits on whitespace before its Metaspace step, the file
does not, so "   leading and trailing spaces   " got an extra `▁`), and its token ids are checked
against AutoTokenizer's on varied texts before anything is exported. The FP32 graph keeps float32
weights (fused into ONNX Runtime's BERT ops when every layer fuses) and must give transformers'
probabilities to 1e-4 on those texts and the gate set (`publish.evaluate`). No temperature: an
imported model answers what its author's model answers.

int8 variants are gated on `--data` when given (true labels), otherwise on a built-in multilingual
sample labelled by FP32 itself, where texts FP32 itself nearly ties on (top-2 margin < 0.2) are
left out: there a flip is a coin toss, not a quantization error. The manifest says which.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models.data.datasets import Example
from models.data.hf_folder import HfFolder, read_hf_folder
from models.data.userdata import NO_LANGUAGE, DataError, read_labelled_file
from models.gate.calibration import softmax_t
from models.progress import log
from models.publish.publish import Fp32Graph, Heldout, PublishError, Source, publish
from runtime.package.load import Manifest

IMPORT_TOLERANCE = 1e-4  # max |Δp| of the FP32 graph against transformers
SAMPLE_PER_LANGUAGE = 12
NEAR_TIE_MARGIN = 0.2
GOLDEN_COUNT = 30
# Inputs a user may send that the tokenizer must treat exactly as transformers does.
PROBE_TEXTS = [
    "   leading and trailing spaces   ", "several     spaces\tand a tab", "   \t spaced   \n out \r\n text  ",
    "Η αντλία 3 υπερθερμαίνεται, θερμοκρασία λαδιού 85 °C", "דליפת שמן מתחת למכבש ההידראולי, נא לבדוק",
    "สายพานลำเลียงติดขัด ชิ้นงานค้างอยู่ที่ทางเข้า", "温度过高，请检查电机", "перегрев подшипника на насосе",
    "पंप से तेल रिस रहा है", "মোটরের বিয়ারিং খুব গরম হয়ে গেছে", "ポンプの温度が高すぎます",
    "ＰＬＣ　ｏｆｆｌｉｎｅ　ＥＲＲ　０４２", "Cafe\u0301 machine: e\u0301tat capteur ge\u0301le\u0301",
    "pump\u200b3\u200d leak\u200e here\u00a0now", "Nhiệt độ động cơ quá cao 🔥🔥 pls check",
    "<s> oil leak </s> <pad> [CLS] under press [SEP] <unk> <mask>", "!!!", "x",
]


def probe_texts(max_length: int) -> list[str]:
    """PROBE_TEXTS plus texts longer than the max length (mixed scripts, repetitions)."""
    words = max(4, max_length)
    return [*PROBE_TEXTS, " ".join(PROBE_TEXTS[3:11]) * 2, "Hydraulic oil temperature rising on press 4, " * (words // 6),
            "温度过高，请检查电机。" * (words // 4), "   " + "leak " * words + "   "]


def builtin_sample() -> list[Example]:
    """Unlabelled multilingual texts for the agreement gate: chatterbot-corpus messages, per language."""
    from models.data.datasets import load_chatterbot_topics

    by_language: dict[str, list[Example]] = {}
    for example in load_chatterbot_topics():
        by_language.setdefault(example.language, []).append(example)
    sample = []
    for language in sorted(by_language):
        sample += sorted(by_language[language], key=lambda e: e.text)[:SAMPLE_PER_LANGUAGE]
    return sample


def max_length_of(folder: HfFolder) -> int:
    """Positions the model has (XLM-R's start after padding_idx + 1), capped by the tokenizer's
    declared model_max_length and 512."""
    positions = folder.size("max_position_embeddings") or 512
    if folder.config.get("model_type") in ("xlm-roberta", "roberta"):
        positions -= 2
    tokenizer_config = folder.path / "tokenizer_config.json"
    if tokenizer_config.is_file():
        try:
            declared = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("model_max_length")
        except (ValueError, AttributeError):
            declared = None
        if isinstance(declared, int) and 0 < declared < positions:
            positions = declared
    return min(positions, 512)


class TransformersModel:
    """The reference: AutoTokenizer + AutoModelForSequenceClassification, loaded and checked."""

    def __init__(self, folder: HfFolder, max_length: int) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder.path))
            model, info = AutoModelForSequenceClassification.from_pretrained(
                str(folder.path), attn_implementation="eager", output_loading_info=True)
        except Exception as exc:  # noqa: BLE001 — transformers and safetensors raise many types for one cause
            raise DataError(f"{folder.path}: transformers cannot load it ({str(exc).splitlines()[0][:200]})") from None
        missing = [k for k in info.get("missing_keys", []) if "position_ids" not in k]
        if missing or info.get("mismatched_keys"):
            raise DataError(f"{folder.path}: the weights do not fit config.json (missing {missing[:3]}, "
                            f"mismatched {list(info.get('mismatched_keys', []))[:3]})")
        self.model = model.eval()
        self.max_length = max_length
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def tokenizer_json(self) -> dict:
        """The tokenizer transformers runs, truncating at max_length, no padding (the runtime pads)."""
        data = json.loads(self.tokenizer.backend_tokenizer.to_str())
        data["truncation"] = {"direction": "Right", "max_length": self.max_length, "strategy": "LongestFirst",
                              "stride": 0}
        data["padding"] = None
        return data

    def ids(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]

    def logits(self, texts: list[str], batch_tokens: int = 4096) -> np.ndarray:
        """The model's logits, texts batched by length (at most `batch_tokens` padded tokens a batch:
        eager attention of 32 texts of 512 tokens alone is 400 MB a layer)."""
        import torch

        lengths = [len(ids) for ids in self.ids(texts)]
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        out = np.zeros((len(texts), len(self.model.config.id2label)), dtype=np.float32)
        with torch.no_grad():
            start = 0
            while start < len(order):
                rows = max(1, min(32, batch_tokens // lengths[order[min(start + 32, len(order)) - 1]]))
                index = order[start:start + rows]
                batch = self.tokenizer([texts[i] for i in index], truncation=True, max_length=self.max_length,
                                       padding=True, return_tensors="pt")
                out[index] = self.model(**batch).logits.float().numpy()
                start += len(index)
        return out


def check_tokenizer_json(reference: TransformersModel, tokenizer_json: dict, texts: list[str]) -> None:
    """The package's tokenizer, as the runtime loads it, must give AutoTokenizer's ids."""
    from runtime.engine.text import TextEncoder

    # the text the package's tokenizer.json will hold
    encoder = TextEncoder(json.dumps(tokenizer_json, ensure_ascii=False), reference.max_length, reference.pad_id)
    ours = [list(e.ids) for e in encoder.tokenize(texts)]
    for text, mine, theirs in zip(texts, ours, reference.ids(texts)):
        if mine != list(theirs):
            raise PublishError(f"the package's tokenizer does not reproduce transformers' on {text[:60]!r}: "
                               f"{mine[:12]} vs {list(theirs)[:12]}")


def _gate_examples(folder: HfFolder, data_file: Path | None, text_column: str,
                   label_column: str) -> tuple[list[Example], dict]:
    """--data's labelled examples, or the built-in sample (labelled by FP32 later)."""
    if data_file is None:
        return builtin_sample(), {"data": None}
    data = read_labelled_file(data_file, text_column, label_column, for_training=False)
    unknown = sorted({e.label for e in data.examples} - set(folder.labels))
    if unknown:
        raise DataError(f"{data_file}: labels not in the model's id2label: {', '.join(map(repr, unknown))}")
    return data.examples, {"data": data.provenance()}


def _fp32_labelled(folder: HfFolder, sample: list[Example], logits: np.ndarray) -> Heldout:
    """The sample labelled by the model itself, without the texts it nearly ties on."""
    probs = softmax_t(logits)
    top2 = np.sort(probs, axis=1)[:, -2:]
    kept = [Example(e.text, folder.labels[int(p.argmax())], e.language)
            for e, p, (second, first) in zip(sample, probs, top2) if first - second >= NEAR_TIE_MARGIN]
    return Heldout([], kept, "fp32's predictions",
                   f"built-in multilingual sample: {len(kept)} chatterbot-corpus messages labelled by FP32 "
                   f"({len(sample) - len(kept)} near-ties, FP32 top-2 margin < {NEAR_TIE_MARGIN}, left out)")


def import_hf(hf_dir: Path, out_dir: Path, name: str, data_file: Path | None = None,
              text_column: str = "text", label_column: str = "label") -> Manifest:
    """Export, quantize, gate and package a transformers classifier (see the module docstring)."""
    folder = read_hf_folder(hf_dir)
    max_length = max_length_of(folder)
    log(f"importing {folder.architecture} from {hf_dir}: {len(folder.labels)} labels, max length {max_length}")
    reference = TransformersModel(folder, max_length)
    tokenizer_json = reference.tokenizer_json()
    probes = probe_texts(max_length)
    check_tokenizer_json(reference, tokenizer_json, probes)
    examples, provenance = _gate_examples(folder, data_file, text_column, label_column)
    texts = list(dict.fromkeys(probes + [e.text for e in examples]))
    log(f"transformers reference on {len(texts)} texts")
    recorded = dict(zip(texts, reference.logits(texts)))  # every text a step asks about: the model can go
    heldout = (Heldout([], examples, "true labels", f"--data {data_file} ({len(examples)} labelled examples)")
               if data_file is not None else
               _fp32_labelled(folder, examples, np.array([recorded[e.text] for e in examples])))
    holder = [reference.model]  # the exporter takes it out: after tracing, nothing needs torch's copy

    def write_fp32(staging: Path) -> Fp32Graph:
        from models.export.hf_export import export_hf_fp32

        graph, shared, fusion = export_hf_fp32(holder, folder, staging)
        return Fp32Graph(graph, shared, "fp32", {"fused_operators": fusion})

    source = Source(
        name=name, version="1.0.0", description=f"{name}: imported from {folder.architecture} ({hf_dir.name})",
        labels=folder.labels, languages=tuple(sorted({e.language for e in heldout.test} - {NO_LANGUAGE}))
        if data_file is not None else (), max_length=max_length, pad_id=int(reference.pad_id),
        tokenizer_json=tokenizer_json, write_fp32=write_fp32,
        reference_logits=lambda batch: np.array([recorded[t] for t in batch]).reshape(len(batch), len(folder.labels)),
        reference_texts=list(dict.fromkeys(probes + [e.text for e in heldout.test])),
        reference_tolerance=IMPORT_TOLERANCE, heldout=heldout,
        calibration_texts=[e.text for e in examples],
        calibration_source="--data" if data_file is not None else "built-in multilingual sample",
        golden_candidates=list(heldout.test), golden_count=GOLDEN_COUNT, calibrate=False,
        provenance={"imported_from": {"dir": str(hf_dir), "architecture": folder.architecture,
                                      "model_type": folder.config.get("model_type"),
                                      "name_or_path": folder.config.get("_name_or_path")},
                    "gate_set": heldout.description, "probe_texts": len(probes), **provenance})
    del reference  # the exporter holds the model; the recorded logits are all the other steps need
    return publish(source, out_dir)

