"""`decide score INPUT --output OUTPUT`: classify a file of records into a file of answers.

    decide score alarms.csv --output scored.parquet [--text-column text] [--id-column id]
                 [--model DIR] [--variant V] [--resume | --overwrite] [--ray ADDRESS|local] [--min-score X]

Stages: check the arguments and the whole input (runtime/score/inputs.py) → choose tier and variant
and load the model (runtime/engine/classifier.py; workers from runtime/score/pool.py) → only then create
OUTPUT.parts/ (runtime/score/outputs.py) → a reader thread cuts the records into windows → each
window is one classify call → rows in input order → part files, each atomic → OUTPUT in one rename.

Every whole-run problem is one stderr line and an exit code before anything is written (2 bad
arguments or input, 3 CPU, 4 package); a bad record is an error row. Memory is bounded by the
windows in flight and one part (`IN_FLIGHT_PER_WORKER`, `PART_RECORDS`), whatever the input's
size. A run stopped in any way (Ctrl-C, SIGTERM, SIGKILL, power loss) continues with --resume.
`--ray` hands the same job to Ray Data (runtime/score/ray_data.py). docs/scoring.md has the details.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime import exits
from runtime.engine import startup
from runtime.engine.classifier import Classifier, check_min_score
from runtime.score.inputs import Source, fingerprint, input_format, open_source, require_pyarrow
from runtime.score.outputs import JOB_FORMAT, Layout, Part, WorkDir
from runtime.score.pool import (
    PROCESS_CORES,
    LocalPool,
    ProcessPool,
    WorkerFailed,
    plan,
    scoring_cores,
)
from runtime.score.progress import Progress, duration
from runtime.score.records import InputError
from runtime.score.windows import Window, WindowReader, window_rows

log = logging.getLogger("decide")

IN_FLIGHT_PER_WORKER = 2  # windows submitted ahead per worker, so none waits for the reader
PART_RECORDS = 50_000  # a part is written after this many records…
PART_SECONDS = 60.0  # …or this long: what a killed run can lose and redo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`decide score`'s own options (the shared ones come from runtime/cli.py)."""
    # Strings, not Path: with --ray they may be URIs (s3://…), which Path would fold to s3:/….
    parser.add_argument("input", metavar="INPUT", help="records to score: .csv, .tsv, .jsonl "
                        "(.ndjson, .json: JSON lines) or .parquet (needs pyarrow)")
    parser.add_argument("--output", required=True, metavar="OUTPUT",
                        help="answers, by extension: .jsonl, .csv, .tsv or .parquet; written at the end in one step")
    parser.add_argument("--text-column", default="text", help="column (or JSON field) with the text (default: text)")
    parser.add_argument("--id-column", default=None, help="column copied to every answer row (default: id if "
                        "the input has one, else the record number)")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the unfinished job for OUTPUT "
                       "(same arguments), or start it when there is none")
    again.add_argument("--overwrite", action="store_true", help="start again: drop an unfinished job, "
                       "replace OUTPUT at the end")
    parser.add_argument("--ray", metavar="ADDRESS|local", default=None,
                        help="run on Ray Data: a cluster address (ray://host:10001, or auto) or local "
                        "(starts a local instance); OUTPUT is then a directory of files")
    parser.add_argument("--min-score", type=float, default=None, metavar="X",
                        help="abstain (reason low_score) below this calibrated score")
    parser.add_argument("--processes", type=int, default=None,
                        help=f"worker processes, each with its own copy of the model (default: one per "
                        f"{PROCESS_CORES} usable cores; with --ray: the number of actors)")
    parser.add_argument("--part-records", type=int, default=PART_RECORDS, help=argparse.SUPPRESS)
    # The shared --threads/--workers mean something else in bulk (see runtime/score/pool.py).
    shared = parser._option_string_actions
    shared["--threads"].help = "ORT intra-op threads per window (default 1)"
    shared["--workers"].help = "windows classified at once per process (default: the process's cores)"


