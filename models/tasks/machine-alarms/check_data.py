"""Check the task's files: labels and kinds valid, no held-out text in a training file, near-copies.

    python models/tasks/machine-alarms/check_data.py          # prints counts; exit 1 on a problem

A held-out text (test/, dev/) must not occur in any training file (case-insensitive, spaces
collapsed): an exact copy is a failure. Near-copies — a training row whose word set overlaps a
held-out text's by more than 60 % (Jaccard, texts of 4+ words) — are listed and counted: the
writers worked independently, but alarm lines of a narrow domain recur in similar words.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABELS = {"overheating", "leak", "vibration_noise", "electrical_fault", "sensor_fault", "communication_loss",
          "safety_stop", "material_jam"}
NEGATIVE = "other"
KINDS = {"case", "resolved", "out_of_scope", "noise", "unreadable"}
NEAR = 0.6


def rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def norm(text: str) -> str:
    return " ".join(text.casefold().split())


def words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.casefold()))


def check_file(path: Path, held_out: bool) -> list[str]:
    """Problems with one file's labels and kinds."""
    problems = []
    for number, row in enumerate(rows(path), 2):
        kind = row.get("kind") or ("case" if row["label"] in LABELS else "out_of_scope")
        if kind not in KINDS:
            problems.append(f"{path.name}:{number}: kind {kind!r}")
        elif kind in ("case", "unreadable") and row["label"] not in LABELS:
            problems.append(f"{path.name}:{number}: a {kind} needs one of the 8 labels, not {row['label']!r}")
        elif kind not in ("case", "unreadable") and row["label"] not in ("", NEGATIVE):
            problems.append(f"{path.name}:{number}: a {kind} row has label {row['label']!r}")
        if not held_out and kind == "case" and row["label"] == NEGATIVE:
            problems.append(f"{path.name}:{number}: label other with kind case")
    return problems


def main() -> int:
    train = sorted((HERE / "train").glob("*.csv"))
    held = sorted((HERE / "test").glob("*.csv")) + sorted((HERE / "dev").glob("*.csv"))
    problems = [p for f in train for p in check_file(f, False)] + [p for f in held for p in check_file(f, True)]
    seen = defaultdict(list)
    index = defaultdict(set)  # word -> training row ids, for the near-copy search
    train_rows = []
    for path in train:
        for row in rows(path):
            seen[norm(row["text"])].append(path.name)
            train_rows.append((path.name, row["text"], words(row["text"])))
            for word in train_rows[-1][2]:
                index[word].add(len(train_rows) - 1)
    near = 0
    for path in held:
        for row in rows(path):
            if norm(row["text"]) in seen:
                problems.append(f"{path.parent.name}/{path.name}: {row['text'][:60]!r} is in {seen[norm(row['text'])]}")
            mine = words(row["text"])
            if len(mine) < 4:
                continue
            candidates = Counter(i for word in mine for i in index[word])
            for i, shared in candidates.items():
                other = train_rows[i][2]
                if len(other) >= 4 and shared / len(mine | other) > NEAR:
                    near += 1
                    print(f"near copy ({shared} of {len(mine | other)} words): "
                          f"{path.parent.name}/{path.name} {row['text'][:50]!r} ~ {train_rows[i][0]} {train_rows[i][1][:50]!r}")
    for path in train + held:
        data = rows(path)
        kinds = Counter(r.get("kind") or "-" for r in data)
        print(f"{path.parent.name}/{path.name}: {len(data)} rows, {len({r['lang'] for r in data})} languages, "
              f"kinds {dict(kinds)}")
    print(f"{near} near copies")
    for problem in problems:
        print("PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
