"""The layout is the architecture: imports in runtime/, models/ and bundle_spec/ point only down the
layers written in pyproject.toml ([tool.decide.layout]), and none of them runs in a circle.

Read with `ast`, nothing is imported: every import counts, also one inside a function or under
TYPE_CHECKING (a circle through a type is still a circle for a reader). docs/architecture.md draws
the same layers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROJECTS = ("runtime", "models", "bundle_spec")
NOT_CODE = ("models/packages",)  # the shipped packages hold no project code


def layout() -> dict:
    """[tool.decide.layout] of pyproject.toml."""
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["decide"]["layout"]


def modules() -> dict[str, Path]:
    """Every module of the three projects by dotted name (a package by its own name)."""
    found = {}
    for project in PROJECTS:
        for path in sorted((REPO / project).rglob("*.py")):
            relative = path.relative_to(REPO)
            if "__pycache__" in relative.parts or str(relative).startswith(NOT_CODE):
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@dataclass(frozen=True)
class Import:
    """One import statement's target among the project modules."""

    source: str
    target: str
    line: int


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """The project modules `name` imports: `from pkg import mod` names the module, `from mod import x`
    the module, `import a.b.c` the longest known prefix; the implicit import of a parent package is
    not counted (it is not written)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    def longest(dotted: str) -> str | None:
        parts = dotted.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known), None)

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [longest(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else longest(base))
        found += [Import(name, target, node.lineno) for target in targets if target and target != name]
    return found


def layer_of(name: str, layers: dict[str, list[list[str]]]) -> tuple[str, float] | None:
    """(project, layer index) of a module: the longest name in its project's layers that covers it;
    a `__main__` module is above every layer. None when no name but the bare project covers it."""
    project = name.split(".")[0]
    if name.split(".")[-1] == "__main__":
        return project, float("inf")
    best: tuple[int, int] | None = None
    for index, layer in enumerate(layers[project]):
        for entry in layer:
            if (name == entry or name.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None or (best[0] == len(project) and name != project):
        return None
    return project, best[1]


def graph() -> tuple[dict[str, Path], list[Import]]:
    known = modules()
    return known, [imp for name, path in known.items() for imp in imports_of(name, path, known)]


def test_every_module_has_a_layer():
    rules = layout()
    known = modules()
    assert set(PROJECTS) <= set(known)
    unplaced = sorted(name for name in known if layer_of(name, rules) is None)
    assert unplaced == [], f"give these a layer in pyproject.toml [tool.decide.layout]: {unplaced}"


def test_imports_point_down_the_layers():
    rules = layout()
    known, edges = graph()
    upward = []
    for imp in edges:
        (source_project, source), (target_project, target) = layer_of(imp.source, rules), layer_of(imp.target, rules)
        where = f"{known[imp.source].relative_to(REPO)}:{imp.line} imports {imp.target}"
        if source_project != target_project:
            if target_project not in rules["imports"][source_project]:
                upward.append(f"{where} ({source_project} may import only {rules['imports'][source_project]})")
        elif target == float("inf"):
            upward.append(f"{where} (an entry point: nothing imports it)")
        elif target > source:
            upward.append(f"{where} (layer {target} above its own {source})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_no_import_circles():
    _, edges = graph()
    following: dict[str, set[str]] = {}
    for imp in edges:
        following.setdefault(imp.source, set()).add(imp.target)
    circles, state = [], {}  # state: 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(following.get(name, ())):
            if state.get(target) == 1:
                circles.append(" → ".join(path[path.index(target):] + [name, target]) if target in path
                               else f"{name} → {target}")
            elif target not in state:
                visit(target, path + [name])
        state[name] = 2

    for name in sorted(following):
        if name not in state:
            visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("source, expected", [
    ("from runtime.engine import classifier", "runtime.engine.classifier"),
    ("from runtime.engine.classifier import Classifier", "runtime.engine.classifier"),
    ("import runtime.platform.cpu", "runtime.platform.cpu"),
    ("from . import signing", "runtime.package.signing"),
    ("from .manifest import read_manifest", "runtime.package.manifest"),
])
def test_the_reader_resolves_every_form_of_import(tmp_path, source, expected):
    known = modules()
    module = tmp_path / "probe.py"
    module.write_text(source + "\n", encoding="utf-8")
    assert [imp.target for imp in imports_of("runtime.package.probe", module, known)] == [expected]


def test_an_upward_import_is_caught():
    """The rule itself: the platform layer may not reach the engine above it."""
    rules = layout()
    assert layer_of("runtime.platform.cpu", rules)[1] < layer_of("runtime.engine.engine", rules)[1]
    assert layer_of("runtime.cli", rules)[1] > layer_of("runtime.serve.server", rules)[1]
    assert layer_of("models.research.harness", rules)[1] > layer_of("models.train", rules)[1]
    assert layer_of("models.quantize.__main__", rules)[1] == float("inf")


def test_the_architecture_picture_is_drawn_from_these_layers():
    """docs/architecture.svg is what docs/draw_architecture.py draws from the layers and folders now."""
    done = subprocess.run([sys.executable, str(REPO / "docs" / "draw_architecture.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
