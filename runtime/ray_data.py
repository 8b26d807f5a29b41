"""Ray Data: decide's predictor as a class-based UDF, and `decide score --ray ADDRESS|local`.

    import ray
    from runtime.ray_data import DecidePredictor

    ds = ray.data.read_parquet("s3://bucket/alarms/")
    scored = ds.map_batches(DecidePredictor, fn_constructor_kwargs={"package": "/opt/models/machine-alarms"},
                            compute=ray.data.ActorPoolStrategy(size=8), num_cpus=1, batch_size=1024)
    scored.write_parquet("s3://bucket/scored/")

Each actor loads one Classifier (runtime/classifier.py: the same tier/variant choice, abstention
and answers as the protocol and `decide score`) and turns every batch into the rows `decide score`
writes, with error rows for records it cannot classify (runtime/score.py's window_rows). The package
reaches the actors either as a path every node can read, or shipped through Ray's object store
(`ship_package`: the manifest, tokenizer, golden set and one variant's files, written once per node
into a temporary directory). Ray is optional (`pip install 'decide-classifier[ray]'`, ray[data]
RAY_VERSION) and never in the bundle: nothing here imports it at module level.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime.offline import TELEMETRY_VARIABLE
from runtime.package import MANIFEST_NAME, load_package
from runtime.score_input import FORMATS, InputError, open_source, require_pyarrow

log = logging.getLogger("decide")

RAY_VERSION = "2.60.0"
BATCH_SIZE = 1024  # rows per actor call, as decide score's windows


def require_ray() -> Any:
    """The ray module, or InputError saying how to get it."""
    try:
        import ray
        import ray.data  # the data extra (pyarrow, pandas) must be there too
    except ImportError:
        if getattr(sys, "frozen", False):
            raise InputError("--ray is not available in the decide binary: install decide from source with "
                             f"pip install 'decide-classifier[ray]' (ray[data]=={RAY_VERSION})") from None
        raise InputError(f"--ray needs Ray Data: pip install 'decide-classifier[ray]' (ray[data]=={RAY_VERSION})") from None
    return ray


def package_files(package_dir: Path | str, variant: str) -> dict[str, bytes]:
    """The files one variant of a package needs, verified (PackageError otherwise), by relative name."""
    from runtime.package import verify_files, verify_golden_file

    package = load_package(package_dir)
    manifest = package.manifest
    if variant not in manifest.variants:
        from runtime.package import PackageError

        raise PackageError(f"variant {variant!r} not in package {manifest.name}")
    entries = [manifest.tokenizer, *manifest.variants[variant].files()] + ([manifest.golden] if manifest.golden else [])
    verify_files(package, entries)
    verify_golden_file(package)
    files = {entry.file: package.path(entry).read_bytes() for entry in entries}
    files[MANIFEST_NAME] = (package.root / MANIFEST_NAME).read_bytes()
    return files


def ship_package(package_dir: Path | str, variant: str) -> dict[str, Any]:
    """Put one variant of a package into Ray's object store: pass the result as DecidePredictor's
    `package` when the worker nodes cannot read the package directory."""
    ray = require_ray()
    files = package_files(package_dir, variant)
    digest = hashlib.sha256(files[MANIFEST_NAME] + variant.encode()).hexdigest()[:16]
    return {"decide_package": digest, "variant": variant, "files": ray.put(files)}


def materialize(package: Any) -> Path:
    """A package directory on this node: `package` itself (a path), or a shipped package written
    once into the temporary directory (atomically: concurrent actors of one node share it)."""
    if not isinstance(package, dict):
        return Path(package)
    import ray

    target = Path(tempfile.gettempdir()) / "decide-packages" / package["decide_package"]
    if (target / MANIFEST_NAME).is_file():
        return target
    files = ray.get(package["files"])
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    for name, data in files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    try:
        os.rename(staging, target)
    except OSError:  # another actor of this node was first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def as_table(batch: Any) -> Any:
    """A batch in any of Ray Data's formats (pyarrow Table, pandas DataFrame, dict of numpy arrays)
    as a pyarrow Table, so that ids keep their type and a missing value is a null."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    if hasattr(batch, "iloc"):  # pandas: NaN in an object column becomes null
        return pa.Table.from_pandas(batch, preserve_index=False)
    return pa.table({name: pa.array(values) for name, values in batch.items()})


