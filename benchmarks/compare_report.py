"""Write the comparison (a report dict from benchmarks/compare.py) as Markdown, JSON and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MB = 1024


def _mb(kb: int | None) -> str:
    return "–" if kb is None else f"{kb / MB:.0f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def speed_table(report: dict[str, Any], kind: str) -> list[str]:
    """Latency at batch 1 and throughput per batch size for one text set."""
    batches = report["settings"]["batches"]
    head = ["system", "p50 ms", "p95 ms", "p99 ms", *[f"items/s b{b}" for b in batches], "CPU ms/item b1",
            f"CPU ms/item b{batches[-1]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        if row["skipped"]:
            continue
        one = row["cells"].get(f"{kind}/1")
        cells = [row["system"], _num(one and one["p50_ms"], 2), _num(one and one["p95_ms"], 2),
                 _num(one and one["p99_ms"], 2)]
        cells += [_num(row["cells"][f"{kind}/{b}"]["items_per_s"]) for b in batches]
        cells.append(_num(one and one["cpu_ms_per_item"], 2))
        cells.append(_num(row["cells"][f"{kind}/{batches[-1]}"]["cpu_ms_per_item"], 2))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell_title(cell: str) -> str:
    kind, batch = cell.split("/")
    return f"{kind} b{batch} " + ("p50 ms" if batch == "1" else "items/s")


def headline_tables(report: dict[str, Any]) -> list[str]:
    """The headline: absolute figures, then FP32 vs FP32, int8 vs int8 and across, against PyTorch at its best."""
    head = report.get("headline")
    if not head or not head["rows"]:
        return []
    cells, best = head["cells"], head["torch_best"]
    lines = [("PyTorch's thread count is picked per workload and precision (the faster of "
              f"{', '.join(str(t) for t in report['torch_threads'])} threads); the chosen rows:"),
             ""]
    for precision in ("fp32", "int8"):
        picks = ", ".join(f"{c} → {best[precision][c]}" for c in cells if best[precision][c])
        if picks:
            lines.append(f"- PyTorch {precision}: {picks}")
    lines += ["", "| system | " + " | ".join(_cell_title(c) for c in cells) + " |", "|" + "---|" * (len(cells) + 1)]
    for row in head["rows"]:
        values = [row["cells"][c]["p50_ms" if c.endswith("/1") else "items_per_s"] for c in cells]
        lines.append(f"| {row['system']} | " + " | ".join(_num(v, 2 if c.endswith("/1") else 1)
                                                         for v, c in zip(values, cells)) + " |")
    groups = (("FP32 vs FP32: speed-up over PyTorch eager FP32 (its best thread count)", "fp32", "fp32"),
              ("int8 vs int8: speed-up over PyTorch dynamic int8 (its best thread count)", "int8", "int8"),
              ("Across: int8 rows over PyTorch eager FP32", "int8", "fp32"),
              ("Across: FP32 rows over PyTorch dynamic int8", "fp32", "int8"))
    for title, precision, against in groups:
        rows = [r for r in head["rows"] if r["precision"] == precision
                and r["system"] not in best[against].values()]
        if not rows or not any(best[against].values()):
            continue
        lines += ["", f"**{title}** (throughput ratio, median of per-round ratios)", "",
                  "| system | " + " | ".join(c.replace("/", " b") for c in cells) + " |",
                  "|" + "---|" * (len(cells) + 1)]
        for row in rows:
            values = [row["cells"][c][f"vs_torch_{against}"] for c in cells]
            lines.append(f"| {row['system']} | " + " | ".join(_num(v, 2) + "×" if v else "–" for v in values) + " |")
    return lines


def memory_lines(report: dict[str, Any]) -> list[str]:
    """The page's memory, start-up and agreement table, the slow-leak run, and the rows not measured."""
    lines = ["", "## Memory, start-up, same answers", "",
              ("| system | load + warm-up s | RSS after warm-up MB | peak RSS MB | cold exec → first answer ms "
               "(median) | argmax agreement | max abs Δp |"),
              "|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        if row["skipped"]:
            continue
        cold, agree = row.get("cold_first_answer") or {}, row.get("agreement") or {}
        lines.append(f"| {row['system']} | {row['load_s']:.2f} | {_mb(row['rss_after_warm_up_kb'])} | "
                     f"{_mb(row['peak_rss_kb'])} | {_num(cold.get('median_ms'), 0)} | "
                     f"{agree.get('argmax_agree', '–')} | {agree.get('max_abs_dp', '–')} |")
    lines += ["", (f"Agreement is against {report['agreement_reference']} on all short and medium texts. "
               "RSS of decide stdin/frozen is decide's own process tree; in-process rows are a worker process "
               "each (Python + the contender's libraries).")]
    leak = report["slow_leak"]
    lines += ["", "## RSS over many requests through stdin", ""]
    if "samples" in leak:
        lines += [(f"{leak['system']}, {leak['requests']} requests piped in (every text distinct, one in 100 "
                   f"medium), {leak['per_s']:.0f} requests/s: RSS grew {leak['growth_vs_warm_up_pct']:+.2f}% "
                   f"from after decide's own warm-up (its ready line, batch 1 per length bucket), "
                   f"{leak['growth_vs_1k_pct']:+.2f}% from after the first 1000 requests (piped lines are answered "
                   "in batches of up to 32, and ORT's arena grows once to the largest batch shape it meets)."), "",
                  "| answered | RSS MB | peak RSS MB |", "|---|---|---|"]
        lines += [f"| {s['answered']} | {s['rss_kb'] / MB:.1f} | {s['peak_rss_kb'] / MB:.1f} |" for s in leak["samples"]]
    else:
        lines.append(f"Not measured: {leak.get('skipped')}")
    skipped = [r for r in report["rows"] if r["skipped"]]
    if skipped:
        lines += ["", "## Rows not measured", ""]
        lines += [f"- {r['system']}: {r['skipped']}" for r in skipped]
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The whole comparison as a Markdown page."""
    model, cpu, versions = report["model"], report["cpu"], report["versions"]
    texts = report["texts"]
    lines = [
        f"# decide vs the alternatives: {model['name']} {model['version']}",
        "",
        f"Generated {report['date_utc']} UTC by `{report['command']}` in {report['run_seconds']:.0f} s.",
        "",
        (f"- CPU: {cpu['model'] or cpu['arch']} ({cpu['arch']}), {cpu['usable_cores']} usable cores; the ORT "
         f"contenders and decide use {report['threads']} threads, PyTorch runs at "
         f"{' and '.join(str(t) for t in report['torch_threads'])} (one row each). decide's tier: "
         f"{report['decide_choice']['tier']}, variant {report['decide_choice']['variant']}."),
        f"- CPU flags ({cpu['source']}): {' '.join(cpu['flags'])}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f", decide {report['decide_version']}",
        (f"- Load average (1 min) at the end: {report['load_avg_1min_end']} on {cpu['usable_cores']} cores: the "
         "machine is shared, so figures are medians of interleaved rounds "
         f"({report['settings']['rounds']} rounds × {report['settings']['seconds']} s per system and cell, "
         "system order rotated each round) and ratios are medians of per-round ratios."),
        (f"- Texts (from the package's golden set): short {texts['short']['count']} texts, "
         f"{texts['short']['min']}–{texts['short']['max']} tokens (median {texts['short']['median']}); "
         f"medium {texts['medium']['count']} texts, {texts['medium']['min']}–{texts['medium']['max']} tokens "
         f"(median {texts['medium']['median']})."),
        "",
        ("Contenders: **PyTorch eager** = transformers tokenizer + the package's model in PyTorch (models/"
         "training/classifier.py's architecture filled with the FP32 graph's own weights, benchmarks/torch_model.py), "
         "transformers' default (sdpa) attention, padding to the longest text of a batch: **fp32**, and **int8** = PyTorch's dynamic quantization "
         "(`torch.ao.quantization.quantize_dynamic`, every nn.Linear, qint8 weights, activation scales per call), "
         "at each thread count (`Nt`); **bare ORT** = a plain onnxruntime script on the package's ONNX file "
         "(benchmarks/protocol_overhead.py's BareLoop; batches padded to the longest text, as fastembed does); "
         "**fixed-128 ORT** = the same session with every input padded to 128 tokens (julia-1 article §3.1); "
         "**decide in-process** = runtime.engine.engine as `decide` builds it; **decide stdin** = `python -m runtime` "
         "over pipes (batch n = n request lines written at once; latency measured by the client); "
         "**decide frozen** = the PyInstaller binary from the bundle zip, same way. ORT rows run every variant "
         "of the package (int8-u8s8 and int8-u8u8: onnxruntime dynamic quantization with fixed calibrated "
         "activation scales, models/quantize/int8.py)."),
        "",
        "## Headline",
        "",
        *headline_tables(report),
        "",
        "## Targets",
        "",
        "| target | goal | measured | verdict | how |",
        "|---|---|---|---|---|",
    ]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['goal']} | {t['measured'] if t['measured'] is not None else '–'} | "
                     f"{t['verdict']} | {t['how']} |")
    for kind in texts:
        lines += ["", f"## {kind.capitalize()} texts: latency at batch 1, throughput per batch size", "",
                  *speed_table(report, kind)]
    lines += memory_lines(report)
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Latency per call vs batch size (per text set) and throughput per system at batch 1 and 32."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(report["texts"])
    batches = report["settings"]["batches"]
    rows = [r for r in report["rows"] if not r["skipped"]]
    fig, axes = plt.subplots(2, len(kinds), figsize=(7 * len(kinds), 10), squeeze=False)
    for col, kind in enumerate(kinds):
        ax = axes[0][col]
        colours = plt.get_cmap("tab20").colors  # tab10 would repeat a colour beyond ten rows
        for index, row in enumerate(rows):
            ax.plot(batches, [row["cells"][f"{kind}/{b}"]["p50_ms"] for b in batches], marker="o",
                    color=colours[index % len(colours)],
                    linestyle="--" if row.get("precision") == "fp32" else "-", label=row["system"])
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="p50 latency per call, ms",
               title=f"{kind} texts ({report['texts'][kind]['min']}–{report['texts'][kind]['max']} tokens)")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.grid(True, which="both", alpha=0.3)
        ax = axes[1][col]
        shown = [b for b in (batches[0], batches[-1])]
        width = 0.8 / len(shown)
        for i, batch in enumerate(shown):
            values = [row["cells"][f"{kind}/{batch}"]["items_per_s"] for row in rows]
            ax.barh([y + i * width for y in range(len(rows))], values, height=width, label=f"batch {batch}")
        ax.set_yticks([y + width * (len(shown) - 1) / 2 for y in range(len(rows))], [r["system"] for r in rows])
        ax.invert_yaxis()
        ax.set(xlabel="texts per second (median of rounds)", title=f"throughput, {kind} texts")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend()
    axes[0][0].legend(fontsize=8)
    cpu = report["cpu"]
    fig.suptitle(f"{report['model']['name']} {report['model']['version']} on {cpu['model'] or cpu['arch']}, "
                 f"{report['threads']} threads, {report['date_utc']} UTC")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_results(report: dict[str, Any], out: Path, plot_png: bool = True) -> list[Path]:
    """compare.md, compare.json and (unless disabled) compare.png in `out`; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compare.md", out / "compare.json"]
    paths[0].write_text(markdown(report), encoding="utf-8")
    paths[1].write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if plot_png and any(not r["skipped"] for r in report["rows"]):
        paths.append(out / "compare.png")
        plot(report, paths[-1])
    return paths


def best_torch(report: dict[str, Any], precision: str, cell: str) -> str | None:
    """Label of the PyTorch row of this precision with the highest throughput in a cell ("short/1")."""
    rows = [r for r in report["rows"] if r.get("system_kind") == "torch" and r["precision"] == precision
            and not r["skipped"]]
    return max(rows, key=lambda r: r["cells"][cell]["items_per_s"])["system"] if rows else None


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """FP32 against FP32, int8 against int8, then across: every ORT row against PyTorch at its best.

    Cells: batch-1 latency and batched throughput (the largest batch) on short and medium texts.
    PyTorch's thread count is chosen per cell and precision (the faster of those measured), so
    each ratio compares with PyTorch's best setting for that very workload."""
    batches = report["settings"]["batches"]
    cells = [f"{kind}/{b}" for b in dict.fromkeys((1, batches[-1])) for kind in report["texts"]]
    ratios = {(r["a"], r["b"], f"{r['texts']}/{r['batch']}"): r for r in report["ratios"]}
    best = {p: {c: best_torch(report, p, c) for c in cells} for p in ("fp32", "int8")}
    rows = []
    for row in report["rows"]:
        if row["skipped"] or row.get("system_kind") == "torch" and row["system"] not in (
                set(best["fp32"].values()) | set(best["int8"].values())):
            continue
        out: dict[str, Any] = {"system": row["system"], "precision": row["precision"], "cells": {}}
        for cell in cells:
            figures = row["cells"][cell]
            entry = {"p50_ms": figures["p50_ms"], "items_per_s": figures["items_per_s"]}
            for against in ("fp32", "int8"):
                reference = best[against][cell]
                r = ratios.get((row["system"], reference, cell)) if reference else None
                entry[f"vs_torch_{against}"] = r["throughput_ratio"] if r else None
            out["cells"][cell] = entry
        rows.append(out)
    return {"cells": cells, "torch_best": best, "rows": rows}


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's four targets, each with the measured figure and pass/miss (or why not measured)."""
    ratios = {(r["a"], r["b"], r["texts"], r["batch"]): r for r in report["ratios"]}
    rows = [r for r in report["rows"] if not r["skipped"]]
    out = []

    def add(name: str, goal: str, value: float | None, ok: bool | None, how: str) -> None:
        out.append({"target": name, "goal": goal, "measured": value,
                    "verdict": "n/a" if ok is None else "met" if ok else "MISSED", "how": how})

    torch_fp32 = best_torch(report, "fp32", "short/1")
    decide_rows = [r for r in rows if r["name"] in ("decide stdin", "decide frozen", "decide in-process")]
    for row in decide_rows:
        r = ratios.get((row["system"], torch_fp32, "short", 1))
        if r:
            int8 = row["precision"] == "int8"
            add(f"{row['system']} vs {torch_fp32} (PyTorch FP32 at its best), batch 1, short",
                "≥ 4×" if int8 else "(FP32 for reference)", r["throughput_ratio"], r["throughput_ratio"] >= 4 if int8
                else None, f"throughput ratio, median of per-round ratios; CPU time per text {r['cpu_ratio']}× less")
    for row in decide_rows:
        r = ratios.get((row["system"], f"bare ORT {row['variant']}", "short", 1))
        if r:
            overhead = round((1 / r["p50_ratio"] - 1) * 100, 1)
            cpu = round((1 / r["cpu_ratio"] - 1) * 100, 1) if r["cpu_ratio"] else None
            add(f"{row['system']} per-request overhead over bare ORT, batch 1, short", "≤ 10%",
                overhead, overhead <= 10,
                f"p50 latency ratio − 1 (median of per-round ratios); CPU time per request "
                f"{'not measured' if cpu is None else f'{cpu:+}%'}")
    for row in decide_rows:
        if row["name"] == "decide frozen" or row["precision"] != "int8":
            continue
        for kind, batch in (("short", 1), ("medium", 1), ("medium", 32)):
            r = ratios.get((row["system"], f"{row['name']} fp32", kind, batch))
            if r:
                add(f"{row['system']} vs own FP32, {kind}, batch {batch}", "≥ 1.8×", r["throughput_ratio"],
                    r["throughput_ratio"] >= 1.8, f"throughput ratio; CPU time per text {r['cpu_ratio']}× less")
    leak = report.get("slow_leak")
    if not any("int8" in t["target"] for t in out):
        add("int8 targets", "≥ 4× / ≥ 1.8×", None, None, "not measurable: " + report["no_int8"])
    if leak and "growth_vs_warm_up_pct" in leak:
        add(f"RSS growth after {leak['requests']} requests via stdin ({leak['system']})", "≤ 5%",
            leak["growth_vs_warm_up_pct"], leak["growth_vs_warm_up_pct"] <= 5, "RSS at the end vs RSS after warm-up")
        add("… of which after the first 1000 requests (slow leak)", "≤ 5%", leak["growth_vs_1k_pct"],
            leak["growth_vs_1k_pct"] <= 5, "RSS at the end vs RSS after 1000 requests")
    return out


