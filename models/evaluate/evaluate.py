"""A package measured through the runtime's own code: `runtime.engine.engine.Engine` (its tokenizer,
buckets, batching and calibrated softmax) on labelled texts.

`python -m models evaluate` classifies through models/gate/measure.py, as every evaluation the
factory makes while publishing a package does (models/publish/publish.py), so the figures are what
ships. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.gate.measure import classify_results, engine_latency_ms


def scope_figures(package, variant: str, examples: list, results: list) -> dict:
    """The abstention report of one variant (models/data/scope_metrics.py) on a file with a kind column:
    the runtime's own decision for every text; for cases also per language."""
    from models.data.scope_metrics import CASE, scope_report, style_report
    from runtime.package.abstain import decide

    policy = package.manifest.abstention_policy(variant)
    decisions = [decide(r.probs, policy, r.unknown_share, r.novelty) for r in results]
    kinds = [e.kind or CASE for e in examples]
    truths = [e.label or None for e in examples]
    report = scope_report(kinds, truths, decisions)
    by_language: dict[str, list] = {}
    for kind, example, decision in zip(kinds, examples, decisions):
        if kind == CASE:
            by_language.setdefault(example.language, []).append((example.label, decision))
    report["case_by_language"] = {
        language: {"n": len(rows), "leaning_accuracy": round(sum(d.leaning == t for t, d in rows) / len(rows), 4),
                   "flagged": round(sum(d.abstained for _, d in rows) / len(rows), 4)}
        for language, rows in sorted(by_language.items())}
    styles = [e.style for e in examples]
    if any(styles):
        report["by_style"] = style_report(kinds, styles, truths, decisions)
    return report


def check_kinds(package, examples: list) -> list[str]:
    """Warnings for kinds of texts the package has no way to flag (one line each)."""
    from models.data.scope_metrics import NON_CASES

    manifest = package.manifest
    kinds = sorted({e.kind for e in examples if e.kind in NON_CASES})
    if kinds and not manifest.abstention.get("negative_labels") and manifest.novelty_output() is None:
        return [(f"warning: {manifest.name} has no negative label and no novelty score: its {', '.join(kinds)} "
                 "texts can only be flagged as unreadable (or low_score with --min-score)")]
    return []


def evaluate_package(model_dir: Path, data_file: Path | list[Path], variant: str | None = None, text_column: str = "text",
                     label_column: str = "label", latency_runs: int = 100) -> dict:
    """Metrics of a package's variants on a labelled CSV/JSONL file, measured through the runtime's code.

    Per variant: accuracy, macro-F1, per-class recall, the most frequent confusions, a per-language
    table when the file has a `lang` column, calibration (coverage and accuracy at score ≥ 0.5 /
    0.7 / 0.9, and ECE of the scores the runtime answers — calibrated with the manifest's
    temperature when it has one — plus ECE without it), agreement with
    FP32, and batch-1 latency. Raises DataError / PackageError on bad input.
    """
    from models.data.userdata import DataError, join_loaded, read_labelled_file
    from models.gate.calibration import coverage_table, expected_calibration_error, softmax_t
    from models.training.metrics import classification_metrics, confusion_pairs, metrics_by_language
    from runtime.engine.engine import Engine, SessionSettings
    from runtime.package.load import PackageError, load_package

    package = load_package(model_dir)
    manifest = package.manifest
    names = [variant] if variant else list(manifest.variants)
    if variant and variant not in manifest.variants:
        raise PackageError(f"{model_dir}: no variant {variant!r} (variants: {', '.join(manifest.variants)})")
    files = list(data_file) if isinstance(data_file, (list, tuple)) else [data_file]
    data = join_loaded([read_labelled_file(f, text_column, label_column, for_training=False) for f in files])
    data_file = " + ".join(map(str, files))
    index = {label: i for i, label in enumerate(manifest.labels)}
    unknown = sorted({e.label for e in data.examples if e.label} - set(index))
    if unknown:
        raise DataError(f"{data_file}: column {label_column!r}: labels not in the model: {', '.join(map(repr, unknown))} "
                        f"(the model's labels: {', '.join(manifest.labels)})")
    labelled = [i for i, e in enumerate(data.examples) if e.label]  # non-cases have no right label
    if not labelled:
        raise DataError(f"{data_file}: no row has a label (non-case kinds only): nothing to measure accuracy on")
    has_kinds = any(e.kind for e in data.examples)
    temperature = manifest.calibration.get("temperature")
    all_texts = [e.text for e in data.examples]
    texts = [all_texts[i] for i in labelled]
    y_true = np.array([index[data.examples[i].label] for i in labelled], dtype=np.int64)
    languages = [data.examples[i].language for i in labelled]
    report: dict = {"model": manifest.name, "version": manifest.version, "data": str(data_file),
                    "data_sha256": data.sha256, "examples": len(texts), "skipped": data.skipped,
                    "labels": list(manifest.labels), "variants": {}, "warnings": check_kinds(package, data.examples),
                    "texts": len(all_texts)}
    fp32_pred = None
    for name in names:
        engine = Engine(package, name, SessionSettings(threads=1))
        results = classify_results(engine, all_texts)
        probs = np.array([results[i].probs for i in labelled], dtype=np.float64).reshape(len(texts), len(manifest.labels))
        pred = probs.argmax(1)
        overall = classification_metrics(y_true, pred, manifest.labels)
        result: dict = {
            "accuracy": round(overall["accuracy"], 4), "macro_f1": round(overall["macro_f1"], 4),
            "recall": {k: round(v, 4) for k, v in overall["recall"].items()},
            "confusions": confusion_pairs(y_true, pred, manifest.labels),
            "calibration": {"coverage": coverage_table(probs, y_true),
                            "ece": round(expected_calibration_error(probs, y_true), 4)},
            "latency_batch1": engine_latency_ms(engine, texts, latency_runs),
        }
        if temperature:
            # The engine answers calibrated scores (logits / T); log(p) · T gives back the raw
            # logits up to a per-row constant, i.e. the scores before calibration.
            raw = softmax_t(np.log(np.maximum(probs, 1e-300)) * float(temperature))
            result["calibration"].update({"temperature": temperature,
                                          "ece_uncalibrated": round(expected_calibration_error(raw, y_true), 4),
                                          "coverage_uncalibrated": coverage_table(raw, y_true)})
        if data.has_language:
            result["by_language"] = metrics_by_language(y_true, pred, languages, manifest.labels)["by_language"]
        if has_kinds:
            result["abstention"] = scope_figures(package, name, data.examples, results)
        if name == "fp32":
            fp32_pred = pred
        elif fp32_pred is not None:
            result["agreement_with_fp32"] = round(float(np.mean(pred == fp32_pred)), 4)
            result["accuracy_drop_vs_fp32_points"] = round(
                100 * (report["variants"]["fp32"]["accuracy"] - result["accuracy"]), 2)
        report["variants"][name] = result
    return report


