"""What a bundle zip holds, by size: the largest files and the totals per part (issue 34, item 4).

    python3 -m benchmarks.zip_contents ZIP [ZIP ...] [--top 25]

Prints markdown: per zip, its size, the parts (the model, onnxruntime, numpy and its libraries,
tokenizers, CPython, the rest) stored and unpacked, then the `--top` largest files. The zips are
what `python3 build.py [--arch aarch64]` writes (or the build cache's copy the heavy tests use).
"""

from __future__ import annotations

import argparse
import zipfile
from collections import defaultdict
from pathlib import Path

# The first matching fragment of a member's path names its part.
PARTS = (("the model", "/models/"), ("onnxruntime", "onnxruntime"), ("numpy and its libraries", "numpy"),
         ("tokenizers", "tokenizers"), ("C++ runtime", "libstdc++"), ("CPython", "libpython"),
         ("CPython", "python3"), ("CPython", "lib-dynload"), ("CPython", "base_library.zip"))


def part_of(name: str) -> str:
    return next((part for part, fragment in PARTS if fragment in name), "the rest")


def report(path: Path, top: int) -> str:
    with zipfile.ZipFile(path) as archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
    stored, unpacked = defaultdict(int), defaultdict(int)
    for member in members:
        stored[part_of(member.filename)] += member.compress_size
        unpacked[part_of(member.filename)] += member.file_size
    mb = 1e6
    lines = [f"## {path.name}: {path.stat().st_size / mb:.1f} MB, {len(members)} files", "",
             "| part | zipped MB | unpacked MB |", "|---|---|---|"]
    for part in sorted(stored, key=stored.get, reverse=True):
        lines.append(f"| {part} | {stored[part] / mb:.1f} | {unpacked[part] / mb:.1f} |")
    lines += ["", f"The {top} largest files (zipped MB / unpacked MB):", "", "| file | zipped | unpacked |",
              "|---|---|---|"]
    for member in sorted(members, key=lambda m: m.compress_size, reverse=True)[:top]:
        lines.append(f"| `{member.filename}` | {member.compress_size / mb:.2f} | {member.file_size / mb:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("zips", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print("\n".join(report(path, args.top) for path in args.zips))


if __name__ == "__main__":
    main()
