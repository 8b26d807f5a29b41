"""The publish step that makes a package able to say "not my case" (issue 22, runtime/package/abstain.py).

    negative labels        recorded as they are: the classifier learnt them as classes, the
                           runtime answers them as abstentions (reason out_of_scope)
    novelty score          models/publish/novelty.py fitted on the FP32 graph's features of the training
                           cases, appended to every variant's graph as the output `novelty`; each
                           variant's threshold is chosen on held-out cases through the runtime's
                           engine, so that `novelty_flag_rate` of them are flagged
    unreadable             the share of unknown characters above which a text is not read at all

Thresholds are chosen on validation cases (never on test); a source without validation examples
(an import) chooses on its held-out cases that the novelty score was not fitted on. The figures
of what each variant flags on the held-out splits go to the variant's metrics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from models.data.datasets import Example
from models.progress import log
from runtime.package.load import file_entry

FEATURE_BATCH = 32
MIN_THRESHOLD_CASES = 20  # fewer held-out cases than this cannot place a 2 % quantile


def _features(graph: Path, name: str, tokenizer: Path, max_length: int, pad_id: int, texts: Sequence[str]) -> np.ndarray:
    """The tensor the FP32 graph's last linear layer reads, for each text in order (the runtime's
    own tokenizer and padding; a temporary copy of the graph with that tensor as an output)."""
    import onnx

    from runtime.platform.offline import import_onnxruntime

    ort = import_onnxruntime()

    from runtime.engine.batching import pad_batch
    from runtime.engine.text import TextEncoder

    model = onnx.load(str(graph), load_external_data=False)
    model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    probe = graph.with_name(f".features-{graph.name}")
    onnx.save(model, str(probe))  # beside the graph: its external-data files resolve
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
        inputs = {i.name for i in session.get_inputs()}
        encoder = TextEncoder.shared(tokenizer.read_text(encoding="utf-8"), max_length, pad_id)  # the engines' own
        rows = []
        for start in range(0, len(texts), FEATURE_BATCH):
            items = encoder.tokenize(list(texts[start:start + FEATURE_BATCH]))
            ids, mask = pad_batch(items, max(len(item.ids) for item in items), pad_id)
            feed = {k: v for k, v in {"input_ids": ids, "attention_mask": mask}.items() if k in inputs}
            rows.append(session.run([name], feed)[0])
    finally:
        probe.unlink(missing_ok=True)
    return np.concatenate(rows).astype(np.float32)


def _threshold_cases(validation: list[Example], test: list[Example], fitted: set[str], negatives: set[str]) -> tuple[list[str], str]:
    cases = [e.text for e in validation if e.label not in negatives]
    if len(cases) >= MIN_THRESHOLD_CASES:
        return cases, "validation"
    cases = [e.text for e in test if e.label not in negatives and e.text not in fitted]
    return cases, "held-out cases the novelty score was not fitted on"


def scope(draft) -> None:
    """Negative labels, the novelty output and its per-variant thresholds, the unreadable
    threshold: the manifest's `abstention` section."""
    source = draft.source
    negatives = set(source.negative_labels)
    draft.abstention = {"negative_labels": list(source.negative_labels), "max_unknown_share": source.max_unknown_share}
    cases = [e for e in source.novelty_fit if e.label not in negatives]
    if source.novelty_flag_rate and cases:
        _add_novelty(draft, cases, negatives)
    elif source.novelty_flag_rate:
        log("novelty score: no training cases to fit it on; the package has none")
    if (source.scope_flag_target or source.negative_margin is not None) and negatives:
        _choose_margin(draft, negatives)
    _record_flag_rates(draft, negatives)


def _add_novelty(draft, cases: list[Example], negatives: set[str]) -> None:
    import onnx  # the factory's; the command line imports this module before it checks onnx is there

    from models.publish.novelty import (
        OUTPUT,
        add_novelty_output,
        fit_novelty,
        logits_input,
        threshold_for,
    )

    source, staging = draft.source, draft.staging
    held = source.heldout
    labels = np.array([source.labels.index(e.label) for e in cases])
    case_classes = [i for i, label in enumerate(source.labels) if label not in negatives]
    texts, chosen_on = _threshold_cases(held.validation, held.test, {e.text for e in cases}, negatives)
    if len(texts) < MIN_THRESHOLD_CASES:  # known before any feature is computed
        log(f"novelty score: only {len(texts)} held-out cases to choose its threshold on; the package has none")
        return
    fp32 = staging / draft.variants["fp32"].file.file
    feature_name = logits_input(onnx.load(str(fp32), load_external_data=False))
    log(f"novelty score: fitting on the features of {len(cases)} training cases")
    features = _features(fp32, feature_name, staging / "tokenizer.json", source.max_length, source.pad_id,
                         [e.text for e in cases])
    novelty = fit_novelty(features, labels, case_classes)
    thresholds = {}
    for name, variant in list(draft.variants.items()):
        path = staging / variant.file.file
        model = add_novelty_output(onnx.load(str(path), load_external_data=False), novelty, feature_name)
        onnx.save(model, str(path))
        draft.variants[name] = replace(variant, file=file_entry(staging, variant.file.file))
    draft.abstention["novelty"] = {"output": OUTPUT, "thresholds": {}}  # the engines read the output's name
    for name in draft.variants:
        scores = np.array([c.novelty for c in draft.engine(name).classify(texts)], dtype=np.float64)
        thresholds[name] = round(threshold_for(scores, source.novelty_flag_rate), 6)
    draft.abstention["novelty"] = {
        "output": OUTPUT, "thresholds": thresholds, "flag_rate_target": source.novelty_flag_rate,
        "method": "squared Mahalanobis distance to the nearest case centroid (shared covariance, shrunk), "
                  "on the features the last linear layer reads",
        "fitted_on": f"{len(cases)} training cases", "chosen_on": f"{len(texts)} {chosen_on} texts"}
    log(f"novelty score: thresholds {thresholds} (flag {100 * source.novelty_flag_rate:.1f} % of {chosen_on} cases)")


