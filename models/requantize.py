"""Re-quantize an existing package's int8 variants from its own FP32 graph (`python -m models.quantize`).

The FP32 graph, its external data and the tokenizer are copied unchanged; the int8 variants are
made again, calibrated on the training split of the recipe's data and gated on its validation +
test split, through the same publish steps as a new package (models/publish/publish.py). The reference is
the package's own golden set (its recorded FP32-reference probabilities), and the temperature
stays the one the package was calibrated with. Torch-free.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from models.data.datasets import Example
from models.data.recipe_data import load_examples, recipe_splits
from models.data.recipes import Recipe, load_recipe, recipe_from_dict, recipe_names
from models.publish.novelty import strip_novelty
from models.publish.publish import Fp32Graph, Heldout, PublishError, Source, publish
from models.quantize.int8 import DEFAULT_INT8, VARIANTS_BY_NAME
from runtime.package.load import Manifest, load_package, read_golden
from runtime.platform.appdir import DEFAULT_MODEL_NAME


def recipe_for(manifest, recipe: str | None) -> Recipe:
    """The recipe whose data a package is re-quantized with: as asked; else the one it was trained
    with (its provenance), if that data is here; else the recipe named like the package; else the
    embedded default's (models/recipes/machine-alarms.json)."""
    if recipe:
        return load_recipe(recipe)
    recorded = manifest.provenance.get("recipe")
    if isinstance(recorded, dict):
        try:
            trained = recipe_from_dict({**recorded, "description": manifest.description})
        except (TypeError, ValueError, KeyError):
            trained = None
        if trained is not None and all(p.is_file() for p in (trained.data_path(), *trained.extra_paths(),
                                                             *trained.negative_paths()) if p):
            return trained
    return load_recipe(manifest.name if manifest.name in recipe_names() else DEFAULT_MODEL_NAME)


def requantize_package(package_dir: Path, recipe_name: str | None = None, version: str | None = None,
                       names: tuple[str, ...] | list[str] = DEFAULT_INT8) -> Manifest:
    """Rebuild the package's int8 variants, golden set and manifest in place (replaced at the end)."""
    package = load_package(package_dir)
    manifest = package.manifest
    recipe = recipe_for(manifest, recipe_name)
    splits = recipe_splits(recipe, load_examples(recipe))
    foreign = sorted({e.label for e in splits.train + splits.val + splits.test} - set(manifest.labels))
    if foreign:
        raise PublishError(f"{package_dir}: the data of recipe {recipe.name} has labels the package does not have "
                           f"({', '.join(map(repr, foreign[:5]))}); name the recipe it was trained with (--recipe)")
    golden = read_golden(package)
    temperature = manifest.temperature
    # log(p) · T are the logits behind the recorded (calibrated) probabilities, up to a row constant
    recorded = {g["text"]: np.log(np.maximum(np.array(g["probs"], dtype=np.float64), 1e-300)) * temperature
                for g in golden}
    fp32 = manifest.variants["fp32"]

    def write_fp32(staging: Path) -> Fp32Graph:
        import onnx

        for entry in fp32.files():
            shutil.copyfile(package.path(entry), staging / entry.file)
        graph = staging / fp32.file.file  # without its novelty part: the abstention step fits it again
        model = onnx.load(str(graph), load_external_data=False)
        if manifest.novelty_output() is not None:
            onnx.save(strip_novelty(model), str(graph))
        return Fp32Graph(fp32.file.file, tuple(f.file for f in fp32.data_files), fp32.weights_storage)

    def reference_logits(texts: list[str]) -> np.ndarray:
        return np.array([recorded[t] for t in texts]).reshape(len(texts), len(manifest.labels))

    provenance = {k: v for k, v in manifest.provenance.items() if k not in ("rejected_variants", "sizes")}
    provenance["requantized"] = {"by": "python -m models.quantize", "recipe": recipe.name,
                                 "from_version": manifest.version}
    source = Source(
        name=manifest.name, version=version or manifest.version, description=manifest.description,
        labels=manifest.labels, languages=manifest.languages, max_length=manifest.max_length,
        pad_id=manifest.pad_id, tokenizer_json=_tokenizer_json(package), write_fp32=write_fp32,
        reference_logits=reference_logits, reference_texts=list(recorded),
        reference_tolerance=fp32.golden_tolerance, heldout=Heldout(splits.val, splits.test),
        calibration_texts=[e.text for e in splits.train], calibration_source=f"training split of {recipe.name}",
        golden_candidates=[Example(g["text"], g["label"], g.get("language", "und")) for g in golden],
        variants=("fp32", *[n for n in names if n in VARIANTS_BY_NAME]), golden_count=len(golden),
        calibrate=False, calibration=dict(manifest.calibration), provenance=provenance,
        # the package's abstention is made again the way it was: same negative labels, unreadable
        # threshold, novelty flag rate and margin target, the novelty score fitted on the recipe's training split
        negative_labels=tuple(manifest.abstention.get("negative_labels", ())), novelty_fit=list(splits.train),
        novelty_flag_rate=float((manifest.abstention.get("novelty") or {}).get("flag_rate_target", 0.0)),
        max_unknown_share=float(manifest.abstention.get("max_unknown_share", 0.5)),
        scope_flag_target=float((manifest.abstention.get("negative_margin_choice") or {}).get(
            "target_non_cases_flagged") or 0.0),
        negative_margin=_fixed_margin(manifest.abstention))
    return publish(source, Path(package_dir))


def _fixed_margin(abstention: dict) -> float | None:
    """The package's margin when its recipe fixed it (no target chose it)."""
    choice = abstention.get("negative_margin_choice") or {}
    return float(abstention.get("negative_margin", 0.0)) if choice.get("fixed_by_recipe") else None


def _tokenizer_json(package) -> dict:
    import json

    return json.loads(package.path(package.manifest.tokenizer).read_text(encoding="utf-8"))
