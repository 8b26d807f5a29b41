"""The library API: load a package once, classify texts, get the protocol's answers as objects.

    from runtime import Classifier

    clf = Classifier.load("models/packages/machine-alarms")   # None: the embedded default package
    for answer in clf.classify(["Öllache unter der Presse", "hello there"]):
        print(answer.label, answer.leaning, answer.score, answer.reason)

Every entry point goes through this module, so there is one code path from a text to an answer:
the CLI commands and the socket server (`prepare` → `load_engine`), the protocol's Service (`answer`
for every result), `decide score` and the Ray Data predictor (`Classifier`). The order is the
CLI's: CPU probe → tier → numeric stack → package manifest, all stdlib; numpy and onnxruntime are
imported by `load_engine` only after them, so a CPU decide cannot serve is refused with
CpuUnsupported instead of dying with "Illegal instruction". Stdlib only at import.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.package import signing
from runtime.package.abstain import AbstentionPolicy, Decision, decide
from runtime.package.load import Package, beyond_variant, load_package, verify_files
from runtime.platform.appdir import default_model_dir, find_data_dir
from runtime.platform.cpu import CpuFeatures, probe
from runtime.platform.stack import NumericStack, activate, stack_for
from runtime.platform.tiers import Choice, PlatformTiers, Tier, load_platform, select
from runtime.protocol import DEFAULT_MAX_BATCH, EMPTY_TEXT, INVALID_REQUEST, result_json

if TYPE_CHECKING:  # runtime.engine.engine imports numpy: only after the probe
    from runtime.engine.engine import Classification, Engine

log = logging.getLogger("decide")


@dataclass(frozen=True)
class Setup:
    """Everything decided before numpy/onnxruntime are imported."""

    features: CpuFeatures
    platform: PlatformTiers
    choice: Choice
    package: Package
    threads: int
    workers: int
    stack: NumericStack
    signer: signing.Signer | None = None  # who signed the package (None: unsigned)
    trusted: signing.TrustedKeys = field(default_factory=signing.TrustedKeys)
    notes: tuple[str, ...] = ()  # what the launcher changed or chose on its own, logged once the model is ready


def sizes(features: CpuFeatures, tier: Tier, threads: int | None = None, workers: int | None = None) -> tuple[int, int]:
    """(threads, workers): as asked, else the usable cores (affinity and cgroup quota) within the tier's cap."""
    default = min(features.usable_cores, tier.threads_max or features.usable_cores)
    return threads or default, workers or default