@dataclass
class Tally:
    """What a run did, for the summary line."""

    records: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    abstained: Counter[str] = field(default_factory=Counter)

    def count(self, rows: list[tuple]) -> None:
        """Count a window's rows."""
        self.records += len(rows)
        for row in rows:
            if row[7] is not None:
                self.errors[row[7].partition(":")[0]] += 1
            elif row[4]:
                self.abstained[row[5]] += 1


def score_stream(reader: WindowReader, pool: LocalPool | ProcessPool, work: WorkDir, layout: Layout,
                 progress: Progress, in_flight: int, part_records: int, first: int) -> Tally:
    """Windows → pool → rows in order → part files; returns the tally of this run."""
    tally = Tally()
    pending: deque[tuple[Window, Any]] = deque()
    rows: list[tuple] = []
    part_started = time.monotonic()
    offset = 0
    while True:
        while len(pending) < in_flight and (window := reader.next()) is not None:
            pending.append((window, pool.submit([r.text for r in window.records if r.error is None])))
        if not pending:
            break
        window, future = pending.popleft()
        window_result = window_rows(window, future.result())
        rows.extend(window_result)
        tally.count(window_result)
        offset = window.offset
        if len(rows) >= part_records or time.monotonic() - part_started >= PART_SECONDS:
            work.write_part(layout, first, first + len(rows) - 1, offset, rows)
            first, rows, part_started = first + len(rows), [], time.monotonic()
        progress.update(len(window_result), offset)
    if rows:
        work.write_part(layout, first, first + len(rows) - 1, offset, rows)
    return tally


def _check_paths(args: argparse.Namespace) -> tuple[str, WorkDir]:
    """Output format, and the job's state: refuse what would write over something."""
    out_format = input_format(args.output, "OUTPUT")
    if out_format == "parquet":
        require_pyarrow()
    if args.input.exists() and args.output.exists() and args.input.resolve() == args.output.resolve():
        raise InputError(f"OUTPUT {args.output} is the INPUT file")
    parent = args.output.resolve().parent
    if not parent.is_dir():
        raise InputError(f"cannot write OUTPUT {args.output}: directory {parent} does not exist")
    work = WorkDir(args.output)
    if args.resume and not work.exists() and args.output.exists():
        raise InputError(f"nothing to resume: OUTPUT {args.output} exists and has no unfinished job "
                         f"({work.path} is missing); use --overwrite to score again")
    if not (args.resume or args.overwrite):
        if args.output.exists():
            raise InputError(f"OUTPUT {args.output} exists; use --overwrite to replace it "
                             "(or --resume to continue an unfinished job for it)")
        if work.exists():
            raise InputError(f"an unfinished job for {args.output} is in {work.path}: use --resume to "
                             "continue it or --overwrite to start again")
    return out_format, work


def _job(args: argparse.Namespace, source: Source, out_format: str, setup: Any) -> dict[str, Any]:
    manifest = setup.package.manifest
    variant = manifest.variants[setup.choice.variant]
    return {"format": JOB_FORMAT, "input": fingerprint(args.input), "text_column": source.text_column,
            "id_column": source.id_column, "output_format": out_format,
            "model": {"name": manifest.name, "version": manifest.version, "variant": variant.name,
                      "graph_sha256": variant.file.sha256},
            "min_score": args.min_score}


def _compare_jobs(old: dict[str, Any], new: dict[str, Any], work: WorkDir) -> None:
    """A resumed job must be the same job: the same input file, columns, model, variant, --min-score."""
    for key in ("input", "text_column", "id_column", "output_format", "model", "min_score"):
        if old.get(key) != new[key]:
            what = "INPUT changed since" if key == "input" else f"{key} differs from what"
            raise InputError(f"cannot resume: {what} the unfinished job in {work.path} was started with "
                             f"({old.get(key)!r}, now {new[key]!r}); run with the job's arguments, "
                             "or --overwrite to start again")


def _start_pool(args: argparse.Namespace, setup: Any, run_plan: Any) -> LocalPool | ProcessPool:
    load = {"package_dir": setup.package.root, "variant": setup.choice.variant, "tier": setup.choice.tier.name,
            "threads": run_plan.threads, "workers": 1, "min_score": args.min_score, "spin": args.spin}
    if run_plan.processes == 1:
        return LocalPool(Classifier.load(**load), run_plan.workers)
    pool = ProcessPool(run_plan.processes, load)
    try:
        pool.wait_ready()
    except BaseException:
        pool.close()
        raise
    return pool


