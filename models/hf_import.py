"""`python -m models import --from HF_DIR`: a transformers `*ForSequenceClassification` folder → package.

The model is exported as it is (FP32 weights kept in float32, fused into ONNX Runtime's BERT ops
when every layer fuses, no temperature: the FP32 variant gives the transformers model's
probabilities, checked at import to 1e-4); int8 variants are made by models.quantize (fixed
calibrated activation scales) and gated against FP32 by its accuracy gate: on `--data` when given
(true labels), otherwise on a built-in multilingual sample labelled by FP32 itself (the gate then
measures agreement). The manifest says which gate was used.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import torch

from models.build import (GOLDEN_FILE, TOKENIZER_FILE, golden_tolerance, swap_into, tool_versions,
                          add_manifest_section, staging_dir, stable_golden, zipped_bytes)
from models.calibration import expected_calibration_error
from models.data import Example
from models.evaluate import ort_logits, ort_session, select_golden, softmax
from models.export import OPSET, SHARED_DATA_FILE, point_to_shared_data, write_shared_data
from models.metrics import metrics_by_language
from models.progress import log
from models.quantize import DEFAULT_INT8, requantize_package
from models.userdata import NO_LANGUAGE, DataError, read_labelled_file
from runtime.package import Manifest, Variant, file_entry, load_package, write_manifest

SUPPORTED = {  # architectures[0] in config.json → model_type
    "BertForSequenceClassification": "bert",
    "XLMRobertaForSequenceClassification": "xlm-roberta",
    "DistilBertForSequenceClassification": "distilbert",
}
GOLDEN_COUNT = 30
IMPORT_TOLERANCE = 1e-4  # max |Δp| of the FP32 graph against transformers
SAMPLE_PER_LANGUAGE = 12


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if getattr(self.model.config, "type_vocab_size", 0):
            # explicit zeros: BERT's own buffered token type ids trace with the tracing batch size
            # baked in (an Expand that fails on any other batch size)
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=torch.zeros_like(input_ids)).logits
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def read_hf_config(hf_dir: Path) -> tuple[dict, tuple[str, ...]]:
    """config.json and the labels in id order; DataError for anything this importer cannot take."""
    config_path = hf_dir / "config.json"
    if not hf_dir.is_dir():
        raise DataError(f"{hf_dir}: no such directory")
    if not config_path.is_file():
        raise DataError(f"{hf_dir}: no config.json (expected a transformers save_pretrained folder)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{config_path}: not JSON ({exc})") from None
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else "(none)"
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
    if len(set(labels)) != len(labels):
        raise DataError(f"{config_path}: id2label has duplicate names")
    if config.get("problem_type") == "multi_label_classification":
        raise DataError(f"{config_path}: multi-label (sigmoid) classifiers are not supported; decide answers "
                        "one label per text (softmax)")
    if not (hf_dir / "tokenizer.json").is_file():
        raise DataError(f"{hf_dir}: no tokenizer.json (save the fast tokenizer with save_pretrained)")
    if not any((hf_dir / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
        raise DataError(f"{hf_dir}: no weights (model.safetensors or pytorch_model.bin)")
    return config, labels


def builtin_sample() -> list[Example]:
    """Unlabelled multilingual texts for the agreement gate: chatterbot-corpus messages, per language."""
    from models.data import load_chatterbot_topics

    by_language: dict[str, list[Example]] = {}
    for example in load_chatterbot_topics():
        by_language.setdefault(example.language, []).append(example)
    sample = []
    for language in sorted(by_language):
        sample += sorted(by_language[language], key=lambda e: e.text)[:SAMPLE_PER_LANGUAGE]
    return sample


def _tokenizer_json(hf_dir: Path, max_length: int) -> dict:
    data = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["truncation"] = {"direction": "Right", "max_length": max_length, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = None
    return data


def _max_length(config: dict, hf_dir: Path) -> int:
    positions = int(config.get("max_position_embeddings", 512))
    if config.get("model_type") in ("xlm-roberta", "roberta"):
        positions -= 2  # positions start after padding_idx + 1
    tokenizer_config = hf_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        declared = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("model_max_length")
        if isinstance(declared, int) and 0 < declared < positions:
            positions = declared
    return min(positions, 512)


def import_hf(hf_dir: Path, out_dir: Path, name: str, data_file: Path | None = None,
              text_column: str = "text", label_column: str = "label") -> Manifest:
    """Export, quantize, gate, calibrate (with data) and package a transformers classifier."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification

    started = time.monotonic()
    config, labels = read_hf_config(hf_dir)
    data = read_labelled_file(data_file, text_column, label_column, for_training=False) if data_file else None
    if data is not None:
        unknown = sorted({e.label for e in data.examples} - set(labels))
        if unknown:
            raise DataError(f"{data_file}: labels not in the model's id2label: {', '.join(map(repr, unknown))}")
    max_length = _max_length(config, hf_dir)
    tokenizer_json = _tokenizer_json(hf_dir, max_length)
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
    pad_id = config.get("pad_token_id")
    if pad_id is None:
        pad_token = next((t for t in ("<pad>", "[PAD]") if tokenizer.token_to_id(t) is not None), None)
        pad_id = tokenizer.token_to_id(pad_token) if pad_token else 0
    log(f"importing {config['architectures'][0]} from {hf_dir}: {len(labels)} labels, max length {max_length}")
    model = AutoModelForSequenceClassification.from_pretrained(str(hf_dir), attn_implementation="eager").eval()
    wrapper = _LogitsOnly(model).eval()

    examples = data.examples if data is not None else builtin_sample()
    seqs = [e.ids for e in tokenizer.encode_batch([e.text for e in examples])]
    from models.train import predict_logits

    reference_logits = predict_logits(wrapper, seqs, int(pad_id))
    reference = softmax(reference_logits)
    if data is not None:
        index = {label: i for i, label in enumerate(labels)}
        y_true = np.array([index[e.label] for e in examples], dtype=np.int64)
        gate_set = f"--data {data_file} ({len(examples)} labelled examples)"
        gate_examples = list(examples)
    else:
        y_true = reference.argmax(1)  # agreement with FP32 is what is measured
        gate_set = f"built-in multilingual sample ({len(examples)} chatterbot-corpus messages, FP32's labels)"
        gate_examples = [replace(e, label=labels[int(y)]) for e, y in zip(examples, y_true)]

    staging = staging_dir(out_dir)
    try:
        fp32_path, fusion = _export_fp32(wrapper, config, staging, int(pad_id))
        shared = share_word_table(fp32_path, int(config.get("vocab_size") or 0))
        (staging / TOKENIZER_FILE).write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
        session = ort_session(fp32_path)
        logits = ort_logits(session, seqs, int(pad_id), name="evaluate fp32")
        probs = softmax(logits)
        fp32_dp = float(np.abs(probs - reference).max())
        log(f"fp32 ONNX vs transformers: max |Δp| {fp32_dp:.2e}")
        if fp32_dp > IMPORT_TOLERANCE:
            raise RuntimeError(f"the exported FP32 graph differs from the transformers model by {fp32_dp:.2e}")
        languages = [e.language for e in examples]
        result = metrics_by_language(y_true, probs.argmax(1), languages, labels)
        evaluated = {"test": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result["all"].items()},
                     "by_language": result["by_language"], "max_abs_dp_vs_transformers": round(fp32_dp, 8),
                     "set": gate_set}
        # No temperature for an imported model: it answers exactly what the transformers model does
        # (its calibration is its author's); the ECE on --data is reported so the user can judge.
        if data is not None:
            evaluated["test"]["ece"] = round(expected_calibration_error(probs, y_true), 4)
        candidates = select_golden(languages, y_true, reference, {"fp32": probs}, count=3 * GOLDEN_COUNT)
        chosen, golden_dp = stable_golden(candidates, seqs, y_true, reference, {"fp32": session},
                                          int(pad_id), GOLDEN_COUNT, max_length)
        if not chosen:
            raise RuntimeError("no example qualifies for the golden set (every variant right with a clear margin)")
        golden_probs = reference
        with open(staging / GOLDEN_FILE, "w", encoding="utf-8") as fh:
            for i in chosen:
                fh.write(json.dumps({"text": examples[i].text, "language": examples[i].language,
                                     "label": labels[int(y_true[i])],
                                     "probs": [round(float(p), 7) for p in golden_probs[i]]}, ensure_ascii=False) + "\n")
        variants = {"fp32": Variant(
            name="fp32", file=file_entry(staging, fp32_path.name), precision="fp32", weights_storage="fp32",
            data_files=(file_entry(staging, shared),) if shared else (),
            metrics=evaluated,
            golden_tolerance=golden_tolerance(golden_dp["fp32"], "fp32"))}
        provenance = {
            "imported_from": {"dir": str(hf_dir), "architecture": config["architectures"][0],
                              "model_type": config.get("model_type"), "name_or_path": config.get("_name_or_path")},
            "fused_operators": fusion,
            "gate_set": gate_set,
            "fp32_max_abs_dp_vs_transformers": round(fp32_dp, 8),
            "data": data.provenance() if data is not None else None,
            "tools": tool_versions("torch", "transformers", "onnx", "onnxruntime", "tokenizers", "numpy"),
        }
        manifest = Manifest(
            name=name, version="1.0.0", labels=labels,
            languages=tuple(sorted(set(languages) - {NO_LANGUAGE})) if data is not None else (),
            max_length=max_length, tokenizer=file_entry(staging, TOKENIZER_FILE), pad_id=int(pad_id),
            variants=variants, golden=file_entry(staging, GOLDEN_FILE),
            description=f"{name}: imported from {config['architectures'][0]} ({hf_dir.name})",
            provenance=provenance)
        write_manifest(staging, manifest)
        # int8 with fixed calibrated scales, gated against FP32 on the same examples
        requantize_package(staging, [e.text for e in examples], [], gate_examples, names=list(DEFAULT_INT8))
        manifest = load_package(staging).manifest
        files = sorted({staging / f.file for v in manifest.variants.values() for f in v.files()})
        sizes = {"files_bytes": sum(p.stat().st_size for p in files), "zip9_bytes": zipped_bytes(files)}
        add_manifest_section(staging, "provenance", {**manifest.provenance, "sizes": sizes,
                                                     "build_seconds": round(time.monotonic() - started, 1)})
        manifest = load_package(staging).manifest
        published = list(manifest.variants)
        swap_into(staging, out_dir)
    except BaseException:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"imported into {out_dir} in {time.monotonic() - started:.0f}s: variants {', '.join(published)}; "
        f"gate on {gate_set}")
    return manifest