def format_evaluation(report: dict) -> str:
    """The evaluation report as Markdown tables (what `python -m models evaluate` prints)."""
    names = list(report["variants"])
    variants = report["variants"]
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}"
    lines = [f"## {report['model']} {report['version']} on {report['data']} ({report['examples']} labelled examples"
             + (f" of {report['texts']} texts" if report.get("texts", report["examples"]) != report["examples"] else "")
             + ")", ""]
    lines += [*report.get("warnings", ()), ""] if report.get("warnings") else []
    if report["skipped"]:
        lines += ["skipped: " + ", ".join(f"{n} {why}" for why, n in report["skipped"].items()), ""]
    lines += ["| variant | accuracy | macro-F1 | ECE (calibrated) | agreement with fp32 | batch-1 latency median / p90 ms |",
              "|---|---|---|---|---|---|"]
    for name in names:
        v = variants[name]
        lines.append(f"| {name} | {pct(v['accuracy'])} | {pct(v['macro_f1'])} | {v['calibration']['ece']:.3f}"
                     + (f" (T=1: {v['calibration']['ece_uncalibrated']:.3f})" if "ece_uncalibrated" in v["calibration"] else "")
                     + f" | {pct(v.get('agreement_with_fp32', 1.0 if name == 'fp32' else None))}"
                     + f" | {v['latency_batch1']['median_ms']:.2f} / "
                     f"{v['latency_batch1']['p90_ms']:.2f} |")
    if "by_language" in variants[names[0]]:
        lines += ["", "### Accuracy (%) per language", "", "| language | n | " + " | ".join(names) + " |",
                  "|---|---|" + "---|" * len(names)]
        for language, row in variants[names[0]]["by_language"].items():
            lines.append(f"| {language} | {row['n']} | "
                         + " | ".join(pct(variants[n]["by_language"][language]["accuracy"]) for n in names) + " |")
    lines += ["", "### Recall (%) per class", "", "| label | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label in report["labels"]:
        if label in variants[names[0]]["recall"]:
            lines.append(f"| {label} | " + " | ".join(pct(variants[n]["recall"].get(label)) for n in names) + " |")
    lines += ["", "### Calibration: coverage / accuracy (%) at top score ≥ threshold", "",
              "| threshold | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, row in enumerate(variants[names[0]]["calibration"]["coverage"]):
        cells = [f"{pct(variants[n]['calibration']['coverage'][i]['coverage'])} / "
                 f"{pct(variants[n]['calibration']['coverage'][i]['accuracy'])}" for n in names]
        lines.append(f"| {row['threshold']} | " + " | ".join(cells) + " |")
    lines += _format_abstention(variants)
    lines += ["", f"### Most frequent confusions ({names[0]})", "", "| true | predicted | count |", "|---|---|---|"]
    lines += [f"| {c['true']} | {c['predicted']} | {c['count']} |" for c in variants[names[0]]["confusions"]]
    return "\n".join(lines) + "\n"


def _format_abstention(variants: dict) -> list[str]:
    """Per variant the flag rates per kind, and for fp32 (or the first) the cases per language."""
    from models.data.scope_metrics import format_scope, format_styles

    lines: list[str] = []
    for name, result in variants.items():
        if "abstention" not in result:
            continue
        report = dict(result["abstention"])
        by_language = report.pop("case_by_language", {})
        by_style = report.pop("by_style", {})
        lines += ["", f"### Abstention ({name}): flagged per kind of text (%)", "", format_scope(report).rstrip("\n")]
        if by_style:
            lines += ["", f"### Per writing style ({name}, %)", "", format_styles(by_style).rstrip("\n")]
        if by_language and name == next(iter(variants)):
            lines += ["", f"### Cases per language ({name}): leaning accuracy / flagged (%)", "",
                      "| language | n | leaning right | flagged |", "|---|---|---|---|"]
            lines += [f"| {lang} | {row['n']} | {100 * row['leaning_accuracy']:.1f} | {100 * row['flagged']:.1f} |"
                      for lang, row in by_language.items()]
    return lines
