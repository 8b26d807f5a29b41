"""Ray Data: decide's predictor as a class-based UDF, and `decide score --ray ADDRESS|local`.

    import ray
    from runtime.score.ray_data import DecidePredictor

    ds = ray.data.read_parquet("s3://bucket/alarms/")
    scored = ds.map_batches(DecidePredictor, fn_constructor_kwargs={"package": "/opt/models/machine-alarms"},
                            compute=ray.data.ActorPoolStrategy(size=8), num_cpus=1, batch_size=1024)
    scored.write_parquet("s3://bucket/scored/")

Each actor loads one Classifier (runtime/engine/classifier.py: the same tier/variant choice, abstention
and answers as the protocol and `decide score`) and turns every batch into the rows `decide score`
writes, with error rows for records it cannot classify (runtime/score/windows.py's window_rows). `decide
score --ray` reads CSV/TSV with decide's own reader in Ray's read tasks (`_csv_datasource`), so a
long field, broken quoting or a row of the wrong width gives the answer or error row it gives
without Ray; pyarrow's CSV reader would fail the job on a 5 MB field or a short row. The package
reaches the actors either as a path every node can read, or shipped through Ray's object store
(`ship_package`: the manifest, tokenizer, golden set and one variant's files, written once per node
into a temporary directory). Ray is optional (`pip install 'decide-classifier[ray]'`, ray[data]
RAY_VERSION) and never in the bundle: nothing here imports it at module level.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runtime.package.load import MANIFEST_NAME, load_package
from runtime.platform.offline import TELEMETRY_VARIABLE
from runtime.score.inputs import FORMATS, open_source, require_pyarrow
from runtime.score.long import PIECE_BYTES
from runtime.score.records import (
    InputError,
    Record,
    arrow_texts,
    checked_record,
    csv_records,
    read_csv_header,
)

log = logging.getLogger("decide")

RAY_VERSION = "2.60.0"
BATCH_SIZE = 1024  # rows per actor call, as decide score's windows
READ_ERROR = "_decide_error"  # the column decide's CSV reader adds: why a record cannot be classified


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
    from runtime.package.load import verify_files, verify_golden_file

    package = load_package(package_dir)
    manifest = package.manifest
    if variant not in manifest.variants:
        from runtime.package.load import PackageError

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
        from runtime.engine.classifier import Classifier

        # A shipped package names its variant: every actor answers with the same one.
        variant = variant or (package.get("variant") if isinstance(package, dict) else None)
        self.classifier = Classifier.load(None if package is None else materialize(package), variant=variant,
                                          threads=threads, tier=tier, workers=1, min_score=min_score)
        self.text_column, self.id_column = text_column, id_column
        self.keep = self.classifier.max_text_chars + 1  # a longer text is cut and marked truncated

    def __call__(self, batch: Any) -> Any:
        """Score one batch; records without a usable text become error rows."""
        from runtime.score.outputs import Layout
        from runtime.score.pool import answers_or_errors
        from runtime.score.windows import Window, window_rows

        table = as_table(batch)
        if self.text_column not in table.column_names:
            raise ValueError(f"the dataset has no column {self.text_column!r} (columns: {table.column_names})")
        if self.id_column and self.id_column not in table.column_names:
            raise ValueError(f"the dataset has no column {self.id_column!r} (id_column=None: no ids)")
        texts = arrow_texts(table.column(self.text_column), self.keep)
        ids = table.column(self.id_column).to_pylist() if self.id_column else [None] * len(texts)
        errors = table.column(READ_ERROR).to_pylist() if READ_ERROR in table.column_names else [None] * len(texts)
        records = [Record(0, ids[i], None, errors[i]) if errors[i] else
                   checked_record(0, ids[i], text, self.text_column, self.keep, self.id_column)
                   for i, text in enumerate(texts)]
        rows = window_rows(Window(records, 0),
                           answers_or_errors(self.classifier, [r.text for r in records if r.error is None]))
        id_type = table.schema.field(self.id_column).type if self.id_column else None
        return Layout("parquet", self.id_column or "id", id_type, numbered=not self.id_column).table(rows)


# The actors take every CPU the cluster has: reading and writing tasks ask for none, or they
# would wait forever for a CPU an actor holds (seen on a local 2-CPU instance: the job hung).
_IO = {"num_cpus": 0}


def _read(ray: Any, source: str, fmt: str, text_column: str, id_column: str, keep: int) -> Any:
    """The input through Ray Data's readers: Parquet and JSON lines with Ray's own, CSV/TSV with
    decide's (`_csv_datasource`)."""
    if fmt == "parquet":
        columns = [text_column] + ([id_column] if id_column and id_column != text_column else [])
        return ray.data.read_parquet(source, columns=columns, **_IO)
    if fmt == "jsonl":
        return ray.data.read_json(source, **_IO)  # pyarrow's reader: JSON lines, much faster than lines=True (pandas)
    return ray.data.read_datasource(_csv_datasource(source, fmt, text_column, id_column, keep), **_IO)


