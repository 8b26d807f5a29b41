"""Draw docs/architecture.svg: the import layers of runtime/, models/ and bundle_spec/.

    python3 docs/draw_architecture.py          # rewrites docs/architecture.svg
    python3 docs/draw_architecture.py --check  # exit 1 if the picture is not what the layers draw

The layers come from pyproject.toml ([tool.decide.layout], the ones tests/test_layout.py checks)
and the modules from the folders, so the picture cannot drift from the code: tests/test_layout.py
runs --check. Stdlib only; the SVG is plain text, so a change of layout shows in its diff.
"""

from __future__ import annotations

import itertools
import sys
import tomllib
from html import escape
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "architecture.svg"
NOT_CODE = ("models/packages", "models/tasks")  # data, and the task folders' check scripts

# What each layer owns, by its first name in pyproject.toml (the picture's captions).
CAPTIONS = {
    "runtime.version": "version, exit codes",
    "runtime.platform": "the machine: CPU probe, tiers, cgroup quota, numeric stack, app dir",
    "runtime.package": "a package: manifest, files + sha256, signatures, abstention policy",
    "runtime.protocol": "lines ↔ typed requests, answers, error codes",
    "runtime.engine": "one model call: text → batching → ONNX session; Classifier, startup",
    "runtime.serve": "serve/: stdio, socket server, swaps  ·  score/: decide score",
    "runtime.selftest": "golden selftest, bench, swap candidates, logging",
    "runtime.cli": "decide's command line",
    "runtime": "from runtime import Classifier",
    "models": "progress lines, caches, pinned assets",
    "models.data": "datasets, a user's file, recipes, vocabulary",
    "models.training": "teacher and student (PyTorch)",
    "models.export": "the FP32 ONNX graph",
    "models.quantize": "the int8 variants",
    "models.gate": "measured through runtime's engine; calibration, golden set",
    "models.publish": "the package on disk (runtime/package/manifest.py)",
    "models.evaluate": "models evaluate | report",
    "models.train": "the jobs: train, requantize, import, keys, triton",
    "models.exits": "the commands' exit codes",
    "models.research": "experiments (never imported by the factory)",
    "bundle_spec": "shared helpers, ELF, source digest",
    "bundle_spec.pipeline": "build.py's steps in order",
    "bundle_spec.matrix": "the emulated CPU matrix",
}
COLUMN_WIDTH, GAP, MARGIN, LINE, CHAR, TITLE_CHAR, CAPTION_CHAR = 340, 36, 20, 14, 6.1, 7.3, 6.0
COLORS = {"runtime": "#dbeafe", "models": "#dcfce7", "bundle_spec": "#fef3c7"}


def layers() -> dict[str, list[list[str]]]:
    """The layers per project, bottom first, and which project imports which."""
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["decide"]["layout"]


def modules(project: str) -> list[str]:
    """Dotted names of the project's modules (packages by their own name)."""
    names = []
    for path in sorted((REPO / project).rglob("*.py")):
        relative = path.relative_to(REPO)
        if "__pycache__" in relative.parts or str(relative).startswith(NOT_CODE):
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def members(layer: list[str], all_names: list[str], every_layer: list[list[str]]) -> list[str]:
    """The modules a layer covers (the longest name in any layer wins), named inside their folder;
    entry points (`__main__`) are drawn on top instead, and a layer that is one module shows none."""
    entries = [entry for group in every_layer for entry in group]

    def owner(name: str) -> str | None:
        covering = [e for e in entries if name == e or name.startswith(e + ".")]
        return max(covering, key=len) if covering else None

    shown = []
    for name in all_names:
        entry = owner(name)
        if entry not in layer or name == entry or name.endswith("__main__"):
            continue
        inside = name[len(entry) + 1:] if "." in entry else name.split(".", 1)[1]
        shown.append(inside.replace(".", "/") + ("/" if (REPO / name.replace(".", "/")).is_dir() else ""))
    return shown


def entry_points(all_names: list[str]) -> list[str]:
    """The project's `python -m` entry points, as paths inside it."""
    return [name.split(".", 1)[1].replace(".", "/") + ".py" for name in all_names if name.endswith("__main__")]


def wrap(words: list[str], width: float, char: float) -> list[str]:
    """Words joined into lines that fit `width` pixels at `char` pixels a character."""
    lines, line = [], ""
    for word in words:
        candidate = f"{line}  {word}" if line else word
        if line and len(candidate) * char > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    return [*lines, line] if line else lines


def label(entry: str) -> str:
    """A layer's name in the picture: a folder with '/', a module with '.py', the package's own __init__."""
    if "." not in entry:
        return "__init__.py"
    path = entry.split(".", 1)[1].replace(".", "/")
    return path + ("/" if (REPO / entry.replace(".", "/")).is_dir() else ".py")


