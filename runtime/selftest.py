"""selftest: the package's golden inputs → expected labels and probabilities on this machine.

Two comparisons per variant. (1) Its own expected outputs, stored by the factory in
golden.jsonl for exactly the runs made here (each text alone; all texts in one call, batched
and padded as the engine plans it), within `expected_tolerance` (~1e-3: the spread measured
across CPU kernel families). This catches a broken kernel or a corrupted weight scale. (2) The
FP32 reference within `golden_tolerance` (accuracy drift of the variant, a looser bound).
Packages without expected outputs get (2) only.

A variant the host's tier never serves (e.g. int8-u8s8 on AVX2 without VNNI, where its int8
kernels saturate and its outputs move 3.5e-2 from the ones recorded on a VNNI box) is still run
with `--all-variants`, but reported "not for this CPU" and not judged: a box must not fail its
selftest for a variant it would never use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.engine.engine import Engine
from runtime.package.load import read_golden
from runtime.protocol import INVALID_JSON
from runtime.serve.service import Service


@dataclass(frozen=True)
class GoldenResult:
    """How one variant did on the golden set."""

    variant: str
    examples: int
    label_matches: int
    max_prob_diff: float  # vs the FP32 reference
    tolerance: float
    protocol_ok: bool
    problems: tuple[str, ...]
    max_expected_diff: float | None = None  # vs the variant's own expected outputs
    expected_tolerance: float | None = None
    for_this_cpu: bool = True  # False: the host's tier never serves it (reported, not judged)

    @property
    def passed(self) -> bool:
        """Every label matches, probabilities within both tolerances, protocol round trip fine."""
        own_ok = self.expected_tolerance is None or (
            self.max_expected_diff is not None and self.max_expected_diff <= self.expected_tolerance)
        return (
            self.examples > 0
            and self.label_matches == self.examples
            and self.max_prob_diff <= self.tolerance
            and own_ok
            and self.protocol_ok
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form for `selftest --json`."""
        return {
            "variant": self.variant, "passed": self.passed, "examples": self.examples,
            "label_matches": self.label_matches, "max_prob_diff": self.max_prob_diff,
            "tolerance": self.tolerance, "max_expected_diff": self.max_expected_diff,
            "expected_tolerance": self.expected_tolerance, "protocol_ok": self.protocol_ok,
            "for_this_cpu": self.for_this_cpu, "problems": list(self.problems),
        }

    def summary(self) -> str:
        """One human-readable line."""
        verdict = ("PASS" if self.passed else "FAIL") if self.for_this_cpu else "NOT FOR THIS CPU (not judged)"
        own = ""
        if self.expected_tolerance is not None:
            measured = "missing" if self.max_expected_diff is None else f"{self.max_expected_diff:.2e}"
            own = f"own expected outputs max |Δp| {measured} (tolerance {self.expected_tolerance:.0e}), "
        return (
            f"{verdict} {self.variant}: {self.label_matches}/{self.examples} golden labels, {own}"
            f"vs FP32 reference max |Δp| {self.max_prob_diff:.2e} (tolerance {self.tolerance:.0e}), "
            f"protocol {'ok' if self.protocol_ok else 'BROKEN'}"
        )


def run_golden(engine: Engine, for_this_cpu: bool = True) -> GoldenResult:
    """Run the golden set through the engine (each text alone, then all in one call) and the
    protocol; compare with the variant's own expected outputs and with the FP32 reference.
    `for_this_cpu` False marks a variant the host's tier never serves (see the module docstring)."""
    golden = read_golden(engine.package)
    name = engine.variant.name
    problems: list[str] = []
    if not golden:
        problems.append("the package has no golden set")
    texts = [g["text"] for g in golden]
    runs = {"alone": [engine.classify([text])[0] for text in texts], "batched": engine.classify(texts)}
    matches, max_diff = 0, 0.0
    for index, example in enumerate(golden):
        labels = {run: results[index].label for run, results in runs.items()}
        if all(label == example["label"] for label in labels.values()):
            matches += 1
        else:
            problems.append(f"{example['text'][:60]!r}: got {labels}, expected {example['label']}")
        for results in runs.values():
            max_diff = max(max_diff, _max_abs_diff(results[index].probs, example["probs"]))
    max_expected = None
    if engine.variant.expected_tolerance is not None and golden:
        missing = [g["text"][:40] for g in golden if name not in g.get("expected", {})]
        if missing:
            problems.append(f"golden set has no expected outputs of {name} for {len(missing)} texts")
        else:
            max_expected = max(
                _max_abs_diff(results[index].probs, example["expected"][name][run])
                for run, results in runs.items() for index, example in enumerate(golden))
            if max_expected > engine.variant.expected_tolerance:
                problems.append(f"outputs differ from {name}'s own expected outputs by {max_expected:.2e} "
                                f"(tolerance {engine.variant.expected_tolerance:.0e}): broken kernel or model file?")
    return GoldenResult(
        variant=name,
        examples=len(golden),
        label_matches=matches,
        max_prob_diff=max_diff,
        tolerance=engine.variant.golden_tolerance,
        protocol_ok=_protocol_round_trip(engine, golden, problems),
        problems=tuple(problems),
        max_expected_diff=max_expected,
        expected_tolerance=engine.variant.expected_tolerance,
        for_this_cpu=for_this_cpu,
    )


def _max_abs_diff(probs: Sequence[float], expected: Sequence[float]) -> float:
    if len(probs) != len(expected):
        return float("inf")
    return max(abs(a - b) for a, b in zip(probs, expected))


def _protocol_round_trip(engine: Engine, golden: list[dict[str, Any]], problems: list[str]) -> bool:
    """A valid request, a broken line and a health op through the Service, in order."""
    if not golden:
        return False
    service = Service(engine)
    lines = [
        json.dumps({"id": "g0", "text": golden[0]["text"]}).encode("utf-8"),
        b"{not json",
        b'{"id": "h", "op": "health"}',
    ]
    responses = [json.loads(line) for line in service.answer_lines(lines)]
    ok = (
        len(responses) == 3
        and responses[0].get("id") == "g0"
        and responses[0].get("label") == engine.classify([golden[0]["text"]])[0].label
        and responses[1].get("error", {}).get("code") == INVALID_JSON
        and responses[2].get("status") == "ok"
    )
    if not ok:
        problems.append(f"protocol round trip returned {responses!r}")
    return ok
