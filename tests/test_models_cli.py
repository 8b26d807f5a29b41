"""`python -m models train / evaluate`: a user's CSV in, a package the runtime loads out; bad input gets one line."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fixtures.factory_cli import (
    WITHOUT_FACTORY,
    children_cpu_seconds,
    in_private_mounts,
    private_mounts_work,
    run_models,
    run_without_torch,
)

from models.data.userdata import (
    MIN_EXAMPLES_PER_LABEL,
    DataError,
    read_labelled_file,
    split_examples,
)

REPO = Path(__file__).resolve().parent.parent

# Three clearly different alarm kinds in two languages: a tiny model learns them in seconds.
TINY_ROWS = {
    ("overheating", "en"): ["motor temperature too high", "bearing overheating alarm", "spindle is hot",
                            "oil temperature above limit", "cabinet temperature high", "gearbox running hot",
                            "thermal overload on pump motor", "coolant temperature rising fast"],
    ("overheating", "de"): ["Motortemperatur zu hoch", "Lager überhitzt", "Spindel ist heiß", "Öltemperatur über Grenzwert",
                            "Schaltschrank Temperatur hoch", "Getriebe läuft heiß", "Übertemperatur an der Pumpe",
                            "Kühlmitteltemperatur steigt"],
    ("leak", "en"): ["oil leaking under the press", "water dripping from the pipe", "hydraulic hose leaking",
                     "puddle of coolant on the floor", "air leak at the valve", "steam escaping from the flange",
                     "gas smell near the burner", "leak at the pump seal"],
    ("leak", "de"): ["Öl tropft unter der Presse", "Wasser läuft aus dem Rohr", "Hydraulikschlauch undicht",
                     "Kühlmittelpfütze am Boden", "Luftleck am Ventil", "Dampf tritt am Flansch aus",
                     "Gasgeruch am Brenner", "Pumpendichtung leckt"],
    ("jam", "en"): ["conveyor belt blocked", "part stuck in the feeder", "paper jam in the printer",
                    "bottles fell over on the line", "hopper is empty", "chute clogged with material",
                    "film jammed in the wrapper", "parts piling up at station 3"],
    ("jam", "de"): ["Förderband blockiert", "Teil steckt im Zuführer", "Papierstau im Drucker",
                    "Flaschen umgefallen auf der Linie", "Trichter ist leer", "Rutsche verstopft",
                    "Folie im Wickler verklemmt", "Teile stauen sich an Station 3"],
}
# the default recipe's path (a fine-tuned e5 teacher distilled into the student), shrunk: the teacher trains its
# top 2 layers, a 2-layer student, 3,000 pieces
TINY_SETTINGS = {"student_layers": [0, 1], "vocab_budget": 3000, "golden_count": 6,
                 "teacher": {"epochs": 3, "batch_size": 8, "lr": 2e-4, "head_lr": 2e-3, "freeze_layers": 10},
                 "student": {"epochs": 3, "batch_size": 8, "lr": 3e-4, "head_lr": 2e-3}}
# the conv-attention hybrid (models/training/hybrid.py) with the pooled head, feature-distilled from frozen e5: same budget;
# every int8 variant asked for (publish makes the ones this machine's tier serves)
TINY_HYBRID_SETTINGS = {"student_layers": None, "vocab_budget": 3000, "golden_count": 6, "distill_augment": 0,
                        "teacher": None,
                        "feature_distill": {"epochs": 3, "batch_size": 8, "lr": 1e-3},
                        "student_arch": {"kind": "hybrid", "conv_layers": 1, "attention_layers": 1, "kernel": 3,
                                         "conv_ffn": 256},
                        "head": "pooled-mlp", "variants": ["fp32", "int8-u8u8", "int8-u8s8", "int8-u8s7"]}


def write_csv(path: Path, rows: list[list[str]], delimiter: str = ",", header=("text", "label", "lang")) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


# every text of a label also carries the label's code word: the pipeline is under test, not the model
CODE_WORDS = {"overheating": "HEAT", "leak": "LEAK", "jam": "JAM"}


def tiny_rows() -> list[list[str]]:
    return [[f"{CODE_WORDS[label]}: {text}", label, lang] for (label, lang), texts in TINY_ROWS.items() for text in texts]




# ----------------------------------------------------------------------------- bad input

def _bad_not_utf8(tmp: Path) -> Path:
    path = tmp / "latin1.csv"
    path.write_bytes("text,label\nhello,a\nbonjour,b\nça chauffe,a\n".encode("latin-1"))
    return path


def _bad_one_label(tmp: Path) -> Path:
    return write_csv(tmp / "one.csv", [[f"text {i}", "only", "en"] for i in range(10)])


def _bad_too_few(tmp: Path) -> Path:
    rows = [[f"text a{i}", "a", "en"] for i in range(10)] + [["text b1", "b", "en"], ["text b2", "b", "en"]]
    return write_csv(tmp / "few.csv", rows)


def _bad_empty_texts(tmp: Path) -> Path:
    return write_csv(tmp / "empty-texts.csv", [["", "a", "en"], ["  ", "b", "en"]])


def _bad_numbers(tmp: Path) -> Path:
    return write_csv(tmp / "numbers.csv", [[str(i * 1.5), "a" if i % 2 else "b", "en"] for i in range(20)])


def _bad_jsonl(tmp: Path) -> Path:
    path = tmp / "bad.jsonl"
    path.write_text('{"text": "hello", "label": "a"}\n{"text": "oops", "label": \n', encoding="utf-8")
    return path


def _bad_short_row(tmp: Path) -> Path:
    path = tmp / "short.csv"
    path.write_text("text,label,lang\nhello,a,en\nno label here\n", encoding="utf-8")
    return path


BAD_INPUTS = {
    # name: (make the file, extra args, what the one line must say)
    "missing file": (lambda tmp: tmp / "nope.csv", [], ["nope.csv", "no such file"]),
    "empty file": (lambda tmp: (tmp / "empty.csv").write_text("") and None or tmp / "empty.csv", [],
                   ["empty.csv", "empty file"]),
    "unknown text column": (lambda tmp: write_csv(tmp / "cols.csv", [["x", "a", "en"]], header=("message", "label", "lang")),
                            [], ["cols.csv", "line 1", "'text'", "--text-column"]),
    "missing label column": (lambda tmp: write_csv(tmp / "cols2.csv", tiny_rows()), ["--label-column", "team"],
                             ["cols2.csv", "line 1", "'team'"]),
    "not UTF-8": (_bad_not_utf8, [], ["latin1.csv", "line 4", "not UTF-8"]),
    "fewer than 2 labels": (_bad_one_label, [], ["one.csv", "at least 2 labels", "'only'"]),
    "label with too few examples": (_bad_too_few, [], ["few.csv", "'b' has 2 examples",
                                                       f"{MIN_EXAMPLES_PER_LABEL} are needed"]),
    "text column empty": (_bad_empty_texts, [], ["empty-texts.csv", "'text' is empty"]),
    "text column not text": (_bad_numbers, [], ["numbers.csv", "line 2", "holds numbers"]),
    "broken JSONL line": (_bad_jsonl, [], ["bad.jsonl", "line 2", "not a JSON object"]),
    "row with missing fields": (_bad_short_row, [], ["short.csv", "line 3", "column 'label'"]),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path):
    # without torch installed, in at most 2 s of CPU: the file is checked before training loads anything heavy
    make, extra, expected = BAD_INPUTS[case]
    data = make(tmp_path)
    out = tmp_path / "pkg"
    result = run_without_torch("train", "--data", str(data), "--out", str(out), *extra)
    assert result.cpu_seconds <= 2.0
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in expected:
        assert fragment in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pkg")]
    assert result.stdout == ""


def test_out_that_is_not_a_package_is_refused(tmp_path):
    data = write_csv(tmp_path / "ok.csv", tiny_rows())
    out = tmp_path / "docs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run_models("train", "--data", str(data), "--out", str(out))
    assert result.returncode == 2
    assert "not a model package" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_settings_that_are_not_recipe_keys_are_refused(tmp_path):
    data = write_csv(tmp_path / "ok.csv", tiny_rows())
    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({"student": {"epochz": 3}}))
    result = run_without_torch("train", "--data", str(data), "--settings", str(settings), "--out", str(tmp_path / "p"))
    assert result.returncode == 2 and "epochz" in _one_line(result)


def test_the_default_recipes_margin_is_fixed_and_kept_apart_from_the_cache_key():
    from dataclasses import replace

    from models.data.recipes import load_recipe

    recipe = load_recipe("machine-alarms")
    assert recipe.negative_margin is not None and not recipe.scope_flag_target
    # a publish setting: changing it re-publishes from the cached student, it never retrains
    assert replace(recipe, negative_margin=2.0).checkpoint_key("student") == recipe.checkpoint_key("student")


def test_a_users_model_has_no_novelty_score_without_validation_files_of_its_own():
    from dataclasses import replace

    from models.data.recipes import load_recipe
    from models.train import novelty_rate

    default = load_recipe("default")  # what `train --data FILE` starts from
    assert not default.validation_data and default.novelty_flag_rate > 0 and default.novelty_split_rate == 0
    assert novelty_rate(default) == 0.0  # rows split from the user's own file cannot place its threshold
    assert novelty_rate(replace(default, novelty_split_rate=0.01)) == 0.01
    with_files = replace(default, validation_data=("dev.csv",))
    assert novelty_rate(with_files) == default.novelty_flag_rate
    assert novelty_rate(replace(default, novelty_flag_rate=0.0)) == 0.0  # no novelty score asked for: none


def test_training_without_the_factory_installed_says_what_to_install(tmp_path):
    data = write_csv(tmp_path / "ok.csv", tiny_rows())
    result = run_without_torch("train", "--data", str(data), "--out", str(tmp_path / "pkg"),
                               env={"DECIDE_FACTORY_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]  # after the data summary line
    assert "needs torch" in line and "pip install" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "pkg").exists()


def _tiny_train(tmp: Path, out: Path, extra_env: dict | None = None) -> list[str]:
    data = write_csv(tmp / "alarms.csv", tiny_rows())
    settings = tmp / "tiny.json"
    settings.write_text(json.dumps(TINY_SETTINGS))
    return [sys.executable, "-m", "models", "train", "--data", str(data), "--settings", str(settings),
            "--out", str(out)]


@pytest.mark.skipif(bool(private_mounts_work()), reason=private_mounts_work() or "private mounts work")
def test_out_on_a_read_only_or_small_file_system_is_refused_before_training(tmp_path):
    data = write_csv(tmp_path / "ok.csv", tiny_rows())
    place = tmp_path / "place"
    place.mkdir()
    for options, expected in (("ro,size=64m", "Read-only file system"), ("size=1m", "MB free")):
        script = (f'mount -t tmpfs -o {options} tmpfs {place} && exec "$PYTHON" -c "$CODE" train '
                  f'--data {data} --out {place}/pkg')
        before = children_cpu_seconds()
        result = in_private_mounts(script, env={"CODE": WITHOUT_FACTORY, "DECIDE_FACTORY_CACHE": str(tmp_path / "c")})
        assert children_cpu_seconds() - before <= 2.0
        assert result.returncode == 2 and expected in _one_line(result), (options, result.stderr)
    assert not list(place.iterdir())


@pytest.mark.skipif(bool(private_mounts_work()), reason=private_mounts_work() or "private mounts work")
def test_a_disk_that_fills_during_the_run_is_one_line_and_leaves_nothing(tmp_path):
    pytest.importorskip("torch")
    place = tmp_path / "place"
    place.mkdir()
    command = " ".join(_tiny_train(tmp_path, place / "pkg"))
    # the file system has room when --out is checked; then a filler takes it all but 64 KB
    script = (f"mount -t tmpfs -o size=64m tmpfs {place} && ({command} 2> {tmp_path}/log & pid=$!; "
              f"until grep -q examples {tmp_path}/log 2>/dev/null; do sleep 0.1; done; "
              f"head -c $(( $(df --output=avail -B1 {place} | tail -1) - 65536 )) /dev/zero > {place}/filler; "
              f"wait $pid; echo rc=$?; rm {place}/filler; ls -A {place})")
    result = in_private_mounts(script, env={"DECIDE_FACTORY_CACHE": str(tmp_path / "cache")})
    log = (tmp_path / "log").read_text()
    assert "rc=2" in result.stdout, result.stdout + log[-2000:]
    assert log.strip().splitlines()[-1].startswith("error: no space left on the device"), log[-2000:]
    assert "Traceback" not in log
    assert result.stdout.strip().splitlines()[-1] == "rc=2"  # nothing left in the folder: no package, no staging


@pytest.mark.parametrize("sent, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_publish_leaves_nothing_behind(tmp_path, sent, code):
    pytest.importorskip("torch")
    out = tmp_path / "pkg"
    process = subprocess.Popen(_tiny_train(tmp_path, out), cwd=REPO, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "DECIDE_FACTORY_CACHE": str(tmp_path / "cache")})
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob(".pkg.*.partial")):  # the staging directory: publishing has begun
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-2000:]
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stderr[-2000:]
    assert "no package was written" in stderr.strip().splitlines()[-1] and "Traceback" not in stderr
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".pkg")]
    assert not [p for p in (tmp_path / "cache").rglob("*.tmp*")]  # no half-written cache file either


def test_csv_quirks_are_read_and_bad_rows_counted(tmp_path):
    # BOM, ';' separator, a quoted newline, numeric labels, an empty text, a conflicting duplicate
    path = tmp_path / "quirks.csv"
    body = ("text;label;lang\n"
            '"motor hot\nsince 10:00";1;en\n'
            "leak at pump;2;en\n"
            ";1;en\n"
            "same text;1;en\n"
            "same text;2;en\n"
            "jam;3;en\n")
    path.write_bytes("\ufeff".encode() + body.encode("utf-8"))
    data = read_labelled_file(path, for_training=False)
    assert [(e.text, e.label) for e in data.examples] == [("motor hot since 10:00", "1"), ("leak at pump", "2"),
                                                           ("jam", "3")]
    assert data.skipped == {"empty text": 1, "same text under different labels": 2}
    tab = write_csv(tmp_path / "tab.tsv", [["a text", "x", "en"], ["b text", "y", "en"]], delimiter="\t")
    assert [e.label for e in read_labelled_file(tab, for_training=False).examples] == ["x", "y"]


def test_a_recipe_joins_its_extra_data_files(tmp_path):
    # extra_data: other writers' rows join the dataset file; a text in two files counts once,
    # a text under two labels across files is dropped like within one file
    from dataclasses import replace

    from models.data.recipe_data import load_examples
    from models.data.recipes import load_recipe

    main = write_csv(tmp_path / "main.csv", [[f"motor {i} hot", "overheating", "en"] for i in range(4)]
                     + [[f"pump {i} leaks", "leak", "en"] for i in range(4)] + [["odd one", "leak", "en"]])
    extra = write_csv(tmp_path / "extra.csv", [["motor 0 hot", "overheating", "en"], ["odd one", "overheating", "hu"],
                                               ["olaj folyik", "leak", "hu"]])
    recipe = replace(load_recipe("machine-alarms"), dataset=str(main), extra_data=(str(extra),), negative_labels=(),
                     validation_data=())
    data = load_examples(recipe)
    assert sorted(e.text for e in data.examples) == sorted([f"motor {i} hot" for i in range(4)]
                                                           + [f"pump {i} leaks" for i in range(4)] + ["olaj folyik"])
    assert data.skipped == {"exact duplicate": 1, "same text under different labels": 2}
    assert data.rows == 12 and " + " in data.source
    # the extra files' contents are part of what a cached checkpoint was made from
    before = recipe.fingerprint()
    write_csv(extra, [["olaj folyik", "leak", "hu"]])
    assert recipe.fingerprint() != before
    # a label that only an extra file brings needs as many examples as any other
    write_csv(extra, [["hello", "other", "en"], ["test 123", "other", "en"]])
    with pytest.raises(DataError, match="'other' has 2 examples"):
        load_examples(recipe)
    missing = replace(recipe, extra_data=(str(tmp_path / "absent.csv"),))
    assert missing.fingerprint()["extra_data"] == [None]
    with pytest.raises(DataError, match="no such file"):
        load_examples(missing)


def test_validation_files_join_the_validation_split_only(tmp_path):
    # validation_data: other writers' rows pick the epoch, temperature and novelty threshold; they never
    # reach training or the test split; a non-case row counts as the negative label; a training text
    # is left out; a label the training data lacks is refused; the files' contents key the checkpoint
    from dataclasses import replace

    from models.data.recipe_data import load_examples, recipe_splits
    from models.data.recipes import load_recipe

    main = write_csv(tmp_path / "main.csv", [[f"motor {i} hot", "overheating", "en"] for i in range(12)]
                     + [[f"pump {i} leaks", "leak", "en"] for i in range(12)]
                     + [[f"lunch at {i}", "other", "en"] for i in range(12)])
    dev = write_csv(tmp_path / "dev.csv", [["a motor ran hot", "overheating", "fi", "case"],
                                           ["temperature back to normal", "", "fi", "resolved"],
                                           ["motor 0 hot", "overheating", "en", "case"]],
                    header=("text", "label", "lang", "kind"))
    recipe = replace(load_recipe("machine-alarms"), dataset=str(main), extra_data=(), validation_data=(str(dev),),
                     negative_labels=("other",))
    data = load_examples(recipe)
    plain = recipe_splits(replace(recipe, validation_data=()), data)
    splits = recipe_splits(recipe, data)
    assert splits.train == plain.train and splits.test == plain.test
    added = splits.val[len(plain.val):]
    assert splits.val[: len(plain.val)] == plain.val
    assert [(e.text, e.label, e.language, e.kind) for e in added] == [
        ("a motor ran hot", "overheating", "fi", "case"), ("temperature back to normal", "other", "fi", "resolved")]
    # without a negative label a non-case has no class to count as
    no_negatives = replace(recipe, negative_labels=())
    assert [e.text for e in recipe_splits(no_negatives, data).val[len(plain.val):]] == ["a motor ran hot"]
    before = recipe.fingerprint()
    write_csv(dev, [["a pump ran dry", "pump_dry", "fi"]])
    assert recipe.fingerprint() != before
    with pytest.raises(DataError, match="'pump_dry' is no label of the training data"):
        recipe_splits(recipe, data)


def test_jsonl_labels_may_be_numbers(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"t{i}", "label": i % 2}) for i in range(10)) + "\n", encoding="utf-8")
    data = read_labelled_file(path)
    assert sorted({e.label for e in data.examples}) == ["0", "1"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": ["a list"], "label": 1}\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 1.*must be a string"):
        read_labelled_file(bad)


def test_split_is_stratified_and_keeps_groups_whole(tmp_path):
    rows = []
    for label in ("a", "b", "c"):
        for lang in ("en", "de", "ja"):
            for i in range(10):
                rows.append([f"{label} {lang} {i}", label, lang, f"{label}-{i}"])  # a group = one message in 3 languages
    path = write_csv(tmp_path / "g.csv", rows, header=("text", "label", "lang", "group"))
    splits = split_examples(read_labelled_file(path).examples, seed=13)
    where = {}
    for name in ("train", "val", "test"):
        for example in getattr(splits, name):
            where.setdefault(example.group, set()).add(name)
    assert all(len(places) == 1 for places in where.values())
    for name in ("val", "test"):
        assert {e.label for e in getattr(splits, name)} == {"a", "b", "c"}
    assert len(splits.train) + len(splits.val) + len(splits.test) == 90


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("train")
    data = write_csv(tmp / "alarms.csv", tiny_rows())
    settings = tmp / "tiny.json"
    settings.write_text(json.dumps(TINY_SETTINGS))
    out = tmp / "tiny-alarms"
    result = run_models("train", "--data", str(data), "--settings", str(settings), "--out", str(out),
                        env={"DECIDE_FACTORY_CACHE": str(tmp / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[student]" in result.stderr and "ETA" in result.stderr  # progress on stderr
    return out, data


def test_train_makes_a_package_the_runtime_selftests(tiny_package):
    out, data = tiny_package
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["name"] == "tiny-alarms"
    assert manifest["labels"] == ["jam", "leak", "overheating"]
    provenance = manifest["provenance"]
    assert provenance["data"]["sha256"] == __import__("hashlib").sha256(data.read_bytes()).hexdigest()
    assert provenance["data"]["labels"] == {"jam": 16, "leak": 16, "overheating": 16}
    assert sum(provenance["split"]["sizes"].values()) == 48
    assert 0.05 <= manifest["calibration"]["temperature"] <= 20
    result = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(out)], check=False, cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout


def test_the_checkpoint_cache_survives_renaming_out_and_moving_the_data(tiny_package, tmp_path):
    # the cache key is the data's contents and the settings, not the package or file name
    out, data = tiny_package
    moved = tmp_path / "renamed-data.csv"
    moved.write_bytes(data.read_bytes())
    renamed = tmp_path / "another-name"
    result = run_models("train", "--data", str(moved), "--settings", str(out.parent / "tiny.json"),
                        "--out", str(renamed), env={"DECIDE_FACTORY_CACHE": str(out.parent / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reusing cached checkpoint" in result.stderr and "[student]" not in result.stderr  # no training step ran
    for name in ("model-fp32.onnx", "embeddings.bin", "tokenizer.json"):
        assert (renamed / name).read_bytes() == (out / name).read_bytes(), name
    assert json.loads((renamed / "manifest.json").read_text())["name"] == "another-name"


def requantized_copy(package: Path, tmp_path: Path) -> Path:
    """A copy of `package` re-quantized by `python -m models.quantize` as version 9.9.9."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(package, copy)
    result = subprocess.run([sys.executable, "-m", "models.quantize", str(copy), "--version", "9.9.9"], check=False,
                            cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "DECIDE_FACTORY_CACHE": str(package.parent / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    return copy


def test_requantize_makes_the_int8_variants_again_from_the_same_fp32_graph(tiny_package, tmp_path):
    from runtime.package.load import load_package, verify_files, verify_golden_file

    out, _ = tiny_package
    copy = requantized_copy(out, tmp_path)
    package = load_package(copy)
    manifest = package.manifest
    assert manifest.version == "9.9.9" and manifest.provenance["requantized"]["from_version"] == "1.0.0"
    assert (copy / "model-fp32.onnx").read_bytes() == (out / "model-fp32.onnx").read_bytes()
    assert set(manifest.variants) - {"fp32"}, manifest.provenance["rejected_variants"]  # an int8 variant again
    for variant in manifest.variants.values():
        verify_files(package, variant.files())
    verify_golden_file(package)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".copy")]
    selftest = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(copy)], check=False,
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr


