"""`python -m models export --triton DIR`: a package's variant as a Triton Inference Server model repository.

    DIR/<package name>/config.pbtxt      ONNX Runtime backend, dynamic batching, inputs/outputs read from the graph
    DIR/<package name>/1/model.onnx      the chosen variant's graph (+ its external data files, same names)
    DIR/<package name>/labels.txt        one label a line, in logits order (Triton's classification extension)
    DIR/<package name>/tokenizer.json    the package's tokenizer, for the client (or a python-backend model)
    DIR/<package name>/decide.json       what a client must do around the graph: lengths, buckets, pad id,
                                         temperature, abstention policy (the numbers decide itself uses)
    DIR/<package name>/README.md         the same in words (docs/scoring.md, "Triton")

Triton runs only the graph: tokenizing, padding to length buckets (its dynamic batcher merges only
requests of the same shape), the temperature, the softmax and the abstention rules stay with the
client. The variant is the one `decide` picks on this machine's CPU unless --variant says otherwise.
Written into DIR/.<name>.tmp and renamed into place, so a failed export leaves nothing half-made.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from runtime.engine.batching import bucket_lengths
from runtime.engine.text import max_text_chars
from runtime.package.load import PackageError, load_package, verify_files

# ONNX TensorProto element types → Triton DataType names (model_config.proto).
TRITON_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 5: "TYPE_INT16", 6: "TYPE_INT32", 7: "TYPE_INT64",
                9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16"}
PREFERRED_BATCH_SIZES = (8, 16, 32)
MAX_QUEUE_DELAY_US = 2000  # like decide's socket server: a few ms of waiting buys full batches


def choose_variant(package_dir: Path, variant: str | None) -> tuple[str, list[str]]:
    """The variant to export and why: --variant, else decide's own choice for this CPU."""
    from runtime.platform.appdir import find_data_dir
    from runtime.platform.cpu import probe
    from runtime.platform.tiers import load_platform, select

    package = load_package(package_dir)
    if variant is not None:
        if variant not in package.manifest.variants:
            raise PackageError(f"variant {variant!r} not in package {package.manifest.name} "
                               f"(it has {', '.join(package.manifest.variants)})")
        return variant, [f"--variant {variant}"]
    features = probe()
    choice = select(features, load_platform(find_data_dir("platforms"), features.arch), package.manifest.variants.keys())
    return choice.variant, [f"decide's choice for this CPU (tier {choice.tier.name})", *choice.reasons]


