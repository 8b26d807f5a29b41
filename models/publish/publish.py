"""One path from a model to a package, for training, recipes, import and re-quantization.

    export the FP32 graph → quantize the int8 variants → share one copy of the weights
    (models/export/shared_weights.py) → evaluate every variant through
    `runtime.engine.engine.Engine` → gate the int8 variants → calibrate → abstention (negative labels,
    novelty score and thresholds: models/publish/abstention.py) → golden set → manifest

A `Source` says what is being packaged (how to write its FP32 graph, its own reference outputs,
the held-out examples); `publish` runs `STEPS` on a `Draft` in a staging directory next to
`--out`, writes manifest.json once with `runtime.package.manifest.write_manifest`, and renames the
directory into place. On any exception or signal the staging directory is removed. A step is a
function of the draft: one more evaluation or threshold step is one more entry in the list.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path

import numpy as np

from models.data.datasets import Example
from models.gate.calibration import expected_calibration_error, fit_temperature, softmax_t
from models.gate.golden import (
    EXPECTED_TOLERANCE,
    FALLBACK_MARGIN,
    GOLDEN_FILE,
    GoldenCandidates,
    clear_cut,
    golden_tolerance,
    record_runs,
    worst_dp,
    write_golden,
)
from models.gate.measure import classify_probs, engine_latency_ms
from models.progress import log
from models.publish.abstention import scope
from models.publish.staging import USER_ERRNOS, staging_dir, swap_into
from models.training.metrics import classification_metrics, metrics_by_language, quantization_gate
from runtime.package.load import FileEntry, Manifest, Package, Variant, file_entry
from runtime.package.manifest import write_manifest

TOKENIZER_FILE = "tokenizer.json"
GATE_RULE = ("paired with fp32: accuracy drop <= 1.5 points; no class recall drop > 3 points with "
             "one-sided exact McNemar p < 0.05")


class PublishError(Exception):
    """The model cannot be published as asked (the message says why and what to change)."""


@dataclass(frozen=True)
class Fp32Graph:
    """What a source's exporter wrote into the staging directory."""

    graph: str  # file name of the FP32 graph
    data_files: tuple[str, ...]  # external-data files it references (shared with the int8 graphs)
    weights_storage: str
    provenance: dict = field(default_factory=dict)  # e.g. the fused operators


@dataclass(frozen=True)
class Heldout:
    """Labelled examples every variant is measured on: the gate pairs validation + test with FP32,
    the temperature is fitted on validation, the manifest's test metrics come from test."""

    validation: list[Example]
    test: list[Example]
    labelled_by: str = "true labels"
    description: str = "validation+test"


@dataclass
class Source:
    """A model to package and what the steps need to know about it."""

    name: str
    version: str
    description: str
    labels: tuple[str, ...]
    languages: tuple[str, ...]
    max_length: int
    pad_id: int
    tokenizer_json: dict
    write_fp32: Callable[[Path], Fp32Graph]
    # the model the package is made from: logits (any per-row offset) for texts, temperature 1
    reference_logits: Callable[[list[str]], np.ndarray]
    reference_texts: list[str]  # where the FP32 graph must reproduce the reference
    reference_tolerance: float  # max |Δp| allowed there
    heldout: Heldout
    calibration_texts: list[str]  # the int8 activation ranges are calibrated on these
    calibration_source: str
    golden_candidates: list[Example]
    variants: tuple[str, ...] = ("fp32", "int8-u8u8", "int8-u8s8", "int8-u8s7")
    golden_count: int = 30
    calibrate: bool = True  # fit a temperature on the validation split
    calibration: dict = field(default_factory=dict)  # kept as it is when calibrate is False
    provenance: dict = field(default_factory=dict)
    # abstention (models/publish/abstention.py): labels meaning "not a case", the examples the novelty
    # score is fitted on (their case rows) and the share of held-out cases it may flag (0 = none)
    negative_labels: tuple[str, ...] = ()
    novelty_fit: list[Example] = field(default_factory=list)
    novelty_flag_rate: float = 0.0
    max_unknown_share: float = 0.5
    scope_flag_target: float = 0.0  # > 0: choose the negative margin on validation (models/publish/abstention.py)
    negative_margin: float | None = None  # a margin fixed beforehand (the recipe's), recorded with its figures


