"""`python -m models.quantize PACKAGE_DIR`: re-quantize a package's int8 variants (models/requantize.py).

An entry point on top of the factory, like models/__main__.py, with the same exit codes (models/exits.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from models.exits import guarded
from models.quantize.int8 import DEFAULT_INT8, VARIANTS_BY_NAME
from models.requantize import requantize_package


def main(argv: Sequence[str] | None = None) -> int:
    """`python3 -m models.quantize PACKAGE_DIR [--recipe NAME] [--version V]`: re-quantize a package's
    int8 variants from its FP32 graph (calibration: the training split of the recipe's data; gate:
    validation + test). The recipe defaults to the one the package was trained with, else the one
    named like it, else the embedded default's (models/recipes/machine-alarms.json)."""
    parser = argparse.ArgumentParser(prog="python3 -m models.quantize", description=main.__doc__)
    parser.add_argument("package", type=Path)
    parser.add_argument("--recipe", help="recipe whose data calibrates and gates (models/recipes/NAME.json)")
    parser.add_argument("--version")
    parser.add_argument("--variants", nargs="*", default=list(DEFAULT_INT8), choices=list(VARIANTS_BY_NAME))
    args = parser.parse_args(argv)

    def run() -> int:
        manifest = requantize_package(args.package, args.recipe, version=args.version, names=args.variants)
        print(json.dumps({"variants": list(manifest.variants),
                          "rejected": manifest.provenance.get("rejected_variants", {})}, indent=2))
        return 0

    return guarded(run)


if __name__ == "__main__":
    raise SystemExit(main())