def _csv_datasource(paths: str, fmt: str, text_column: str, id_column: str, keep: int) -> Any:
    """A Ray datasource of CSV/TSV files read by runtime/score/inputs.py's csv_records: one read
    task per file, blocks of BATCH_SIZE records with their id, their text (cut to `keep`
    characters) and READ_ERROR, memory bounded whatever a record's size. Built here: Ray is
    imported only when --ray is used."""
    from ray.data.datasource import FileBasedDatasource

    class DecideCsvDatasource(FileBasedDatasource):
        def __init__(self) -> None:
            super().__init__(paths, file_extensions=[fmt])
            self.decide = (fmt, text_column, id_column, keep)

        def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
            return filesystem.open_input_file(path)  # seekable: a broken record is read on from its second line

        def _read_stream(self, f: Any, path: str) -> Any:
            return csv_blocks(io.BufferedReader(f, PIECE_BYTES), path, *self.decide)

    return DecideCsvDatasource()


def csv_blocks(fh: Any, path: str, fmt: str, text_column: str, id_column: str, keep: int) -> Any:
    """pyarrow tables of one CSV/TSV file's records (id, text, READ_ERROR), BATCH_SIZE at a time."""
    import pyarrow as pa

    delimiter = "\t" if fmt == "tsv" else ","
    header, body = read_csv_header(fh, delimiter)
    for name in (text_column, id_column):
        if name not in header:
            raise ValueError(f"{path} has no column {name!r} (columns: {', '.join(header[:20])})")
    fh.seek(body)

    def block(records: list[Record]) -> Any:
        return pa.table({id_column: pa.array([r.id for r in records], pa.string()),
                         text_column: pa.array([r.text for r in records], pa.string()),
                         READ_ERROR: pa.array([r.error for r in records], pa.string())})

    batch: list[Record] = []
    for record, _ in csv_records(fh, delimiter, header, text_column, id_column, keep, 0, body):
        batch.append(record)
        if len(batch) == BATCH_SIZE:
            yield block(batch)
            batch = []
    if batch:
        yield block(batch)


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
    # stays off in them too (runtime/platform/offline.py), with this process's value of the variable.
    env_vars = {TELEMETRY_VARIABLE: os.environ[TELEMETRY_VARIABLE]}
    if address == "local":
        ray.init(num_cpus=cpus, runtime_env={"env_vars": env_vars}, **options)
    else:
        # The runtime package travels with the job, so the workers answer with this decide's code.
        ray.init(address=address, runtime_env={"py_modules": [str(Path(__file__).resolve().parents[1])],
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
    from runtime import exits
    from runtime.engine import startup
    from runtime.engine.text import max_text_chars
    from runtime.score.pool import scoring_cores

    ray = require_ray()
    require_pyarrow()
    fmt, id_column, out_format = _check(args)
    setup = startup.prepare(argparse.Namespace(**{**vars(args), "threads": None, "workers": None}))
    variant = setup.choice.variant
    package_files(setup.package.root, variant)  # a damaged package: exit 4 before Ray starts
    _start(ray, args.ray, scoring_cores())
    threads = args.threads or 1
    actors = args.processes or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads)
    package = str(setup.package.root) if args.ray == "local" else ship_package(setup.package.root, variant)
    log.info("scoring %s → %s on Ray (%s): %d actors × %d thread%s, variant %s", args.input, args.output, args.ray,
             actors, threads, "s" if threads > 1 else "", variant)
    started = time.monotonic()
    keep = max_text_chars(setup.package.manifest.max_length) + 1  # as the actors' Classifier
    scored = _read(ray, args.input, fmt, args.text_column, id_column, keep).map_batches(
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
    return exits.EXIT_OK
