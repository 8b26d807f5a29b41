"""One line of the figures issue 22 asks for, on the validation files (dev/), for each package given:
what settings are chosen on. Runs `python -m models evaluate --json` (the runtime's own engine).

    python -m models.research.dev_summary PACKAGE... [--variant fp32] [--files test]

"Absent" = languages not in the package's manifest `languages` (its training cases' languages).
`--files test` scores the held-out files instead (for the closing figures only, never for choosing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from models.research.harness import TASK

FILES = {"dev": sorted((TASK / "dev").glob("*.csv")),
         "test": [TASK / "test" / name for name in ("cases-a.csv", "cases-b.csv", "noncases.csv", "noise.csv",
                                                   "unreadable.csv", "styles-a.csv", "styles-b.csv")]}


def summary(package: Path, variant: str, files: list[Path]) -> dict:
    out = subprocess.run([sys.executable, "-m", "models", "evaluate", "--model", str(package), "--data",
                          *map(str, files), "--variant", variant, "--json"],
                         capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    manifest = json.loads((package / "manifest.json").read_text(encoding="utf-8"))
    trained = set(manifest.get("languages", []))
    scope = report["variants"][variant]["abstention"]
    by_lang = scope.get("case_by_language", {})
    absent = {k: v for k, v in by_lang.items() if k not in trained}

    def mean(rows: dict) -> float:
        n = sum(v["n"] for v in rows.values())
        return round(sum(v["n"] * v["leaning_accuracy"] for v in rows.values()) / n, 4) if n else None

    case = scope.get("case", {})
    worst = min(by_lang.items(), key=lambda kv: kv[1]["leaning_accuracy"]) if by_lang else None
    return {
        "package": str(package), "variant": variant, "cases": case.get("leaning_accuracy"),
        "trained": mean({k: v for k, v in by_lang.items() if k in trained}), "absent": mean(absent),
        "worst": f"{worst[0]} {worst[1]['leaning_accuracy']:.2f}" if worst else None,
        "cases_flagged": case.get("flagged"), "at_0.9": case.get("at_0.9"),
        **{f"{k}_flagged": scope[k]["flagged"] for k in ("out_of_scope", "resolved", "noise") if k in scope},
        "unreadable_ok": scope.get("unreadable", {}).get("flagged_or_right"),
        "confidently_wrong": scope.get("non_cases", {}).get("confidently_wrong"),
        "absent_by_language": {k: round(v["leaning_accuracy"], 2) for k, v in absent.items()},
        "cases_flagged_by_style": {k: v["cases_flagged"] for k, v in scope.get("by_style", {}).items()},
        "worst_language": min(((k, v["leaning_accuracy"]) for k, v in by_lang.items() if v["n"] >= 15),
                              key=lambda kv: kv[1], default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--files", choices=sorted(FILES), default="dev")
    args = parser.parse_args()
    for package in args.packages:
        print(json.dumps(summary(package, args.variant, FILES[args.files]), ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