def test_evaluate_json_matches_the_runtime(tiny_package):
    out, data = tiny_package
    result = run_models("evaluate", "--model", str(out), "--data", str(data), "--variant", "fp32", "--json",
                        "--latency-runs", "5")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    fp32 = report["variants"]["fp32"]
    assert report["examples"] == 48 and set(fp32["by_language"]) == {"de", "en"}
    # the accuracy is what the runtime's engine answers on the same texts
    from runtime.engine.engine import Engine
    from runtime.package.load import load_package

    engine = Engine(load_package(out), "fp32")
    rows = tiny_rows()
    answers = engine.classify([text for text, _, _ in rows])
    expected = np.mean([a.label == label for a, (_, label, _) in zip(answers, rows)])
    assert fp32["accuracy"] == pytest.approx(expected, abs=1e-4)
    coverage = [row["coverage"] for row in fp32["calibration"]["coverage"]]
    assert coverage == sorted(coverage, reverse=True)
    # ECE is that of the scores the runtime answers (temperature applied once); the uncalibrated
    # figure is that of the same engine without the temperature
    from models.gate.calibration import expected_calibration_error

    y = np.array([engine.labels.index(label) for _, label, _ in rows])
    calibrated = np.array([a.probs for a in answers])
    engine.temperature = 1.0
    raw = np.array([a.probs for a in engine.classify([text for text, _, _ in rows])])
    assert fp32["calibration"]["ece"] == pytest.approx(expected_calibration_error(calibrated, y), abs=1e-4)
    assert fp32["calibration"]["ece_uncalibrated"] == pytest.approx(expected_calibration_error(raw, y), abs=1e-4)
    assert set(fp32["recall"]) == {"jam", "leak", "overheating"}
    assert all(c["true"] != c["predicted"] for c in fp32["confusions"])