@dataclass
class Draft:
    """The package while the steps make it, in its staging directory."""

    source: Source
    staging: Path
    variants: dict[str, Variant] = field(default_factory=dict)
    probs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # variant → set → probabilities
    calibration: dict = field(default_factory=dict)
    abstention: dict = field(default_factory=dict)
    golden: FileEntry | None = None
    provenance: dict = field(default_factory=dict)
    rejected: dict[str, list[str]] = field(default_factory=dict)
    smoothing: dict[str, list] = field(default_factory=dict)  # SmoothQuant factors per weight (quantize)

    def manifest(self) -> Manifest:
        """The manifest as far as the steps have got."""
        source = self.source
        return Manifest(name=source.name, version=source.version, labels=source.labels,
                        languages=source.languages, max_length=source.max_length,
                        tokenizer=file_entry(self.staging, TOKENIZER_FILE), pad_id=source.pad_id,
                        variants=dict(self.variants), golden=self.golden, description=source.description,
                        provenance=self.provenance, calibration=self.calibration, abstention=self.abstention)

    def engine(self, name: str):
        """The runtime's engine for one variant of the draft (1 thread; the draft's temperature)."""
        from runtime.engine.engine import Engine, SessionSettings

        return Engine(Package(self.staging, self.manifest()), name, SessionSettings(threads=1), verify=False)

    @property
    def temperature(self) -> float:
        return float(self.calibration.get("temperature", 1.0))

    def set_metrics(self, name: str, **values) -> None:
        variant = self.variants[name]
        self.variants[name] = replace(variant, metrics={**variant.metrics, **values})


def _label_index(examples: Sequence[Example], labels: tuple[str, ...]) -> np.ndarray:
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index[e.label] for e in examples], dtype=np.int64)


# ----------------------------------------------------------------------------------------- steps

def export(draft: Draft) -> None:
    """tokenizer.json and the FP32 graph (with its external-data files)."""
    source = draft.source
    (draft.staging / TOKENIZER_FILE).write_text(json.dumps(source.tokenizer_json, ensure_ascii=False),
                                                encoding="utf-8")
    log("exporting the FP32 ONNX graph")
    graph = source.write_fp32(draft.staging)
    draft.provenance.update(graph.provenance)
    draft.variants["fp32"] = Variant(
        name="fp32", file=file_entry(draft.staging, graph.graph), precision="fp32",
        data_files=tuple(file_entry(draft.staging, f) for f in graph.data_files),
        weights_storage=graph.weights_storage)


def host_tier() -> tuple[str, tuple[str, ...]] | None:
    """This machine's CPU tier and the variants it serves (None: the probe cannot tell)."""
    from runtime.platform.appdir import find_data_dir
    from runtime.platform.cpu import probe
    from runtime.platform.tiers import CpuUnsupported, load_platform, select

    try:
        features = probe()
        tier = select(features, load_platform(find_data_dir("platforms"), features.arch), None).tier
    except (CpuUnsupported, OSError, ValueError, KeyError):
        return None
    return tier.name, tier.variants


def quantize(draft: Draft) -> None:
    """The int8 variants from the FP32 graph, activation scales calibrated on the source's texts.

    A variant whose integer products depend on the kernel (int8-u8s8 saturates on x86 without
    VNNI) only when this machine's tier serves it: elsewhere neither its accuracy nor its selftest
    outputs could be measured, and it is left out with that reason in the manifest. Variants that
    are exact on every kernel (u8u8; u8s7's 7-bit weights cannot saturate) are made anywhere.
    """
    from models.quantize.int8 import (
        VARIANTS_BY_NAME,
        calibration_record,
        quantize_variants,
        text_feeds,
    )
    from runtime.engine.text import TextEncoder

    source, fp32 = draft.source, draft.variants["fp32"]
    host = host_tier()
    names = []
    for name in (n for n in source.variants if n in VARIANTS_BY_NAME):
        if host is None or name in host[1] or VARIANTS_BY_NAME[name].exact_everywhere:
            names.append(name)
        else:
            draft.rejected[name] = [(f"not made on this machine: its CPU tier {host[0]} never serves {name} "
                                    f"({VARIANTS_BY_NAME[name].why}), so its accuracy and selftest outputs "
                                    "cannot be measured here; publish from a machine whose tier serves it")]
            log(f"leaving out {name}: this machine's tier {host[0]} does not serve it")
    if not names:
        return
    log(f"int8 variants {', '.join(names)}: calibrating on {len(source.calibration_texts)} texts "
        f"({source.calibration_source})")
    encoder = TextEncoder((draft.staging / TOKENIZER_FILE).read_text(encoding="utf-8"), source.max_length, source.pad_id)
    feeds = text_feeds(encoder, source.calibration_texts)
    record = calibration_record(feeds, source.calibration_source)
    storage = "int8" + "".join(fp32.weights_storage.partition(";")[1:])
    for name, path in quantize_variants(draft.staging / fp32.file.file, draft.staging, feeds, names,
                                        smoothing=draft.smoothing).items():
        draft.variants[name] = Variant(name=name, file=file_entry(draft.staging, path.name), precision="int8",
                                       data_files=fp32.data_files, weights_storage=storage,
                                       quantization=VARIANTS_BY_NAME[name].settings(record))