MARGINS = tuple(round(0.25 * i, 2) for i in range(17))  # 0 … 4 (log-odds)


def _choose_margin(draft, negatives: set[str]) -> None:
    """The largest negative margin whose FP32 answers still flag `scope_flag_target` of the
    validation split's non-cases (0 when even the top-class rule flags fewer), or the recipe's fixed
    `negative_margin`: texts that lean to "not a case" only a little are then answered as the case
    they name (runtime/package/abstain.py). The validation figures at it and at 0 are recorded."""
    from runtime.package.abstain import decide
    from runtime.package.manifest import read_manifest

    source = draft.source
    validation = source.heldout.validation
    is_case = np.array([e.label not in negatives for e in validation])
    if is_case.all() or not is_case.any():
        log("negative margin: the validation split needs cases and non-cases to choose it; margin 0")
        return
    manifest = read_manifest(json.loads(json.dumps(draft.manifest().to_json())))  # as the runtime reads it
    policy = manifest.abstention_policy("fp32")
    results = draft.engine("fp32").classify([e.text for e in validation])

    def figures(margin: float) -> tuple[float, float, float]:
        chosen = replace(policy, negative_margin=margin)
        flagged = np.array([decide(r.probs, chosen, r.unknown_share, r.novelty).abstained for r in results])
        return margin, float(flagged[~is_case].mean()), float(flagged[is_case].mean())

    fixed = source.negative_margin is not None
    rows = [figures(margin) for margin in ((0.0, float(source.negative_margin)) if fixed else MARGINS)]
    meeting = [row for row in rows if row[1] >= source.scope_flag_target]
    margin, non_cases, cases = rows[-1] if fixed else meeting[-1] if meeting else rows[0]
    draft.abstention["negative_margin"] = margin
    draft.abstention["negative_margin_choice"] = {
        "target_non_cases_flagged": source.scope_flag_target or None, "fixed_by_recipe": fixed,
        "chosen_on": f"{len(validation)} validation texts (fp32)",
        "non_cases_flagged": round(non_cases, 4), "cases_flagged": round(cases, 4),
        "at_margin_0": {"non_cases_flagged": round(rows[0][1], 4), "cases_flagged": round(rows[0][2], 4)}}
    how = "fixed by the recipe" if fixed else f"target {100 * source.scope_flag_target:.1f} %"
    log(f"negative margin {margin}: validation non-cases flagged {100 * non_cases:.1f} % ({how}), "
        f"cases {100 * cases:.1f} % (margin 0: {100 * rows[0][2]:.1f} %)")


def _record_flag_rates(draft, negatives: set[str]) -> None:
    """What each variant flags on the held-out splits, through the runtime's own decision."""
    from runtime.package.abstain import decide
    from runtime.package.manifest import read_manifest

    held = draft.source.heldout
    manifest = read_manifest(json.loads(json.dumps(draft.manifest().to_json())))  # as the runtime reads it
    for name in draft.variants:
        policy = manifest.abstention_policy(name)
        engine = draft.engine(name)
        figures = {}
        for split, examples in (("val", held.validation), ("test", held.test)):
            if not examples:
                continue
            results = engine.classify([e.text for e in examples])
            flagged = [decide(r.probs, policy, r.unknown_share, r.novelty).abstained for r in results]
            is_case = [e.label not in negatives for e in examples]
            case_flags = [f for f, c in zip(flagged, is_case) if c]
            negative_flags = [f for f, c in zip(flagged, is_case) if not c]
            figures[split] = {"cases_flagged": round(float(np.mean(case_flags)), 4) if case_flags else None,
                              "negatives_flagged": round(float(np.mean(negative_flags)), 4) if negative_flags else None,
                              "cases": len(case_flags), "negatives": len(negative_flags)}
        draft.set_metrics(name, abstention=figures)