def prepare(model_dir: Path | str, tier: str | None = None, variant: str | None = None,
            threads: int | None = None, workers: int | None = None, trust_keys: Iterable[Path | str] = ()) -> Setup:
    """CPU → tier → numeric stack → package (and its signature) → variant: the stdlib-only part
    of loading a model. `trust_keys`: minisign public keys (files or directories) on top of
    $DECIDE_TRUST_KEYS and trusted-keys/; with any, the package must be signed by one of them.

    Raises CpuUnsupported (or LegacyStackMissing), OverrideError for a tier/variant this CPU or
    package cannot honour, PackageError (also for a signature that is missing or wrong while keys
    are trusted), NoUsableVariant, ValueError for threads/workers < 1."""
    for name, value in (("threads", threads), ("workers", workers)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    features = probe()
    platform = load_platform(find_data_dir("platforms"), features.arch)
    # Refuse the CPU, or a tier whose numeric stack is missing, before touching the package.
    stack = stack_for(select(features, platform, None, tier).tier)
    trusted = signing.TrustedKeys.configured(list(trust_keys))
    package = load_package(model_dir)
    signer = signing.check_signature(package.root, package.manifest_bytes, package.signature, trusted)
    choice = select(features, platform, package.manifest.variants.keys(), tier, variant)
    if trusted.enforced:  # a signed package is accepted whole: the files no variant served reads too
        verify_files(package, beyond_variant(package.manifest, choice.variant))
    # Notes wait for the engine to be ready: a refusal after this point stays one stderr line.
    notes = [f"ignoring {setting}: OpenBLAS picks this CPU's kernels itself"
             for setting in activate(stack)]  # before runtime.engine.engine imports numpy
    if stack.path is not None:
        notes.append(f"numeric stack: {stack.reason}")
    return Setup(features, platform, choice, package, *sizes(features, choice.tier, threads, workers), stack,
                 signer, trusted, tuple(notes))


def load_engine(setup: Setup, variant: str | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                spin: bool = False) -> Engine:
    """Import the numeric stack (only now) and build the verified, warmed engine."""
    from runtime.engine.engine import Engine, EngineLimits, SessionSettings

    ort_settings = setup.choice.tier.ort
    settings = SessionSettings(
        threads=setup.threads,
        workers=setup.workers,
        spinning=spin,
        graph_optimization_level=ort_settings.get("graph_optimization_level", "extended"),
        inter_op_threads=int(ort_settings.get("inter_op_threads", 1)),
    )
    engine = Engine(setup.package, variant or setup.choice.variant, settings, EngineLimits(max_batch=max_batch))
    engine.warm_up()
    for note in setup.notes:
        if note not in _LOGGED_NOTES:  # once per process, however many engines (selftest, swaps)
            _LOGGED_NOTES.add(note)
            log.info("%s", note)
    return engine


_LOGGED_NOTES: set[str] = set()


@dataclass(frozen=True)
class Answer:
    """One text's answer, the same fields as a protocol result (docs/protocol.md)."""

    label: str | None  # the decision; None when abstained
    leaning: str  # the case label the model leans to, always set
    score: float  # calibrated probability of `leaning`
    scores: dict[str, float]  # every label's calibrated probability, in manifest order
    abstained: bool
    reason: str | None  # unreadable / out_of_scope / low_score when abstained (runtime/package/abstain.py)
    truncated: bool  # the model saw only the first max_length tokens (or max_text_chars characters)

    def to_json(self) -> dict[str, Any]:
        """The protocol's result object (rounded like every answer on the wire)."""
        decision = Decision(self.label, self.leaning, self.score, self.reason)
        return result_json(decision, tuple(self.scores.values()), tuple(self.scores), self.truncated)


def answer(result: Classification, policy: AbstentionPolicy, labels: Sequence[str],
           clipped: bool = False) -> Answer:
    """The answer for one engine result under the package's abstention policy; `clipped`: the
    caller cut the text to the character budget before the engine saw it."""
    decision = decide(result.probs, policy, result.unknown_share, result.novelty)
    return Answer(decision.label, decision.leaning, decision.score, dict(zip(labels, result.probs)),
                  decision.abstained, decision.reason, result.truncated or clipped)


def text_problem(text: object) -> tuple[str, str] | None:
    """(error code, message) when `text` is not something the protocol would classify: not a
    string, empty or only whitespace, or not valid Unicode (lone surrogates); None when fine."""
    if not isinstance(text, str):
        return INVALID_REQUEST, f"text must be a string, got {type(text).__name__}"
    if not text.strip():
        return EMPTY_TEXT, "text is empty"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return INVALID_REQUEST, "text is not valid Unicode (lone surrogates)"
    return None


def check_min_score(min_score: float | None) -> None:
    """--min-score / min_score must be a probability in (0, 1] (None: never abstain on score)."""
    if min_score is not None and not 0.0 < min_score <= 1.0:
        raise ValueError(f"min_score must be in (0, 1], got {min_score}")


class Classifier:
    """A loaded package: `classify(texts)` answers like the protocol does (same tier and variant
    choice, truncation, calibration, abstention and reasons). Thread-safe: several threads may
    call `classify` at once (the ORT session and the tokenizer take concurrent calls)."""

    def __init__(self, engine: Engine, setup: Setup | None = None, min_score: float | None = None):
        check_min_score(min_score)
        self.engine = engine
        self.setup = setup
        self.min_score = min_score
        self.policy = engine.package.manifest.abstention_policy(engine.variant.name, min_score)

    @classmethod
    def load(cls, package_dir: Path | str | None = None, variant: str | None = None, threads: int | None = None,
             *, tier: str | None = None, workers: int | None = None, min_score: float | None = None,
             max_batch: int = DEFAULT_MAX_BATCH, spin: bool = False) -> Classifier:
        """Probe the CPU, choose tier and variant (or take `tier`/`variant`), verify the package
        (None: the embedded default) and load it warm. `threads`: ORT threads per call; `workers`:
        batches of one call that run at once (both default to the usable cores, capped by the
        tier); `min_score`: abstain (low_score) below it. Errors: see `prepare`."""
        check_min_score(min_score)  # before the model loads
        setup = prepare(default_model_dir() if package_dir is None else package_dir, tier, variant, threads, workers)
        return cls(load_engine(setup, max_batch=max_batch, spin=spin), setup, min_score)

    @property
    def labels(self) -> tuple[str, ...]:
        """The package's labels, in manifest order."""
        return self.engine.labels

    @property
    def variant(self) -> str:
        """The model variant that answers (fp32, int8-u8u8, …)."""
        return self.engine.variant.name

    @property
    def max_text_chars(self) -> int:
        """Characters of a text the model can see at most (the rest is cut, truncated=True)."""
        return self.engine.encoder.max_chars

    def describe(self) -> dict[str, Any]:
        """What answers: model, variant, tier, threads, abstention policy (JSON-ready)."""
        manifest = self.engine.package.manifest
        return {"model": {"name": manifest.name, "version": manifest.version, "labels": list(manifest.labels)},
                "variant": self.variant, "tier": self.setup.choice.tier.name if self.setup else None,
                "threads": self.engine.settings.threads, "workers": self.engine.settings.workers,
                "abstention": self.policy.to_json()}

    def classify(self, texts: Sequence[str]) -> list[Answer]:
        """One answer per text, in order. Raises ValueError naming the first text the protocol
        would refuse (not a string, empty, invalid Unicode), before anything runs."""
        if isinstance(texts, str):
            raise TypeError("classify takes a sequence of texts; for one text use classify([text])")
        texts = list(texts)
        for index, text in enumerate(texts):
            problem = text_problem(text)
            if problem is not None:
                raise ValueError(f"texts[{index}]: {problem[1]} ({problem[0]})")
        if not texts:
            return []
        labels = self.labels
        return [answer(result, self.policy, labels) for result in self.engine.classify(texts)]