def share(draft: Draft) -> None:
    """One copy of the weights: the FP32 graph's fp16 weights in weights.bin, the int8 graphs
    quantizing them from there at load (models/export/shared_weights.py), so a variant costs its graph."""
    from models.export.shared_weights import WEIGHTS_FILE, share_weights

    int8 = [name for name, v in draft.variants.items() if v.precision == "int8"]
    if not int8:
        return
    staging = draft.staging
    record = share_weights(staging / draft.variants["fp32"].file.file,
                           [staging / draft.variants[name].file.file for name in int8], draft.smoothing)
    draft.provenance["shared_weights"] = record
    weights = file_entry(staging, WEIGHTS_FILE)
    for name, variant in list(draft.variants.items()):
        storage = ("fp16 in weights.bin, cast to float32 at load" if variant.precision == "fp32" else
                   "fp16 in weights.bin, quantized to int8 at load (ORT folds the constant nodes)")
        kept = [entry for entry in variant.data_files if entry.file != WEIGHTS_FILE]
        draft.variants[name] = replace(variant, file=file_entry(staging, variant.file.file),
                                       data_files=(*kept, weights), weights_storage=storage)


def evaluate(draft: Draft) -> None:
    """Every variant through the runtime's engine on the held-out and reference texts; the FP32
    graph must give the reference model's probabilities there."""
    source, held = draft.source, draft.source.heldout
    sets = {"val": [e.text for e in held.validation], "test": [e.text for e in held.test],
            "reference": source.reference_texts}
    reference = softmax_t(source.reference_logits(source.reference_texts), draft.temperature)
    y_test = _label_index(held.test, source.labels)
    for name in list(draft.variants):
        log(f"evaluating {name} through the runtime's engine: {len(sets['test'])} test, "
            f"{len(sets['val'])} validation, {len(sets['reference'])} reference texts")
        engine = draft.engine(name)
        draft.probs[name] = {key: classify_probs(engine, texts) for key, texts in sets.items()}
        probs = draft.probs[name]
        metrics = {"set": held.labelled_by,
                   "max_abs_dp_vs_reference": round(float(np.abs(probs["reference"] - reference).max()), 8),
                   "latency_batch1": engine_latency_ms(engine, sets["test"] or sets["reference"])}
        if len(y_test):
            result = metrics_by_language(y_test, probs["test"].argmax(1), [e.language for e in held.test],
                                         source.labels)
            metrics["test"] = {**{k: round(v, 4) if isinstance(v, float) else v for k, v in result["all"].items()},
                               "recall": {k: round(v, 4) for k, v in result["all"]["recall"].items()},
                               "ece": round(expected_calibration_error(probs["test"], y_test), 4)}
            metrics["by_language"] = result["by_language"]
            if "steps_test_metrics" in draft.provenance:  # a trained model: what each step cost
                draft.provenance["steps_test_metrics"].setdefault("onnx_variants", {})[name] = {
                    k: metrics["test"][k] for k in ("accuracy", "macro_f1")}
        draft.set_metrics(name, **metrics)
        del engine
        if name == "fp32":  # first: nothing else is worth measuring if the graph is not the model
            _check_reference(draft, reference)