class DecidePredictor:
    """Ray Data callable class: batches of records in, a pyarrow Table of decide score's rows out
    (id, label, leaning, score, abstained, reason, truncated, error)."""

    def __init__(self, package: Any = None, variant: str | None = None, tier: str | None = None,
                 threads: int = 1, min_score: float | None = None, text_column: str = "text",
                 id_column: str | None = "id"):
        from runtime.classifier import Classifier

        # A shipped package names its variant: every actor answers with the same one.
        variant = variant or (package.get("variant") if isinstance(package, dict) else None)
        self.classifier = Classifier.load(None if package is None else materialize(package), variant=variant,
                                          threads=threads, tier=tier, workers=1, min_score=min_score)
        self.text_column, self.id_column = text_column, id_column

    def __call__(self, batch: Any) -> Any:
        """Score one batch; records without a usable text become error rows."""
        from runtime.score import Window, window_rows
        from runtime.score_input import checked_record
        from runtime.score_output import Layout
        from runtime.score_pool import answers_or_errors

        table = as_table(batch)
        if self.text_column not in table.column_names:
            raise ValueError(f"the dataset has no column {self.text_column!r} (columns: {table.column_names})")
        if self.id_column and self.id_column not in table.column_names:
            raise ValueError(f"the dataset has no column {self.id_column!r} (id_column=None: no ids)")
        texts = table.column(self.text_column).to_pylist()
        ids = table.column(self.id_column).to_pylist() if self.id_column else [None] * len(texts)
        records = [checked_record(0, ids[i], text, self.text_column) for i, text in enumerate(texts)]
        rows = window_rows(Window(records, 0),
                           answers_or_errors(self.classifier, [r.text for r in records if r.error is None]))
        id_type = table.schema.field(self.id_column).type if self.id_column else None
        return Layout("parquet", self.id_column or "id", id_type, numbered=not self.id_column).table(rows)


# The actors take every CPU the cluster has: reading and writing tasks ask for none, or they
# would wait forever for a CPU an actor holds (seen on a local 2-CPU instance: the job hung).
_IO = {"num_cpus": 0}


def _read(ray: Any, source: str, fmt: str, text_column: str, id_column: str | None) -> Any:
    """The input through Ray Data's own readers (CSV columns as text, like decide score reads them)."""
    if fmt == "parquet":
        columns = [text_column] + ([id_column] if id_column and id_column != text_column else [])
        return ray.data.read_parquet(source, columns=columns, **_IO)
    if fmt == "jsonl":
        return ray.data.read_json(source, **_IO)  # pyarrow's reader: JSON lines, much faster than lines=True (pandas)
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = {name: pa.string() for name in (text_column, id_column) if name}
    return ray.data.read_csv(source, parse_options=pacsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ","),
                             convert_options=pacsv.ConvertOptions(column_types=types), **_IO)


def _write(scored: Any, target: str, fmt: str) -> None:
    writer = {"parquet": scored.write_parquet, "jsonl": scored.write_json}.get(fmt, scored.write_csv)
    writer(target, ray_remote_args=_IO)