def tensor_specs(graph_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """Inputs and outputs of the graph as Triton sees them (batch dimension removed) and whether
    every input's first dimension is free, i.e. the model can batch."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)

    def spec(value: Any) -> dict[str, Any]:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
        return {"name": value.name, "data_type": TRITON_TYPES[tensor.elem_type], "dims": dims}

    initializers = {init.name for init in model.graph.initializer}
    inputs = [spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [spec(v) for v in model.graph.output]
    batching = all(s["dims"] and s["dims"][0] == -1 for s in inputs + outputs)
    if batching:
        for item in inputs + outputs:
            item["dims"] = item["dims"][1:]
    return inputs, outputs, batching


def _tensor_block(item: dict[str, Any], labels: bool = False) -> list[str]:
    dims = item["dims"] or [1]  # a per-row scalar ([batch]) travels as [1] and is reshaped to []
    lines = ["  {", f'    name: "{item["name"]}"', f"    data_type: {item['data_type']}",
             f"    dims: [ {', '.join(str(d) for d in dims)} ]"]
    if not item["dims"]:
        lines.append("    reshape: { shape: [ ] }")
    if labels:
        lines.append('    label_filename: "labels.txt"')
    return [*lines, "  }"]


def config_pbtxt(name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], batching: bool,
                 max_batch: int, threads: int, comments: list[str]) -> str:
    """The text of config.pbtxt (Triton's ModelConfig in protobuf text format)."""
    lines = [f"# {line}" for line in comments]
    lines += [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {max_batch if batching else 0}"]
    for key, items in (("input", inputs), ("output", outputs)):
        blocks = [_tensor_block(item, labels=key == "output" and item["name"] == "logits") for item in items]
        lines.append(f"{key} [")
        for index, block in enumerate(blocks):
            lines += block[:-1] + ["  }," if index < len(blocks) - 1 else "  }"]
        lines.append("]")
    if batching:
        sizes = [size for size in PREFERRED_BATCH_SIZES if size <= max_batch] or [max_batch]
        lines += ["dynamic_batching {", f"  preferred_batch_size: [ {', '.join(map(str, sizes))} ]",
                  f"  max_queue_delay_microseconds: {MAX_QUEUE_DELAY_US}", "}"]
    lines += ["instance_group [", "  {", "    count: 1", "    kind: KIND_CPU", "  }", "]",
              "# level 1: basic + extended graph optimizations, as decide runs it (ALL would tie the graph",
              "# to the CPU it is optimized on)",
              "optimization { graph { level: 1 } }"]
    for key, value in (("intra_op_thread_count", threads), ("inter_op_thread_count", 1), ("execution_mode", 0)):
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    return "\n".join(lines) + "\n"


def client_contract(package_dir: Path, variant: str) -> dict[str, Any]:
    """What a Triton client does around the graph, as numbers (decide.json)."""
    manifest = load_package(package_dir).manifest
    return {"model": manifest.name, "version": manifest.version, "variant": variant, "labels": list(manifest.labels),
            "max_length": manifest.max_length, "max_text_chars": max_text_chars(manifest.max_length),
            "pad_id": manifest.pad_id, "buckets": list(bucket_lengths(manifest.max_length)),
            "temperature": manifest.temperature, "abstention": manifest.abstention_policy(variant).to_json()}


def readme(contract: dict[str, Any], reasons: list[str]) -> str:
    """The model directory's README: what a Triton user does with it."""
    novelty = contract["abstention"]["novelty_threshold"]
    return f"""# {contract['model']} {contract['version']} for Triton (variant {contract['variant']})

Exported by `python -m models export --triton` from a decide package. Variant: {'; '.join(reasons)}.

Serve: `tritonserver --model-repository <this directory's parent>` (ONNX Runtime backend; the
graph uses ONNX Runtime's contrib ops, so use a Triton whose ONNX Runtime is at least as new as
the one that made the package). Triton only runs the graph; the client does the rest:

1. Cut the text to {contract['max_text_chars']} characters and tokenize it with `tokenizer.json`
   (Hugging Face `tokenizers`), truncated to {contract['max_length']} tokens, special tokens included.
2. Pad `input_ids` with {contract['pad_id']} up to the next bucket length of {contract['buckets']} and set
   `attention_mask` to 1 on the tokens, 0 on the padding (INT64, shape [1, length] per request).
   Triton's dynamic batcher only merges requests of equal shape: buckets let short texts batch.
3. `logits` / {contract['temperature']} (the calibration temperature), softmax: the scores, in the
   order of `labels.txt`.
4. Abstain as decide does: negative labels {contract['abstention']['negative_labels'] or 'none'}; a text
   whose share of characters the tokenizer maps to its unknown piece is above
   {contract['abstention']['max_unknown_share']} is unreadable;{f" novelty output above {novelty} is out of scope;" if novelty is not None else ""}
   below your minimum score, low_score.

`decide.json` holds these numbers for a client. To keep it server-side, put the tokenizer in a
python-backend model in front of this one (an ensemble).
"""


def export_triton(package_dir: Path, out_dir: Path, variant: str | None = None, max_batch: int = 32,
                  threads: int = 1) -> Path:
    """Write the model repository entry; returns DIR/<package name>."""
    package = load_package(package_dir)
    name = package.manifest.name
    chosen, reasons = choose_variant(package_dir, variant)
    entry = package.manifest.variants[chosen]
    verify_files(package, (package.manifest.tokenizer, *entry.files()))
    target = out_dir / name
    if target.exists():
        raise FileExistsError(f"{target} exists; remove it or export into another directory")
    staging = out_dir / f".{name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "1").mkdir(parents=True)
    shutil.copyfile(package.path(entry.file), staging / "1" / "model.onnx")
    for data in entry.data_files:  # the graph names them relative to itself
        (staging / "1" / data.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package.path(data), staging / "1" / data.file)
    shutil.copyfile(package.path(package.manifest.tokenizer), staging / "tokenizer.json")
    (staging / "labels.txt").write_text("".join(f"{label}\n" for label in package.manifest.labels), encoding="utf-8")
    inputs, outputs, batching = tensor_specs(staging / "1" / "model.onnx")
    comments = [f"{name} {package.manifest.version}, variant {chosen}: {reasons[0]}",
                "Inputs are token ids: tokenize and pad on the client (README.md, decide.json)."]
    (staging / "config.pbtxt").write_text(config_pbtxt(name, inputs, outputs, batching, max_batch, threads, comments),
                                          encoding="utf-8")
    contract = client_contract(package_dir, chosen)
    (staging / "decide.json").write_text(json.dumps(contract, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (staging / "README.md").write_text(readme(contract, reasons), encoding="utf-8")
    staging.rename(target)
    return target


def run_export(args: Any) -> int:
    """`python -m models export --triton DIR [--model PKG] [--variant V] [--max-batch-size N]`."""
    import sys

    from runtime.platform.appdir import default_model_dir

    if args.max_batch_size < 1:
        print("error: --max-batch-size must be at least 1", file=sys.stderr)
        return 2
    if not args.triton.is_dir():
        args.triton.mkdir(parents=True)
    try:
        target = export_triton(args.model or default_model_dir(), args.triton, args.variant, args.max_batch_size)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[factory] Triton model repository entry {target} (config.pbtxt, 1/model.onnx, README.md); "
          f"serve it with tritonserver --model-repository {args.triton}", file=sys.stderr)
    return 0
