"""How well a package's tokenizer reads each script (issue 22, "every script readable"), printed:
per Unicode script of the task's held-out and validation texts, the share of characters that fall
into `<unk>` and the pieces per word, for e5's own 250k-piece tokenizer and for each package given
(a directory, or `REV:PATH` for a package's tokenizer.json at a git revision: the "before").

    python3 -m benchmarks.script_coverage models/packages/machine-alarms \\
        feb19d6^:models/packages/machine-alarms feb19d6:models/packages/machine-alarms

A character's script is the first word of its Unicode name (LATIN, CYRILLIC, THAI, CJK, …); a text
counts for the script most of its letters are in. Tokenizer-only: nothing is run through a model.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

from models.assets import e5_tokenizer_file

REPO = Path(__file__).resolve().parent.parent

TASK = REPO / "models" / "tasks" / "machine-alarms"
FILES = [*sorted((TASK / "test").glob("*.csv")), *sorted((TASK / "dev").glob("*.csv"))]


def script_of(text: str) -> str | None:
    """The script most of the text's letters are in (None: no letters)."""
    counts = Counter(unicodedata.name(ch, "UNKNOWN ?").split()[0] for ch in text if ch.isalpha())
    return counts.most_common(1)[0][0] if counts else None


def texts_by_script() -> dict[str, list[str]]:
    seen: set[str] = set()
    out: dict[str, list[str]] = defaultdict(list)
    for path in FILES:
        with open(path, encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                text = " ".join(row["text"].split())
                script = script_of(text)
                if script and text not in seen:
                    seen.add(text)
                    out[script].append(text)
    return out


def load_tokenizer(spec: str):
    from tokenizers import Tokenizer

    if ":" in spec and not Path(spec).exists():  # REV:PACKAGE_DIR
        rev, path = spec.split(":", 1)
        blob = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}/tokenizer.json"],
                              capture_output=True, check=True).stdout.decode("utf-8")
        return Tokenizer.from_str(blob)
    path = Path(spec)
    return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))


def coverage(tokenizer, texts: list[str]) -> tuple[float, float]:
    """(% of characters inside <unk> pieces, pieces per whitespace word)."""
    unk = tokenizer.token_to_id("<unk>")
    unknown = chars = pieces = words = 0
    for text in texts:
        enc = tokenizer.encode(text, add_special_tokens=False)
        chars += len(text.replace(" ", ""))
        words += len(text.split())
        pieces += len(enc.ids)
        unknown += sum(end - start for i, (start, end) in zip(enc.ids, enc.offsets) if i == unk)
    return 100.0 * unknown / max(chars, 1), pieces / max(words, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="+", help="package directory or REV:PACKAGE_DIR")
    args = parser.parse_args()
    by_script = texts_by_script()
    columns = [("e5 (250k)", load_tokenizer(str(e5_tokenizer_file())))]
    for spec in args.packages:
        tokenizer = load_tokenizer(spec)
        columns.append((f"{spec} ({tokenizer.get_vocab_size():,})", tokenizer))
    print("% of characters read as <unk> / pieces per word, per script of the task's test + dev texts\n")
    print("| script | texts | " + " | ".join(name for name, _ in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for script, texts in sorted(by_script.items(), key=lambda kv: -len(kv[1])):
        cells = [f"{u:.1f} / {p:.2f}" for u, p in (coverage(tok, texts) for _, tok in columns)]
        print(f"| {script} | {len(texts)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
