"""When an answer is not a decision: the abstention policy and the one function that applies it.

decide's answers drive machines and tickets with no person in between, so a text the model
cannot stand behind comes back abstained, with a reason, instead of a confident guess:

- `unreadable`: the text itself is mostly characters the tokenizer has no piece for (a script the
  model never learned, mojibake…): its share of unknown characters is above the package's
  `abstention.max_unknown_share`. Decided from the text, before the model's answer is read.
- `out_of_scope`: the model says "not my case": a negative label (trained on the user's "not a
  case" examples) outweighs the best case label by more than the package's `negative_margin`
  (log-odds; 0, the default, means "the top class is a negative label"), or the graph's novelty
  score (distance of the text's features to everything the model was fitted on) is above the
  variant's threshold. The factory chooses both on validation data (models/publish/abstention.py).
- `low_score`: the top case label's calibrated score is below `--min-score` (off by default).

`label` is the decision (None when abstained); `leaning` is always the case label the model
leans to, with its `score`, so a client can still see it. Stdlib only, pure functions: every
transport, `decide score` and the library API call `decide` (docs/protocol.md, "Abstention").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

UNREADABLE = "unreadable"
OUT_OF_SCOPE = "out_of_scope"
LOW_SCORE = "low_score"
REASONS = (UNREADABLE, OUT_OF_SCOPE, LOW_SCORE)

# Packages made before the manifest had an abstention section still flag unreadable texts: more
# than half of the text's characters without a piece is not a text the model can read.
DEFAULT_MAX_UNKNOWN_SHARE = 0.5


@dataclass(frozen=True)
class AbstentionPolicy:
    """Everything `decide` needs besides the model's answer: from the manifest and --min-score."""

    labels: tuple[str, ...]
    negative_labels: frozenset[str] = frozenset()
    max_unknown_share: float = DEFAULT_MAX_UNKNOWN_SHARE
    novelty_threshold: float | None = None  # None: the variant has no novelty score
    min_score: float | None = None
    # log p(negative) − log p(best case) above which a negative label flags the text; 0.0 = the top
    # class decides (a negative on top flags). A positive margin lets a text that leans to "not a
    # case" only a little through as the case it names.
    negative_margin: float = 0.0

    @property
    def case_indices(self) -> tuple[int, ...]:
        """Positions of the labels that are decisions (not negative labels)."""
        return tuple(i for i, label in enumerate(self.labels) if label not in self.negative_labels)

    def to_json(self) -> dict[str, object]:
        """JSON form for `info`."""
        return {"negative_labels": sorted(self.negative_labels), "max_unknown_share": self.max_unknown_share,
                "novelty_threshold": self.novelty_threshold, "min_score": self.min_score,
                "negative_margin": self.negative_margin, "reasons": list(REASONS)}


@dataclass(frozen=True)
class Decision:
    """One text's answer: the decision (or None), what the model leans to, and why it abstained."""

    label: str | None
    leaning: str
    score: float  # calibrated probability of `leaning`
    reason: str | None  # one of REASONS when abstained

    @property
    def abstained(self) -> bool:
        """True when the answer is not a decision."""
        return self.reason is not None


def decide(probs: Sequence[float], policy: AbstentionPolicy, unknown_share: float = 0.0,
           novelty: float | None = None) -> Decision:
    """The decision for one text from its class probabilities (manifest label order), the share of
    its characters the tokenizer could not read, and the graph's novelty score (if any)."""
    cases = policy.case_indices
    best_case = max(cases, key=probs.__getitem__)
    leaning, score = policy.labels[best_case], probs[best_case]
    novel = novelty is not None and policy.novelty_threshold is not None and novelty > policy.novelty_threshold
    reason = None
    if unknown_share > policy.max_unknown_share:
        reason = UNREADABLE
    elif _negative_wins(probs, policy, score) or novel:
        reason = OUT_OF_SCOPE
    elif policy.min_score is not None and score < policy.min_score:
        reason = LOW_SCORE
    return Decision(None if reason else leaning, leaning, score, reason)


def _negative_wins(probs: Sequence[float], policy: AbstentionPolicy, best_case: float) -> bool:
    """Whether a negative label outweighs the best case label by more than the policy's margin."""
    if not policy.negative_labels:
        return False
    if policy.negative_margin == 0.0:  # the top class decides (ties go to the first label, as argmax)
        top = policy.labels[max(range(len(probs)), key=probs.__getitem__)]
        return top in policy.negative_labels
    negative = max(p for label, p in zip(policy.labels, probs) if label in policy.negative_labels)
    return math.log(max(negative, 1e-300)) - math.log(max(best_case, 1e-300)) > policy.negative_margin
