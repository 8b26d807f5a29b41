"""What `models evaluate` reports about abstention: flag rates per kind of text (issue 22).

An evaluation file may say what kind each text is (column `kind`):

  case          a real case: its `label` is the right answer
  unreadable    a real case in a script or form the model cannot read: right if flagged or answered right
  out_of_scope  not a case (chit-chat, office, IT, routine status…): right if flagged
  resolved      not a case although it uses fault words (a resolved, normal, planned or test state)
  noise         not a message at all (hex, base64, logs, URLs, emoji, mashing…)

Pure functions over the runtime's own decisions (runtime.package.abstain.Decision), so the figures are
those of what ships. Stdlib only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from runtime.package.abstain import Decision

CASE = "case"
UNREADABLE = "unreadable"
NON_CASES = ("out_of_scope", "resolved", "noise")
KINDS = (CASE, UNREADABLE, *NON_CASES)
CONFIDENT = 0.9  # "confidently wrong": a non-case answered with at least this score


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def scope_report(kinds: Sequence[str], truths: Sequence[str | None], decisions: Sequence[Decision]) -> dict:
    """Per kind: how many texts, how many flagged (abstained) and why; for cases the leaning
    accuracy, right-and-answered, wrongly flagged and the score ≥ 0.9 coverage/accuracy; for
    unreadable texts flagged-or-right; for non-cases flagged and confidently wrong."""
    report: dict[str, dict] = {}
    for kind in KINDS:
        rows = [(truth, d) for k, truth, d in zip(kinds, truths, decisions) if k == kind]
        if not rows:
            continue
        flagged = sum(d.abstained for _, d in rows)
        entry: dict = {"texts": len(rows), "flagged": _share(flagged, len(rows)),
                       "reasons": dict(Counter(d.reason for _, d in rows if d.abstained))}
        if kind in (CASE, UNREADABLE):
            right = [d.leaning == truth for truth, d in rows]
            entry["leaning_accuracy"] = _share(sum(right), len(rows))
            entry["answered_right"] = _share(sum(r and not d.abstained for r, (_, d) in zip(right, rows)), len(rows))
            if kind == UNREADABLE:
                entry["flagged_or_right"] = _share(sum(r or d.abstained for r, (_, d) in zip(right, rows)), len(rows))
            else:
                confident = [(r, d) for r, (_, d) in zip(right, rows) if not d.abstained and d.score >= CONFIDENT]
                entry["at_0.9"] = {"coverage": _share(len(confident), len(rows)),
                                   "accuracy": _share(sum(r for r, _ in confident), len(confident))}
        else:
            entry["confidently_wrong"] = _share(sum(not d.abstained and d.score >= CONFIDENT for _, d in rows), len(rows))
        report[kind] = entry
    non_cases = [d for k, d in zip(kinds, decisions) if k in NON_CASES]
    if non_cases:
        report["non_cases"] = {
            "texts": len(non_cases), "flagged": _share(sum(d.abstained for d in non_cases), len(non_cases)),
            "confidently_wrong": _share(sum(not d.abstained and d.score >= CONFIDENT for d in non_cases),
                                        len(non_cases))}
    return report


def style_report(kinds: Sequence[str], styles: Sequence[str], truths: Sequence[str | None],
                 decisions: Sequence[Decision]) -> dict:
    """Per writing style (the evaluation file's `style` column): cases — how many, flagged,
    leaning right — and non-cases — how many, flagged. Texts without a style are left out."""
    report: dict[str, dict] = {}
    for style in sorted({s for s in styles if s}):
        rows = [(k, t, d) for k, s, t, d in zip(kinds, styles, truths, decisions) if s == style]
        cases = [(t, d) for k, t, d in rows if k == CASE]
        others = [d for k, _, d in rows if k in NON_CASES]
        report[style] = {"cases": len(cases), "cases_flagged": _share(sum(d.abstained for _, d in cases), len(cases)),
                         "cases_leaning_right": _share(sum(d.leaning == t for t, d in cases), len(cases)),
                         "non_cases": len(others), "non_cases_flagged": _share(sum(d.abstained for d in others),
                                                                               len(others))}
    return report


def format_styles(report: dict) -> str:
    """The per-style report as a Markdown table."""
    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.1f}"
    lines = ["| style | cases | cases flagged | leaning right | non-cases | non-cases flagged |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {style} | {e['cases']} | {pct(e['cases_flagged'])} | {pct(e['cases_leaning_right'])} | "
              f"{e['non_cases']} | {pct(e['non_cases_flagged'])} |" for style, e in report.items()]
    return "\n".join(lines) + "\n"


def format_scope(report: dict) -> str:
    """The report as a Markdown table."""
    lines = ["| kind | texts | flagged | reasons | leaning right | answered right | other |", "|---|---|---|---|---|---|---|"]
    for kind, entry in report.items():
        def pct(value: float | None) -> str:
            return "–" if value is None else f"{100 * value:.1f}"
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(entry.get("reasons", {}).items())) or "–"
        other = []
        if "at_0.9" in entry:
            other.append(f"score ≥ 0.9: {pct(entry['at_0.9']['coverage'])} % answered, {pct(entry['at_0.9']['accuracy'])} % right")
        if "flagged_or_right" in entry:
            other.append(f"flagged or right {pct(entry['flagged_or_right'])} %")
        if "confidently_wrong" in entry:
            other.append(f"confidently wrong {pct(entry['confidently_wrong'])} %")
        lines.append(f"| {kind} | {entry['texts']} | {pct(entry['flagged'])} | {reasons} | "
                     f"{pct(entry.get('leaning_accuracy'))} | {pct(entry.get('answered_right'))} | {'; '.join(other) or '–'} |")
    return "\n".join(lines) + "\n"