def _check_reference(draft: Draft, reference: np.ndarray) -> None:
    source = draft.source
    dp = draft.variants["fp32"].metrics["max_abs_dp_vs_reference"]
    log(f"fp32 graph vs the reference model: max |Δp| {dp:.2e} on {len(source.reference_texts)} texts")
    if dp > source.reference_tolerance:
        worst = int(np.abs(draft.probs["fp32"]["reference"] - reference).max(1).argmax())
        raise PublishError(f"the exported FP32 graph does not reproduce the model: max |Δp| {dp:.2e} > "
                           f"{source.reference_tolerance:.0e} (worst on {source.reference_texts[worst][:60]!r})")


def gate(draft: Draft) -> None:
    """Each int8 variant paired with FP32 on the held-out examples; a rejected one is deleted and
    its reasons go to the manifest (`provenance.rejected_variants`)."""
    source, held = draft.source, draft.source.heldout
    y = _label_index(held.validation + held.test, source.labels)
    ref = np.concatenate([draft.probs["fp32"]["val"], draft.probs["fp32"]["test"]]).argmax(1) if len(y) else y
    for name in [n for n in draft.variants if n != "fp32"]:
        if not len(y):
            failures = ["no held-out examples to gate it on"]
        else:
            cand = np.concatenate([draft.probs[name]["val"], draft.probs[name]["test"]]).argmax(1)
            result = quantization_gate(y, ref, cand, source.labels)
            reference, candidate = (classification_metrics(y, p, source.labels) for p in (ref, cand))
            draft.set_metrics(name, gate={
                **asdict(result), "examples": len(y), "set": held.description, "labelled_by": held.labelled_by,
                "rule": GATE_RULE,
                "macro_f1_drop_points": round(100 * (reference["macro_f1"] - candidate["macro_f1"]), 3),
                "worst_recall_drop_points": round(max(100 * (r - candidate["recall"].get(k, 0.0))
                                                      for k, r in reference["recall"].items()), 3),
                "label_agreement_with_fp32": int((cand == ref).sum())})
            failures = list(result.failures)
            if result.passed:
                draft.set_metrics(name, max_abs_dp_vs_fp32_heldout=round(float(np.abs(
                    np.concatenate([draft.probs[name]["val"], draft.probs[name]["test"]])
                    - np.concatenate([draft.probs["fp32"]["val"], draft.probs["fp32"]["test"]])).max()), 6))
                continue
        log(f"gate REJECTS {name}: {'; '.join(failures)}")
        draft.rejected[name] = failures
        (draft.staging / draft.variants.pop(name).file.file).unlink()


def calibrate(draft: Draft) -> None:
    """A softmax temperature fitted on FP32's validation outputs (min NLL), with ECE before/after."""
    source, held = draft.source, draft.source.heldout
    if not (source.calibrate and held.validation):
        return
    y_val, y_test = (_label_index(examples, source.labels) for examples in (held.validation, held.test))
    # the engine answered at temperature 1: log p is the logits up to a per-row constant
    val_logits, test_logits = (np.log(np.maximum(draft.probs["fp32"][key], 1e-300)) for key in ("val", "test"))
    temperature = fit_temperature(val_logits, y_val)
    draft.calibration = {
        "temperature": round(temperature, 4), "fitted_on": "validation", "examples": len(y_val),
        "ece_before": round(expected_calibration_error(softmax_t(val_logits), y_val), 4),
        "ece_after": round(expected_calibration_error(softmax_t(val_logits, temperature), y_val), 4),
        "test_ece_before": round(expected_calibration_error(softmax_t(test_logits), y_test), 4),
        "test_ece_after": round(expected_calibration_error(softmax_t(test_logits, temperature), y_test), 4)}
    log(f"calibration: temperature {temperature:.3f}, validation ECE {draft.calibration['ece_before']:.3f} → "
        f"{draft.calibration['ece_after']:.3f}")