def _input_format(source: str) -> str:
    """The format of a file, a directory of files (by their extension) or a URI."""
    path = Path(source)
    if "://" not in source and path.is_dir():
        suffixes = {p.suffix.lower() for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_"))}
        known = {FORMATS[s] for s in suffixes if s in FORMATS}
        if len(known) != 1:
            raise InputError(f"INPUT {source}: a directory for --ray must hold files of one format "
                             f"({', '.join(sorted(FORMATS))}); found {', '.join(sorted(suffixes)) or 'none'}")
        return known.pop()
    fmt = FORMATS.get(Path(source.split("://", 1)[-1]).suffix.lower())
    if fmt is None:
        raise InputError(f"INPUT {source}: unknown extension; use one of {', '.join(sorted(FORMATS))}")
    return fmt


def _start(ray: Any, address: str, cpus: int) -> None:
    """ray.init for a local instance (`local`) or an existing cluster, quiet on stderr."""
    logging.getLogger("ray").setLevel(logging.WARNING)
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
    # A cluster's workers do not inherit this process's environment: onnxruntime's telemetry
    # stays off in them too (runtime/offline.py), with this process's value of the variable.
    env_vars = {TELEMETRY_VARIABLE: os.environ[TELEMETRY_VARIABLE]}
    if address == "local":
        ray.init(num_cpus=cpus, runtime_env={"env_vars": env_vars}, **options)
    else:
        # The runtime package travels with the job, so the workers answer with this decide's code.
        ray.init(address=address, runtime_env={"py_modules": [str(Path(__file__).resolve().parent)],
                                               "env_vars": env_vars}, **options)
    ray.data.DataContext.get_current().enable_progress_bars = sys.stderr.isatty()


def _output_exists(output: str) -> bool:
    """Whether OUTPUT (a local path or a URI Ray can write to) exists."""
    if "://" not in output:
        return Path(output).exists()
    import pyarrow.fs as pafs

    try:
        filesystem, path = pafs.FileSystem.from_uri(output)
        return filesystem.get_file_info(path).type != pafs.FileType.NotFound
    except Exception as exc:  # pyarrow's own errors: unknown scheme, no credentials, …
        raise InputError(f"OUTPUT {output}: {exc}") from exc


def _remove(output: str) -> None:
    if "://" in output:
        import pyarrow.fs as pafs

        filesystem, path = pafs.FileSystem.from_uri(output)
        filesystem.delete_dir(path)
    elif Path(output).is_dir():
        shutil.rmtree(output)
    else:
        Path(output).unlink()


def _check(args: argparse.Namespace) -> tuple[str, str | None, str]:
    """Input format, id column and output format, refusing what decide score refuses."""
    if args.resume:
        raise InputError("--resume is not available with --ray: Ray Data writes the whole dataset again "
                         "(use --overwrite, or run without --ray to get resumable parts)")
    fmt = _input_format(args.input)
    id_column = args.id_column or "id"
    if "://" not in args.input and Path(args.input).is_file():  # the local checks decide score makes
        id_column = open_source(Path(args.input), args.text_column, args.id_column).id_column
        if id_column is None:
            raise InputError(f"INPUT {args.input} has no id column: with --ray the rows come back in no "
                             "particular order, so name the column that identifies them with --id-column")
    elif "://" not in args.input and not Path(args.input).exists():
        raise InputError(f"cannot read INPUT {args.input}: No such file or directory")
    out_format = FORMATS.get(Path(args.output.split("://", 1)[-1]).suffix.lower())
    if out_format is None:
        raise InputError(f"OUTPUT {args.output}: unknown extension; use one of {', '.join(sorted(FORMATS))}")
    if _output_exists(args.output) and not args.overwrite:
        raise InputError(f"OUTPUT {args.output} exists; use --overwrite to replace it")
    return fmt, id_column, out_format


def ray_failure(exc: BaseException) -> str:
    """The line that says what went wrong in a Ray exception (they carry remote tracebacks)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = next((line for line in reversed(lines) if not line.startswith(("File ", "^", "~"))), type(exc).__name__)
    return reason[:300]


def run(args: argparse.Namespace) -> int:
    """`decide score --ray ADDRESS|local`: read, map_batches(DecidePredictor), write. OUTPUT is a
    directory of Ray Data's files; a local one is written beside it and moved into place only when
    complete (a URI is written in place: object stores have no rename)."""
    from runtime import cli
    from runtime.score_pool import scoring_cores

    ray = require_ray()
    require_pyarrow()
    fmt, id_column, out_format = _check(args)
    setup = cli.prepare(argparse.Namespace(**{**vars(args), "threads": None, "workers": None}))
    variant = setup.choice.variant
    package_files(setup.package.root, variant)  # a damaged package: exit 4 before Ray starts
    _start(ray, args.ray, scoring_cores())
    threads = args.threads or 1
    actors = args.processes or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    package = str(setup.package.root) if args.ray == "local" else ship_package(setup.package.root, variant)
    log.info("scoring %s → %s on Ray (%s): %d actors × %d thread%s, variant %s", args.input, args.output, args.ray,
             actors, threads, "s" if threads > 1 else "", variant)
    started = time.monotonic()
    scored = _read(ray, args.input, fmt, args.text_column, id_column).map_batches(
        DecidePredictor, batch_size=BATCH_SIZE, batch_format="pyarrow", num_cpus=threads,
        compute=ray.data.ActorPoolStrategy(size=actors),
        fn_constructor_kwargs={"package": package, "variant": variant, "tier": setup.choice.tier.name,
                               "threads": threads, "min_score": args.min_score, "text_column": args.text_column,
                               "id_column": id_column})
    local = "://" not in args.output
    target = (str(Path(args.output).with_name(f".{Path(args.output).name}.ray-{os.getpid()}")) if local
              else args.output)
    try:
        if not local and _output_exists(args.output):
            _remove(args.output)  # --overwrite (checked above)
        try:
            _write(scored, target, out_format)
        except Exception as exc:  # Ray's own errors, e.g. a line pyarrow's JSON reader cannot parse
            raise InputError(f"Ray Data could not finish the job: {ray_failure(exc)}") from exc
        if local:
            if Path(args.output).exists():
                _remove(args.output)
            os.replace(target, args.output)
    finally:
        if local:
            shutil.rmtree(target, ignore_errors=True)
        ray.shutdown()
    log.info("scored %s on Ray in %.1f s → %s", args.input, time.monotonic() - started, args.output)
    return cli.EXIT_OK
