"""Markdown tables from a package's manifest (what models/README.md quotes)."""

from __future__ import annotations

from pathlib import Path

from runtime.package import load_package


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def manifest_report(package_dir: Path) -> str:
    """Per-variant metrics by language, sizes, vocabulary/coverage, latency and step costs."""
    package = load_package(package_dir)
    manifest = package.manifest
    provenance = manifest.provenance
    names = list(manifest.variants)
    lines = [f"## {manifest.name} {manifest.version}", "", manifest.description, ""]

    lines += ["### Held-out test set, accuracy / macro-F1 (%) per language", "",
              "| language | n | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    first = manifest.variants[names[0]].metrics["by_language"]
    for language in first:
        cells = [f"{_pct(manifest.variants[n].metrics['by_language'][language]['accuracy'])} / "
                 f"{_pct(manifest.variants[n].metrics['by_language'][language]['macro_f1'])}" for n in names]
        lines.append(f"| {language} | {first[language]['n']} | " + " | ".join(cells) + " |")
    overall = [f"**{_pct(manifest.variants[n].metrics['test']['accuracy'])} / "
               f"{_pct(manifest.variants[n].metrics['test']['macro_f1'])}**" for n in names]
    lines.append(f"| **all** | {manifest.variants[names[0]].metrics['test']['n']} | " + " | ".join(overall) + " |")

    lines += ["", "### Variants", "",
              "| variant | file MB | max abs dp vs FP32 (selftest tolerance) | batch-1 latency median / p90 ms | gate |",
              "|---|---|---|---|---|"]
    for name in names:
        variant = manifest.variants[name]
        latency = variant.metrics["latency_batch1"]
        gate = variant.metrics.get("gate")
        if gate is None:
            gate_text = "reference"
        elif "label_agreement_with_fp32" in gate:  # models.quantize.requantize_package's gate
            gate_text = (f"{'pass' if gate['passed'] else 'FAIL'} (accuracy drop {gate['accuracy_drop_points']:.2f} pt, "
                         f"macro-F1 drop {gate['macro_f1_drop_points']:.2f} pt, worst recall drop "
                         f"{gate['worst_recall_drop_points']:.2f} pt, {gate['label_agreement_with_fp32']} of "
                         f"{gate['examples']} labels as fp32; {gate['set']})")
        elif "macro_f1_drop_points" in gate:  # packages built before the paired gate
            gate_text = (f"pass (macro-F1 drop {gate['macro_f1_drop_points']:.2f} pt, worst recall drop "
                         f"{gate['worst_recall_drop_points']:.2f} pt)")
        else:
            gate_text = (f"pass (accuracy drop {gate['accuracy_drop_points']:.2f} pt, agreement with fp32 "
                         f"{100 * gate['agreement']:.1f} %, worst class {gate['worst_class'] or '–'} "
                         f"p = {gate['worst_class_p']:.2f}; {gate['examples']} examples)")
        # fp32: golden texts vs PyTorch; int8 (re-quantized after export): held-out texts vs ORT fp32
        dp = variant.metrics.get("golden_max_abs_dp", variant.metrics.get("max_abs_dp_vs_ort_fp32_heldout"))
        dp_text = "–" if dp is None else f"{dp:.1e}"
        lines.append(f"| {name} | {variant.file.bytes / 1e6:.1f} | {dp_text} "
                     f"({variant.golden_tolerance:.0e}; own outputs {variant.expected_tolerance or 0:.0e}) | "
                     f"{latency['median_ms']} / {latency['p90_ms']} "
                     f"({latency['tokens']} tokens, 1 thread) | {gate_text} |")
    shared = {f.file: f.bytes for v in manifest.variants.values() for f in v.data_files}
    for file, size in shared.items():
        lines.append(f"| shared `{file}` | {size / 1e6:.1f} | | | |")
    sizes = provenance.get("sizes", {})
    lines += ["", f"All model files: {sizes.get('files_bytes', 0) / 1e6:.1f} MB on disk, "
              f"{sizes.get('zip9_bytes', 0) / 1e6:.1f} MB zip -9 (tokenizer.json: "
              f"{manifest.tokenizer.bytes / 1e6:.1f} MB more)."]
    for name, failures in provenance.get("rejected_variants", {}).items():
        lines.append(f"\nRejected by the gate: **{name}**: {'; '.join(failures)}")

    vocabulary = provenance.get("vocabulary", {})
    unk = vocabulary.get("unk_rate_test", {})
    lines += ["", "### Vocabulary", "",
              f"{vocabulary.get('pieces')} of {vocabulary.get('base_pieces')} pieces kept. "
              f"Unknown-piece rate on the test set: base {100 * unk.get('base', 0):.3f}%, "
              f"trimmed {100 * unk.get('published', 0):.3f}%.", "",
              "| language | base unk % | trimmed unk % |", "|---|---|---|"]
    for language, rate in unk.get("published_by_language", {}).items():
        base = unk.get("base_by_language", {}).get(language, float("nan"))
        lines.append(f"| {language} | {100 * base:.2f} | {100 * rate:.2f} |")

    lines += ["", "### What each step costs (test accuracy / macro-F1 %)", "", "| step | accuracy | macro-F1 |",
              "|---|---|---|"]
    for step, result in provenance.get("steps_test_metrics", {}).items():
        if "accuracy" in result:
            lines.append(f"| {step} | {_pct(result['accuracy'])} | {_pct(result['macro_f1'])} |")
        else:
            for name, sub in result.items():
                lines.append(f"| {step}: {name} | {_pct(sub['accuracy'])} | {_pct(sub['macro_f1'])} |")
    lines += ["", f"Build time: {provenance.get('build_seconds')} s."]
    return "\n".join(lines) + "\n"