def test_evaluate_scores_several_files_as_one_set(tiny_package, tmp_path):
    out, data = tiny_package
    rows = tiny_rows()
    first = write_csv(tmp_path / "a.csv", rows[: len(rows) // 3])
    second = write_csv(tmp_path / "b.csv", rows[len(rows) // 3:] + rows[:2])  # two rows in both files
    reports = []
    for files in ([str(data)], [str(first), str(second)]):
        result = run_models("evaluate", "--model", str(out), "--data", *files, "--variant", "fp32", "--json",
                            "--latency-runs", "2")
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    whole, joined = reports
    assert joined["examples"] == whole["examples"] == len(rows)
    assert joined["skipped"] == {"exact duplicate": 2}
    assert joined["variants"]["fp32"]["accuracy"] == whole["variants"]["fp32"]["accuracy"]
    assert joined["variants"]["fp32"]["by_language"] == whole["variants"]["fp32"]["by_language"]


def test_evaluate_refuses_labels_the_model_does_not_have(tiny_package, tmp_path):
    out, _ = tiny_package
    other = write_csv(tmp_path / "other.csv", [["motor hot", "fire", "en"]])
    result = run_models("evaluate", "--model", str(out), "--data", str(other))
    assert result.returncode == 2 and "'fire'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_split_gives_every_language_its_share(tmp_path):
    # 20 languages × 14 texts per label (the machine-alarms shape): 10 % is 1–2 texts per language
    languages = [f"l{i:02d}" for i in range(20)]
    rows = [[f"{label} {lang} {i}", label, lang] for label in ("a", "b") for lang in languages for i in range(14)]
    splits = split_examples(read_labelled_file(write_csv(tmp_path / "l.csv", rows)).examples, seed=13)
    for name in ("val", "test"):
        held = getattr(splits, name)
        assert len(held) == 56
        for label in ("a", "b"):
            counts = [sum(1 for e in held if e.label == label and e.language == lang) for lang in languages]
            assert min(counts) >= 1 and max(counts) <= 2, (name, label, counts)


def test_an_int8_variant_evaluated_alone_shows_no_agreement_with_fp32():
    # `evaluate --variant int8-…` runs no FP32 to compare with: the table says "–", not 100 %
    from models.evaluate.evaluate import format_evaluation

    def variant(accuracy, agreement=None):
        result = {"accuracy": accuracy, "macro_f1": accuracy, "recall": {"leak": accuracy}, "confusions": [],
                  "calibration": {"ece": 0.03, "coverage": [{"threshold": 0.5, "coverage": 1.0, "accuracy": accuracy}]},
                  "latency_batch1": {"median_ms": 1.0, "p90_ms": 2.0}}
        if agreement is not None:
            result["agreement_with_fp32"] = agreement
        return result

    report = {"model": "m", "version": "1", "data": "d.csv", "examples": 10, "skipped": {}, "labels": ["leak"]}
    alone = format_evaluation({**report, "variants": {"int8-u8s8": variant(0.8)}})
    assert "| int8-u8s8 | 80.0 | 80.0 | 0.030 | – |" in alone
    both = format_evaluation({**report, "variants": {"fp32": variant(0.9), "int8-u8s8": variant(0.8, 0.9)}})
    assert "| fp32 | 90.0 | 90.0 | 0.030 | 100.0 |" in both and "| int8-u8s8 | 80.0 | 80.0 | 0.030 | 90.0 |" in both


# ----------------------------------------------------------------------------- abstention (issue 22)

# not-a-case texts, two languages; like the cases they carry a code word: the pipeline is under test
NEGATIVES = {"en": ["canteen closes at three today", "reset my password please", "hello, how are you?",
                    "temperature back to normal", "leak test passed, all seals OK", "conveyor restarted, running fine",
                    "meeting moved to Friday", "shift handover done", "new safety posters in hall 2",
                    "parking lot closed tomorrow"],
             "de": ["Kantine schließt heute um drei", "bitte mein Passwort zurücksetzen", "Hallo, wie geht's?",
                    "Temperatur wieder normal", "Dichtheitsprüfung bestanden", "Förderband läuft wieder",
                    "Besprechung auf Freitag verschoben", "Schichtübergabe erledigt", "neue Plakate in Halle 2",
                    "Parkplatz morgen gesperrt"]}
UNREADABLE = "ދުވަހު ހަވީރު ސިސްޓަމް ހުއްޓުނު"  # Thaana: no piece of e5's vocabulary reads it
SCOPED_SETTINGS = {**TINY_SETTINGS, "novelty_flag_rate": 0.05, "novelty_split_rate": 0.05, "scope_flag_target": 0.9}


def scoped_rows() -> list[list[str]]:
    """The tiny rows on five lines each: enough validation cases (≥ 20) to place a novelty threshold."""
    return [[f"{text} (line {n})", label, lang] for text, label, lang in tiny_rows() for n in range(1, 6)]


@pytest.fixture(scope="module")
def scoped_package(tmp_path_factory):
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("scoped")
    data = write_csv(tmp / "alarms.csv", scoped_rows())
    negatives = write_csv(tmp / "not-cases.csv", [[f"NOTE: {t}", lang] for lang, texts in NEGATIVES.items()
                                                   for t in texts], header=("text", "lang"))
    settings = tmp / "scoped.json"
    settings.write_text(json.dumps(SCOPED_SETTINGS))
    out = tmp / "scoped-alarms"
    result = run_models("train", "--data", str(data), "--negatives", str(negatives), "--settings", str(settings),
                        "--out", str(out), env={"DECIDE_FACTORY_CACHE": str(tmp / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_model_trained_with_negatives_abstains_with_its_reasons(scoped_package):
    manifest = json.loads((scoped_package / "manifest.json").read_text())
    assert manifest["labels"] == ["jam", "leak", "other", "overheating"]
    abstention = manifest["abstention"]
    assert abstention["negative_labels"] == ["other"]
    assert set(abstention["novelty"]["thresholds"]) == set(manifest["variants"])
    choice = abstention["negative_margin_choice"]  # the largest margin still flagging 90 % of validation non-cases
    assert choice["target_non_cases_flagged"] == 0.9 and 0 <= abstention["negative_margin"] <= 4
    assert choice["non_cases_flagged"] >= 0.9 or (abstention["negative_margin"] == 0
                                                  and choice["at_margin_0"]["non_cases_flagged"] < 0.9), choice
    assert choice["cases_flagged"] <= choice["at_margin_0"]["cases_flagged"]
    for variant in manifest["variants"].values():  # chosen to flag ~5 % of the validation cases
        assert variant["metrics"]["abstention"]["val"]["cases_flagged"] <= 0.25
    texts = ["NOTE: canteen closes at three today (line 9)", "NOTE: Parkplatz morgen gesperrt", UNREADABLE,
             "HEAT: motor temperature too high (line 2)"]
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))
    for variant in manifest["variants"]:
        result = subprocess.run([sys.executable, "-m", "runtime", "--model", str(scoped_package), "--variant", variant],
                                input=lines, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        answers = [json.loads(line) for line in result.stdout.splitlines()]
        assert [(a["abstained"], a["reason"]) for a in answers[:3]] == [
            (True, "out_of_scope"), (True, "out_of_scope"), (True, "unreadable")], (variant, answers)
        assert answers[0]["label"] is None and answers[0]["leaning"] in manifest["labels"]  # what it leaned to
        assert answers[3]["label"] == "overheating" and not answers[3]["abstained"], (variant, answers[3])
    selftest = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(scoped_package)],
                              capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr


def test_evaluate_reports_flag_rates_per_kind(scoped_package, tmp_path):
    rows = [["HEAT: spindle is hot (line 7)", "overheating", "en", "case", "plain"],
            ["NOTE: hello, how are you?", "", "en", "out_of_scope", "polite"],
            ["NOTE: Temperatur wieder normal", "", "de", "resolved", "plain"],
            [UNREADABLE, "overheating", "dv", "unreadable", ""]]
    data = write_csv(tmp_path / "kinds.csv", rows, header=("text", "label", "lang", "kind", "style"))
    result = run_models("evaluate", "--model", str(scoped_package), "--data", str(data), "--json", "--latency-runs", "2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["examples"] == 2 and report["texts"] == 4  # accuracy only where there is a right label
    scope = report["variants"]["fp32"]["abstention"]
    assert scope["unreadable"]["reasons"] == {"unreadable": 1} and scope["unreadable"]["flagged_or_right"] == 1.0
    assert scope["non_cases"]["texts"] == 2 and scope["out_of_scope"]["reasons"] == {"out_of_scope": 1}
    styles = scope["by_style"]  # per writing style: cases and non-cases (the unreadable row has none)
    assert set(styles) == {"plain", "polite"}
    assert (styles["plain"]["cases"], styles["plain"]["non_cases"], styles["polite"]["non_cases"]) == (1, 1, 1)
    assert styles["polite"]["non_cases_flagged"] == 1.0 and styles["polite"]["cases_flagged"] is None
    bad = write_csv(tmp_path / "bad-kind.csv", [["x", "", "en", "chitchat"]], header=("text", "label", "lang", "kind"))
    refused = run_models("evaluate", "--model", str(scoped_package), "--data", str(bad))
    assert refused.returncode == 2 and "unknown kind 'chitchat'" in refused.stderr and len(refused.stderr.splitlines()) == 1


def test_negatives_named_like_a_case_label_are_refused_before_training(tmp_path):
    rows = tiny_rows() + [[f"other {t}", "other", "en"] for t in ("a b", "c d", "e f", "g h")]
    data = write_csv(tmp_path / "with-other.csv", rows)
    negatives = write_csv(tmp_path / "neg.csv", [["hello"], ["hi there"]], header=("text",))
    result = run_without_torch("train", "--data", str(data), "--negatives", str(negatives), "--out", str(tmp_path / "p"))
    assert result.returncode == 2 and "--negative-label" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    missing = run_without_torch("train", "--data", str(data), "--negative-label", "chitchat", "--out", str(tmp_path / "p"))
    assert missing.returncode == 2 and "'chitchat' is no label of the data" in missing.stderr
    every_label = [arg for label in ("overheating", "leak", "jam", "other") for arg in ("--negative-label", label)]
    everything = run_without_torch("train", "--data", str(data), *every_label, "--out", str(tmp_path / "p"))
    assert everything.returncode == 2 and "at least one label must be a case" in everything.stderr
    assert not (tmp_path / "p").exists()


def test_a_tiny_hybrid_trains_packages_and_selftests_every_variant(tmp_path):
    pytest.importorskip("torch")
    from models.publish.publish import host_tier

    data = write_csv(tmp_path / "alarms.csv", tiny_rows())
    settings = tmp_path / "hybrid.json"
    settings.write_text(json.dumps(TINY_HYBRID_SETTINGS))
    out = tmp_path / "tiny-hybrid"
    before = children_cpu_seconds()
    result = run_models("train", "--data", str(data), "--settings", str(settings), "--out", str(out),
                        env={"DECIDE_FACTORY_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert children_cpu_seconds() - before < 120  # the tiny transformer's budget (~30-40 s CPU here)
    manifest = json.loads((out / "manifest.json").read_text())
    recipe = manifest["provenance"]["recipe"]
    assert recipe["student_arch"]["kind"] == "hybrid" and recipe["head"] == "pooled-mlp"
    assert manifest["provenance"]["training"]["pooled_head"]["head"] == "pooled-mlp"
    import onnx

    ops = {n.op_type for n in onnx.load(str(out / "model-fp32.onnx"), load_external_data=False).graph.node}
    assert {"Conv", "Attention"} <= ops
    # publish makes the int8 variants this machine's tier serves and those exact on every kernel (u8u8,
    # u8s7), says why not the others (u8s8 on x86 without VNNI)
    from models.quantize.int8 import VARIANTS_BY_NAME

    host = host_tier()
    rejected = manifest["provenance"]["rejected_variants"]
    for name in TINY_HYBRID_SETTINGS["variants"][1:]:
        if host is None or name in host[1] or VARIANTS_BY_NAME[name].exact_everywhere:
            assert name in manifest["variants"], rejected
        else:
            assert name not in manifest["variants"] and "not made on this machine" in rejected[name][0]
    # every variant: golden labels, its own outputs alone and batched (int8 determinism), the protocol
    result = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(out), "--all-variants"],
                            cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and "PASS fp32" in result.stdout


@pytest.mark.parametrize("settings, words", [
    ({"student_arch": {"kind": "hybrid", "conv_layers": 3, "attention_layers": 1}},  # on the default's teacher path
     "a hybrid student_arch needs feature_distill"),
    ({"student_arch": {"kind": "hybrid", "conv_layers": 3, "attention_layers": 1}, "teacher": None,
      "feature_distill": {"epochs": 1}}, "set student_layers to null"),
    ({"head": "pooled-mlp"}, "head applies to feature-distilled students"),
    ({"student_arch": {"kind": "hybrid", "conv_layers": 3, "attention_layers": 1, "kernel": 4},
      "student_layers": None}, "student_arch.kernel must be an odd integer"),
    ({"head": "cls-linear"}, "head must be one of 'mean-linear', 'pooled-mlp'"),
    ({"negative_margin": 0.5, "scope_flag_target": 0.9}, "not both"),
    ({"negative_margin": -1}, "negative_margin"),
    ({"negative_margin": "0.5"}, "negative_margin"),
])
def test_settings_it_cannot_use_are_refused_without_torch(tmp_path, settings, words):
    data = write_csv(tmp_path / "ok.csv", tiny_rows())
    path = tmp_path / "s.json"
    path.write_text(json.dumps(settings))
    result = run_without_torch("train", "--data", str(data), "--settings", str(path), "--out", str(tmp_path / "p"))
    assert result.returncode == 2 and words in _one_line(result)
    assert result.cpu_seconds <= 2.0 and not (tmp_path / "p").exists()


def test_requantize_keeps_the_abstention_of_the_package(scoped_package, tmp_path):
    import onnx

    copy = requantized_copy(scoped_package, tmp_path)
    before, after = (json.loads((p / "manifest.json").read_text()) for p in (scoped_package, copy))
    assert after["abstention"]["negative_labels"] == before["abstention"]["negative_labels"] == ["other"]
    assert after["abstention"]["max_unknown_share"] == before["abstention"]["max_unknown_share"]
    assert set(after["abstention"]["novelty"]["thresholds"]) == set(after["variants"])
    for variant in after["variants"].values():  # the novelty part once, never quantized
        graph = onnx.load(str(copy / variant["file"]["file"]), load_external_data=False).graph
        assert [o.name for o in graph.output].count("novelty") == 1
        assert len({i.name for i in graph.initializer}) == len(graph.initializer)
    selftest = subprocess.run([sys.executable, "-m", "runtime", "selftest", "--model", str(copy)], check=False,
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert selftest.returncode == 0, selftest.stdout + selftest.stderr
