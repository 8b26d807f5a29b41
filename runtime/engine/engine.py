"""The warmed ONNX Runtime session: texts in, class probabilities out.

One session per process, sequential execution, threads sized from the usable cores. Imported
only after the CPU probe has accepted this machine (it imports numpy and onnxruntime).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from runtime.engine.batching import (
    DEFAULT_BUCKETS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BATCH_TOKENS,
    PlannedBatch,
    bucket_lengths,
    pad_batch,
    plan_batches,
    spread_batches,
)
from runtime.engine.text import Encoded, TextEncoder
from runtime.package.load import (
    Package,
    PackageError,
    check_external_data,
    read_tokenizer,
    verify_files,
    verify_golden_file,
)
from runtime.platform.offline import import_onnxruntime

ort = import_onnxruntime()

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    # EXTENDED, not ALL: ALL applies layout transforms tied to the CPU the graph is optimized on.
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class SessionSettings:
    """How the ORT session is built (from the tier's `ort` data plus command-line flags)."""

    threads: int = 1
    # Batches of one classify call that run at once (ORT sessions take concurrent Run calls).
    # Two single-batch callers keep two cores busier than one call with two intra-op threads:
    # short texts 2,229 → 2,760 texts/s with 2 workers (int8-u8s8, 2 threads, AVX-512 VNNI box).
    workers: int = 1
    spinning: bool = False  # ORT's default is on: burns CPU between sparse requests
    graph_optimization_level: str = "extended"
    inter_op_threads: int = 1


@dataclass(frozen=True)
class EngineLimits:
    """Batching limits and length buckets of the engine."""

    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    max_batch: int = DEFAULT_MAX_BATCH
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS


@dataclass(frozen=True)
class Classification:
    """The model's answer for one text (before the abstention policy, runtime/package/abstain.py)."""

    label: str  # the top class, which may be a negative ("not a case") label
    score: float
    probs: tuple[float, ...]  # in manifest label order
    truncated: bool
    unknown_share: float = 0.0  # share of the text's characters the tokenizer could not read
    novelty: float | None = None  # the graph's novelty score; None when the package has none


def softmax_rows(logits: np.ndarray) -> list[list[float]]:
    """Row-wise softmax as Python floats (float64), stable for large logits.

    Plain Python: a handful of rows of ~10 classes is faster than six numpy calls (measured
    ~110 µs → ~50 µs per batch-1 request right after a session.run), and callers want floats.
    """
    rows = []
    for row in logits.tolist():
        top = max(row)
        exps = [math.exp(value - top) for value in row]
        total = sum(exps)
        rows.append([value / total for value in exps])
    return rows


def session_options(settings: SessionSettings) -> ort.SessionOptions:
    """SessionOptions for one sequential CPU session."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, settings.threads)
    options.inter_op_num_threads = max(1, settings.inter_op_threads)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = _OPT_LEVELS[settings.graph_optimization_level]
    options.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if settings.spinning else "0"
    )
    options.log_severity_level = 3  # warnings from ORT go to stderr anyway; keep them quiet
    return options


class Engine:
    """A verified, loaded and warmed model variant."""

    def __init__(
        self,
        package: Package,
        variant: str,
        settings: SessionSettings = SessionSettings(),
        limits: EngineLimits = EngineLimits(),
        verify: bool = True,
    ):
        manifest = package.manifest
        if variant not in manifest.variants:
            raise PackageError(f"variant {variant!r} not in package {manifest.name}")
        self.package = package
        self.variant = manifest.variants[variant]
        self.labels = manifest.labels
        self.temperature = manifest.temperature
        self.settings = settings
        self.limits = limits
        self.buckets = bucket_lengths(manifest.max_length, limits.buckets)
        if verify:
            # Refuse tampered or half-copied packages before ORT sees a byte of them.
            verify_files(package, self.variant.files())
            verify_golden_file(package)
        # Also unverified (the factory's drafts): ORT must never open a file the manifest does not list.
        check_external_data(package, self.variant)
        tokenizer_path = package.path(manifest.tokenizer)
        tokenizer_json = read_tokenizer(package, verify)
        try:
            self.encoder = TextEncoder.shared(tokenizer_json, manifest.max_length, manifest.pad_id)
            vocabulary_size = self.encoder.tokenizer.get_vocab_size()
        except Exception as exc:  # tokenizers raises its own exception types for a broken file
            raise PackageError(f"cannot load the tokenizer {tokenizer_path}: {exc}") from exc
        if manifest.pad_id >= vocabulary_size:
            raise PackageError(f"pad_id {manifest.pad_id} is outside the tokenizer's {vocabulary_size} tokens")
        graph_path = package.path(self.variant.file)
        try:
            self.session = ort.InferenceSession(
                str(graph_path),
                sess_options=session_options(settings),
                providers=["CPUExecutionProvider"],
            )
        except Exception as exc:  # ORT raises its own exception types (Fail, InvalidGraph, …)
            raise PackageError(f"cannot load {graph_path}: {exc}") from exc
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.novelty_output = manifest.novelty_output()
        self.outputs = ["logits"] + ([self.novelty_output] if self.novelty_output else [])
        self._check_graph(graph_path)
        self.warm_up_ms = 0.0
        self._pool = (ThreadPoolExecutor(settings.workers, thread_name_prefix="engine-batch")
                      if settings.workers > 1 else None)

    def _check_graph(self, graph_path: object) -> None:
        """The graph's interface against the manifest: inputs we feed, a logits output one
        column per label (a mismatch would otherwise answer every request with internal_error)."""
        unknown = self.input_names - {"input_ids", "attention_mask"}
        if "input_ids" not in self.input_names or unknown:
            raise PackageError(f"{graph_path}: inputs must be input_ids (+ attention_mask), "
                               f"the graph has {sorted(self.input_names)}")
        outputs = {o.name: o.shape for o in self.session.get_outputs()}
        if "logits" not in outputs:
            raise PackageError(f"{graph_path}: no output named logits (outputs: {sorted(outputs)})")
        width = outputs["logits"][-1] if outputs["logits"] else None
        if isinstance(width, int) and width != len(self.labels):
            raise PackageError(f"{graph_path}: logits has {width} columns but the manifest lists "
                               f"{len(self.labels)} labels")
        if self.novelty_output and self.novelty_output not in outputs:
            raise PackageError(f"{graph_path}: the manifest's abstention.novelty.output {self.novelty_output!r} "
                               f"is not an output of the graph (outputs: {sorted(outputs)})")

    def warm_up(self) -> float:
        """Run one batch per length bucket so the first real request pays no first-run cost.
        Also the graph's last check: a graph that fails on a padded batch, or whose output width
        (when not fixed in the graph) differs from the labels, is a package error."""
        start = time.perf_counter()
        for length in self.buckets:
            item = Encoded((self.encoder.pad_id,) * length, False)
            try:
                rows = self.run_padded([item], length)
            except Exception as exc:  # ORT's own exception types
                raise PackageError(f"{self.package.path(self.variant.file)} fails on a batch of "
                                   f"{length} tokens: {exc}") from exc
            if len(rows[0]) != len(self.labels):
                raise PackageError(f"{self.package.path(self.variant.file)}: logits has {len(rows[0])} columns "
                                   f"but the manifest lists {len(self.labels)} labels")
        self.warm_up_ms = (time.perf_counter() - start) * 1000
        return self.warm_up_ms

    def run_padded(self, items: Sequence[Encoded], length: int) -> list[list[float]]:
        """Probabilities (one row per item, manifest label order) for items padded to `length`,
        from one session.run."""
        return self._run_rows(items, length)[0]

    def _run_rows(self, items: Sequence[Encoded], length: int) -> tuple[list[list[float]], list[float] | None]:
        """Probabilities and, when the package has one, the novelty score of each item."""
        input_ids, attention_mask = pad_batch(items, length, self.encoder.pad_id)
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        logits, *novelty = self.session.run(self.outputs, {k: v for k, v in feed.items() if k in self.input_names})
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return softmax_rows(logits), (novelty[0].reshape(-1).tolist() if novelty else None)

    def classify_encoded(self, items: Sequence[Encoded]) -> list[Classification]:
        """Classify already tokenized texts, batched by bucket, results in input order."""
        if len(items) == 1:
            # Batch-1 traffic (interactive use) skips the planner: one call at the text's own length.
            probs, novelty = self._run_rows(items, len(items[0].ids))
            return [self._classification(probs[0], items[0], novelty[0] if novelty else None)]
        plan = plan_batches(
            [len(item.ids) for item in items], self.buckets, self.limits.max_batch, self.limits.max_batch_tokens
        )

        def run(batch: PlannedBatch) -> tuple[list[list[float]], list[float] | None]:
            batch_items = [items[i] for i in batch.indices]
            # A batch of one needs no padding at all: run it at its own length (a 10-token text
            # padded to 16 would cost ~60% more for nothing). Buckets matter once rows share a shape.
            length = len(batch_items[0].ids) if len(batch_items) == 1 else batch.length
            return self._run_rows(batch_items, length)

        if self._pool is not None:
            plan = spread_batches(plan, self.settings.workers)
        rows_per_batch = self._pool.map(run, plan) if self._pool is not None and len(plan) > 1 else map(run, plan)
        results: dict[int, Classification] = {}
        for batch, (rows, novelty) in zip(plan, rows_per_batch):
            for position, (row, index) in enumerate(zip(rows, batch.indices)):
                results[index] = self._classification(row, items[index], novelty[position] if novelty else None)
        return [results[index] for index in range(len(items))]  # KeyError if the plan lost a text

    def _classification(self, probs: list[float], item: Encoded, novelty: float | None) -> Classification:
        best = max(range(len(probs)), key=probs.__getitem__)
        return Classification(label=self.labels[best], score=probs[best], probs=tuple(probs), truncated=item.truncated,
                              unknown_share=item.unknown_share, novelty=novelty)

    def classify(self, texts: Sequence[str]) -> list[Classification]:
        """Tokenize and classify texts; results in input order."""
        if not texts:
            return []
        return self.classify_encoded(self.encoder.tokenize(texts))