def golden(draft: Draft) -> None:
    """golden.jsonl: clear-cut examples with the reference's probabilities (at the final temperature)
    and each variant's own outputs, recorded through the engine as selftest runs them."""
    source = draft.source
    examples = source.golden_candidates
    texts = [e.text for e in examples]
    reference = softmax_t(source.reference_logits(texts), draft.temperature)
    candidates = GoldenCandidates(texts, [e.language for e in examples], _label_index(examples, source.labels),
                                  reference, source.heldout.labelled_by)
    count = source.golden_count
    chosen, expected = record_runs(draft.engine, list(draft.variants), candidates, clear_cut(candidates, 3 * count),
                                   count)
    if not chosen:
        # A weak model (tiny data, --quick) may get no example right with a clear margin; the golden
        # set checks that the runtime reproduces the factory's outputs, so the reference's own
        # confident answers serve (recorded in the provenance).
        log("golden set: no example is classified right with a clear margin; using the reference's confident answers")
        candidates = replace(candidates, labels=reference.argmax(1), labelled_by="the reference model's predictions "
                             "(no example was right with a clear margin)")
        chosen, expected = record_runs(draft.engine, list(draft.variants), candidates,
                                       clear_cut(candidates, 3 * count, FALLBACK_MARGIN), count)
    if not chosen:
        raise PublishError("no example is classified with a clear margin, identically by every variant: the "
                           "package could not verify itself (selftest). Train longer (no --quick) or add examples.")
    write_golden(draft.staging / GOLDEN_FILE, candidates, chosen, source.labels, expected)
    draft.golden = file_entry(draft.staging, GOLDEN_FILE)
    draft.provenance["golden_labels"] = candidates.labelled_by
    for name in draft.variants:
        draft.set_metrics(name, golden_max_abs_dp=round(worst_dp(expected[name], reference[chosen]), 6))
        draft.variants[name] = replace(draft.variants[name], expected_tolerance=EXPECTED_TOLERANCE[name],
                                       golden_tolerance=golden_tolerance(name, expected[name], reference[chosen]))


STEPS: tuple[Callable[[Draft], None], ...] = (export, quantize, share, evaluate, gate, calibrate, scope, golden)


# ----------------------------------------------------------------------------------------- the package

def zipped_bytes(paths: Sequence[Path]) -> int:
    """About the size of a `zip -9` of the files (deflate level 9 + zip headers), read in blocks."""
    total = 22  # end of central directory
    for path in paths:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        size = 0
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                size += len(compressor.compress(block))
        size += len(compressor.flush())
        total += min(size, path.stat().st_size) + 30 + 46 + 2 * len(path.name)  # stored if deflate does not help
    return total


def _peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def tool_versions(*packages: str) -> dict[str, str]:
    """Installed versions of the packages that made the package (what is installed, else absent)."""
    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _finish(draft: Draft, started: float, timings: dict) -> Manifest:
    files = sorted({draft.staging / f.file for v in draft.variants.values() for f in v.files()}
                   | {draft.staging / TOKENIZER_FILE, draft.staging / GOLDEN_FILE})
    draft.provenance.update({
        "rejected_variants": draft.rejected,
        "sizes": {"files_bytes": sum(p.stat().st_size for p in files), "zip9_bytes": zipped_bytes(files),
                  "counted": "every package file but manifest.json"},
        "tools": tool_versions("torch", "transformers", "onnx", "onnxruntime", "tokenizers", "numpy"),
        "timings_seconds": timings, "build_seconds": round(time.monotonic() - started, 1)})
    manifest = draft.manifest()
    write_manifest(draft.staging, manifest)
    return manifest


def publish(source: Source, out_dir: Path, steps: Sequence[Callable[[Draft], None]] = STEPS,
            started: float | None = None) -> Manifest:
    """Run the steps in a staging directory next to `out_dir`, write the manifest once and put the
    package in place; on any failure or signal out_dir is left as it was and nothing stays behind."""
    started = time.monotonic() if started is None else started
    staging = staging_dir(out_dir)
    try:
        draft = Draft(source, staging, provenance=dict(source.provenance), calibration=dict(source.calibration))
        timings: dict[str, float] = dict(draft.provenance.pop("timings_seconds", {}))
        for step in steps:
            begun = time.monotonic()
            step(draft)
            timings[step.__name__] = round(time.monotonic() - begun, 1)
            log(f"{step.__name__}: {timings[step.__name__]:.0f}s, peak RSS so far {_peak_rss_gb():.2f} GB")
        manifest = _finish(draft, started, timings)
        swap_into(staging, out_dir)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in USER_ERRNOS and exc.filename is None:
            # a failed write() names no file: say where the package and the quantizer's scratch go
            raise OSError(exc.errno, exc.strerror, f"{out_dir.parent} or {tempfile.gettempdir()}") from exc
        raise
    log(f"package {out_dir}: variants {', '.join(manifest.variants)}"
        + (f"; rejected {', '.join(draft.rejected)}" if draft.rejected else ""))
    return manifest
