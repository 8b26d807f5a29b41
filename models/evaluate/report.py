"""Markdown tables from a package's manifest (what models/README.md quotes)."""

from __future__ import annotations

from pathlib import Path

from runtime.package.load import load_package


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _gate_text(gate: dict | None) -> str:
    if gate is None:
        return "reference"
    if "label_agreement_with_fp32" in gate:
        return (f"{'pass' if gate['passed'] else 'FAIL'} (accuracy drop {gate['accuracy_drop_points']:.2f} pt, "
                f"macro-F1 drop {gate['macro_f1_drop_points']:.2f} pt, worst recall drop "
                f"{gate['worst_recall_drop_points']:.2f} pt, {gate['label_agreement_with_fp32']} of "
                f"{gate['examples']} labels as fp32; {gate['set']})")
    return (f"pass (macro-F1 drop {gate.get('macro_f1_drop_points', 0):.2f} pt, worst recall drop "
            f"{gate.get('worst_recall_drop_points', 0):.2f} pt)")  # packages made before the paired gate


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
              ("| variant | file MB | max abs dp: fp32 vs the reference model, int8 vs fp32 (selftest tolerance) "
              "| batch-1 latency median / p90 ms | gate |"),
              "|---|---|---|---|---|"]
    for name in names:
        variant = manifest.variants[name]
        latency = variant.metrics.get("latency_batch1", {})
        tokens = latency.get("median_tokens", latency.get("tokens", "?"))
        # fp32: vs the reference model; int8: vs ORT fp32 on the held-out set (older packages: golden only)
        dp = variant.metrics.get("max_abs_dp_vs_reference", variant.metrics.get("golden_max_abs_dp"))
        if name != "fp32":
            dp = variant.metrics.get("max_abs_dp_vs_fp32_heldout", variant.metrics.get("max_abs_dp_vs_ort_fp32_heldout"))
        dp_text = "–" if dp is None else f"{dp:.1e}"
        lines.append(f"| {name} | {variant.file.bytes / 1e6:.1f} | {dp_text} "
                     f"({variant.golden_tolerance:.0e}; own outputs {variant.expected_tolerance or 0:.0e}) | "
                     f"{latency.get('median_ms', '–')} / {latency.get('p90_ms', '–')} "
                     f"({tokens} tokens, 1 thread) | {_gate_text(variant.metrics.get('gate'))} |")
    shared = {f.file: f.bytes for v in manifest.variants.values() for f in v.data_files}
    for file, size in shared.items():
        lines.append(f"| shared `{file}` | {size / 1e6:.1f} | | | |")
    sizes = provenance.get("sizes", {})
    counted = sizes.get("counted", f"model files (tokenizer.json: {manifest.tokenizer.bytes / 1e6:.1f} MB more)")
    lines += ["", (f"{sizes.get('files_bytes', 0) / 1e6:.1f} MB on disk, {sizes.get('zip9_bytes', 0) / 1e6:.1f} MB "
              f"zip -9 ({counted}).")]
    for name, failures in provenance.get("rejected_variants", {}).items():
        lines.append(f"\nNot published: **{name}**: {'; '.join(failures)}")

    vocabulary = provenance.get("vocabulary", {})
    unk = vocabulary.get("unk_rate_test", {})
    lines += ["", "### Vocabulary", "",
              (f"{vocabulary.get('pieces')} of {vocabulary.get('base_pieces')} pieces kept. "
              f"Unknown-piece rate on the test set: base {100 * unk.get('base', 0):.3f}%, "
              f"trimmed {100 * unk.get('published', 0):.3f}%."), "",
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