def box(x: float, y: float, fill: str, title: str, caption: str, body: list[str]) -> tuple[list[str], float]:
    """One layer: a rounded box with its name, what it owns and its modules; returns it and its height."""
    titles = wrap(title.split(" "), COLUMN_WIDTH - 16, TITLE_CHAR)
    captions = wrap(caption.split(" "), COLUMN_WIDTH - 16, CAPTION_CHAR) if caption else []
    height = 12 + LINE * len(titles) + 13 * len(captions) + LINE * len(body) + 6
    out = [f'<rect x="{x}" y="{y}" width="{COLUMN_WIDTH}" height="{height}" rx="6" fill="{fill}" stroke="#475569"/>']
    line_y = y + 16
    for line in titles:
        out.append(f'<text x="{x + 8}" y="{line_y}" class="title">{escape(line)}</text>')
        line_y += LINE
    for line in captions:
        out.append(f'<text x="{x + 8}" y="{line_y - 1}" class="caption">{escape(line)}</text>')
        line_y += 13
    for line in body:
        out.append(f'<text x="{x + 8}" y="{line_y + 1}" class="module">{escape(line)}</text>')
        line_y += LINE
    return out, height


def column(project: str, rules: dict, x: float, top: float) -> tuple[list[str], float]:
    """A project's layers, top layer at the top of the page, each with an arrow to the one below."""
    names = modules(project)
    stack = [("__main__ (python -m): entry points", "", entry_points(names))]  # empty: not drawn
    for layer in reversed(rules[project]):
        body = []
        for entry in layer:
            inside = members([entry], names, rules[project])
            if inside:
                body += wrap([f"{label(entry)}:" if len(layer) > 1 else "", *inside] if len(layer) > 1 else inside,
                             COLUMN_WIDTH - 16, CHAR)
        stack.append((" + ".join(label(entry) for entry in layer), CAPTIONS.get(layer[0], ""), body))
    parts, y, spans = [], top, []
    for title, caption, body in stack:
        if title.startswith("__main__") and not body:  # no entry point in this project
            continue
        drawn, height = box(x, y, COLORS[project], title, caption, body)
        parts += drawn
        spans.append((y, y + height))
        y += height + 18
    for (_, bottom), (next_top, _) in itertools.pairwise(spans):
        middle = x + COLUMN_WIDTH / 2
        parts.append(f'<line x1="{middle}" y1="{bottom}" x2="{middle}" y2="{next_top - 1}" class="arrow"/>')
    return parts, y


def draw() -> str:
    """The whole picture as SVG text."""
    rules = layers()
    parts, heights = [], []
    for index, project in enumerate(("runtime", "models", "bundle_spec")):
        x = MARGIN + index * (COLUMN_WIDTH + GAP)
        parts.append(f'<text x="{x}" y="{MARGIN + 14}" class="project">{project}/</text>')
        drawn, bottom = column(project, rules, x, MARGIN + 28)
        parts += drawn
        heights.append(bottom)
    footer = [("Arrows: imports point down, to the layer below or further; never up, never in a circle "
               "(tests/test_layout.py checks both)."),
              ("models/ and bundle_spec/ import runtime/ (one manifest code writes and reads packages); "
               "runtime/ imports neither.")]
    height = max(heights) + 14 + 15 * len(footer)
    for i, line in enumerate(footer):
        parts.append(f'<text x="{MARGIN}" y="{max(heights) + 8 + 15 * i}" class="caption">{escape(line)}</text>')
    width = MARGIN * 2 + 3 * COLUMN_WIDTH + 2 * GAP
    style = ("<style>text{font-family:DejaVu Sans,Arial,sans-serif}.project{font-size:13px;font-weight:bold}"
             ".title{font-size:12px;font-weight:bold}.caption{font-size:10.5px;fill:#334155}"
             ".module{font-size:10px;fill:#0f172a;font-family:DejaVu Sans Mono,monospace}"
             ".arrow{stroke:#475569;stroke-width:1.5;marker-end:url(#down)}</style>")
    marker = ('<defs><marker id="down" markerWidth="8" markerHeight="8" refX="8" refY="4" orient="auto" '
              'markerUnits="userSpaceOnUse"><path d="M0,0 L8,4 L0,8 z" fill="#475569"/></marker></defs>')
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
            f'viewBox="0 0 {width} {height:.0f}">')
    return "\n".join([head, style, marker,
                      f'<rect width="{width}" height="{height:.0f}" fill="white"/>', *parts, "</svg>"]) + "\n"


def main(argv: list[str]) -> int:
    svg = draw()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != svg:
            print(f"{OUT.relative_to(REPO)} is out of date: run python3 docs/draw_architecture.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(svg, encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