def run(args: argparse.Namespace) -> int:
    """The command; returns the exit code (whole-run problems are logged as one line)."""
    try:
        return _run(args)
    except InputError as exc:
        log.error("%s", exc)
        return exits.EXIT_USAGE
    except WorkerFailed as exc:
        log.error("%s", exc.message)
        return exc.code


def _run(args: argparse.Namespace) -> int:
    try:
        check_min_score(args.min_score)
    except ValueError as exc:
        raise startup.UsageError(f"--min-score: {exc}") from None
    for name in ("processes", "threads", "workers", "part_records"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise startup.UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.ray is not None:
        from runtime.score import ray_data

        return ray_data.run(args)
    args.input, args.output = Path(args.input), Path(args.output)
    out_format, work = _check_paths(args)
    old_job = work.read_job() if args.resume and work.exists() else None
    same_input = old_job is not None and old_job.get("input") == fingerprint(args.input)
    source = open_source(args.input, args.text_column, args.id_column, check_encoding=not same_input)
    setup = startup.prepare(argparse.Namespace(**{**vars(args), "threads": None, "workers": None}))
    job = _job(args, source, out_format, setup)
    if old_job is not None:
        _compare_jobs(old_job, job, work)
    run_plan = plan(scoring_cores(), args.processes, args.workers, args.threads, setup.choice.tier.threads_max)
    pool = _start_pool(args, setup, run_plan)  # exit 3/4 here: nothing written yet
    try:
        return _score(args, source, work, job, pool, run_plan, out_format, resume=old_job is not None)
    except OSError as exc:  # reading errors arrive as InputError: this is the output side
        where = f" {exc.filename}" if exc.filename else ""
        log.error("cannot write%s: %s; fix that and run again with --resume", where, exc.strerror or exc)
        return exits.EXIT_OUTPUT_FAILED
    finally:
        pool.close()


def _score(args: argparse.Namespace, source: Source, work: WorkDir, job: dict[str, Any],
           pool: LocalPool | ProcessPool, run_plan: Any, out_format: str, resume: bool) -> int:
    if resume:
        work.lock()
    elif work.exists():  # --overwrite
        work.lock()
        work.remove()
    if not resume:
        work.create(job)
    parts: list[Part] = work.parts()
    done, offset = (parts[-1].last, parts[-1].offset) if parts else (0, 0)
    layout = Layout(out_format, source.id_column or "id", source.id_type, numbered=source.id_column is None)
    log.info("scoring %s → %s: model %s, variant %s, %s%s", args.input, args.output, job["model"]["name"],
             job["model"]["variant"], run_plan.describe(), f"; resuming after record {done:,}" if done else "")
    progress = Progress(source.total, offset, enabled=not args.quiet)
    started = time.monotonic()
    # Each text is kept one character beyond what the model reads: cut, and marked truncated, as
    # the protocol would, however long the record (runtime/score/long.py).
    reader = WindowReader(source.records(done, offset, keep=pool.max_text_chars + 1))
    in_flight = run_plan.processes * run_plan.workers * IN_FLIGHT_PER_WORKER
    try:
        tally = score_stream(reader, pool, work, layout, progress, in_flight, args.part_records, done + 1)
    except KeyboardInterrupt:
        progress.finish()
        log.error("interrupted: the finished parts are kept in %s; run the same command with --resume "
                  "to continue", work.path)
        raise
    progress.finish()
    total = work.assemble(layout)
    work.remove()
    elapsed = time.monotonic() - started
    errors = ", ".join(f"{code} {n:,}" for code, n in tally.errors.most_common())
    log.info("scored %s records in %s (%s/s) → %s: %s abstained, %s error rows%s%s", f"{tally.records:,}",
             duration(elapsed), f"{tally.records / max(elapsed, 1e-9):,.0f}", args.output,
             f"{sum(tally.abstained.values()):,}", f"{sum(tally.errors.values()):,}",
             f" ({errors})" if errors else "", f"; {total:,} rows with the resumed parts" if resume else "")
    return exits.EXIT_OK
