"""selftest: the package's golden inputs → expected labels and probabilities on this machine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.engine import Engine
from runtime.package import read_golden
from runtime.protocol import INVALID_JSON
from runtime.service import Service


@dataclass(frozen=True)
class GoldenResult:
    """How one variant did on the golden set."""

    variant: str
    examples: int
    label_matches: int
    max_prob_diff: float
    tolerance: float
    protocol_ok: bool
    problems: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """Every label matches, probabilities within tolerance, protocol round trip fine."""
        return (
            self.examples > 0
            and self.label_matches == self.examples
            and self.max_prob_diff <= self.tolerance
            and self.protocol_ok
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form for `selftest --json`."""
        return {
            "variant": self.variant, "passed": self.passed, "examples": self.examples,
            "label_matches": self.label_matches, "max_prob_diff": self.max_prob_diff,
            "tolerance": self.tolerance, "protocol_ok": self.protocol_ok, "problems": list(self.problems),
        }

    def summary(self) -> str:
        """One human-readable line."""
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"{verdict} {self.variant}: {self.label_matches}/{self.examples} golden labels, "
            f"max |Δp| {self.max_prob_diff:.2e} (tolerance {self.tolerance:.0e}), "
            f"protocol {'ok' if self.protocol_ok else 'BROKEN'}"
        )


def check_golden(engine: Engine) -> GoldenResult:
    """Run the golden set through the engine and the protocol; compare with the FP32 reference."""
    golden = read_golden(engine.package)
    problems: list[str] = []
    if not golden:
        problems.append("the package has no golden set")
    results = engine.classify([g["text"] for g in golden])
    matches, max_diff = 0, 0.0
    for example, result in zip(golden, results):
        if result.label == example["label"]:
            matches += 1
        else:
            problems.append(f"{example['text'][:60]!r}: got {result.label}, expected {example['label']}")
        diff = max(abs(a - b) for a, b in zip(result.probs, example["probs"]))
        max_diff = max(max_diff, diff)
    return GoldenResult(
        variant=engine.variant.name,
        examples=len(golden),
        label_matches=matches,
        max_prob_diff=max_diff,
        tolerance=engine.variant.golden_tolerance,
        protocol_ok=_protocol_round_trip(engine, golden, problems),
        problems=tuple(problems),
    )


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