def share_word_table(fp32_path: Path, vocab_rows: int) -> str | None:
    """Move the word-embedding table (the one [vocab_size, hidden] initializer) out of the FP32 graph
    into SHARED_DATA_FILE beside it, float32 as it was, and return that file name (None when the
    table is not found). The int8 variants reference the same file (models/quantize.py keeps
    external references), so a 250k-piece table is stored once instead of once per variant."""
    model = onnx.load(str(fp32_path))
    names = [init.name for init in model.graph.initializer
             if len(init.dims) == 2 and vocab_rows and init.dims[0] == vocab_rows]
    if len(names) != 1:
        log(f"import: word table not found among the initializers ({len(names)} candidates); kept inline")
        return None
    layout = write_shared_data(model, names, fp32_path.parent / SHARED_DATA_FILE)
    point_to_shared_data(model, layout, SHARED_DATA_FILE)
    onnx.save(model, str(fp32_path))
    return SHARED_DATA_FILE


def _export_fp32(wrapper: torch.nn.Module, config: dict, out_dir: Path, pad_id: int) -> tuple[Path, dict]:
    """model-fp32.onnx (float32 weights: probabilities as transformers computes them), with ONNX
    Runtime's BERT fusion (Attention, SkipLayerNorm, …) when every layer fuses; returns the
    path and the fused-operator counts ({} when the plain graph is kept)."""
    import tempfile

    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, pad_id, pad_id]], dtype=torch.long)
    mask = (ids != pad_id).long()
    fp32 = out_dir / "model-fp32.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        traced = Path(tmp) / "traced.onnx"
        with torch.no_grad():
            torch.onnx.export(wrapper, (ids, mask), str(traced), dynamo=False, opset_version=OPSET,
                              input_names=["input_ids", "attention_mask"], output_names=["logits"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                            "attention_mask": {0: "batch", 1: "seq"}, "logits": {0: "batch"}},
                              do_constant_folding=True)
        onnx.checker.check_model(str(traced))
        layers = config.get("num_hidden_layers") or config.get("n_layers") or 0
        heads = config.get("num_attention_heads") or config.get("n_heads") or 0
        hidden = config.get("hidden_size") or config.get("dim") or 0
        fused_counts: dict = {}
        try:
            from onnxruntime.transformers.optimizer import optimize_model

            fused = optimize_model(str(traced), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
            counts = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
            if counts.get("Attention", 0) == layers:
                fused.save_model_to_file(str(fp32))
                fused_counts = counts
            else:
                log(f"import: attention fusion matched {counts.get('Attention', 0)} of {layers} layers; "
                    "keeping the unfused graph")
        except Exception as exc:  # noqa: BLE001 — fusion is a speed-up; the plain graph is correct
            log(f"import: fusion skipped ({type(exc).__name__}: {exc})")
        if not fused_counts:
            shutil.copyfile(traced, fp32)
    return fp32, fused_counts
