"""Calibrated scores and abstention: the manifest's temperature reaches every answer, and
`--min-score` turns low-confidence answers into explicit abstentions (scores kept)."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import tiny_package

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["the rain and the wind", "le serveur", "the team scored a goal", "rain goal server"]


def decide(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime", *args], check=False, cwd=REPO, input=stdin,
                          capture_output=True, env={**os.environ, "DECIDE_VARIANT": "fp32"}, timeout=120)


def with_calibration(source: Path, target: Path, calibration: object) -> Path:
    """A copy of the package whose manifest carries `calibration`."""
    shutil.copytree(source, target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["calibration"] = calibration
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def expected_probs(text: str, temperature: float) -> list[float]:
    """The fixture's exact logits (keyword votes + bias), softened by the temperature."""
    tokenizer = tiny_package.build_tokenizer()
    ids = tokenizer.encode(text).ids
    logits = tiny_package.vote_matrix()[ids].sum(axis=0) + tiny_package.BIAS
    exps = [math.exp((value - logits.max()) / temperature) for value in logits]
    return [value / sum(exps) for value in exps]


def ask(package: Path, *flags: str) -> list[dict]:
    lines = b"".join(json.dumps({"id": i, "text": t}).encode() + b"\n" for i, t in enumerate(TEXTS))
    result = decide("--model", str(package), *flags, stdin=lines)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_manifest_temperature_reaches_the_scores(tiny_package_dir, tmp_path):
    package = with_calibration(tiny_package_dir, tmp_path / "calibrated", {"temperature": 2.5})
    for answer, text in zip(ask(package), TEXTS):
        expected = expected_probs(text, 2.5)
        got = [answer["scores"][label] for label in tiny_package.LABELS]
        assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5, (text, got, expected)
    # and without calibration the sharper, uncalibrated scores come back
    plain = ask(tiny_package_dir)
    assert plain[0]["score"] > ask(package)[0]["score"]


def test_min_score_abstains_but_keeps_the_scores(tiny_package_dir):
    answers = ask(tiny_package_dir, "--min-score", "0.9")
    by_text = dict(zip(TEXTS, answers))
    confident, torn = by_text["the rain and the wind"], by_text["rain goal server"]
    assert confident["score"] >= 0.9 and confident["label"] == "weather" and confident["abstained"] is False
    assert torn["score"] < 0.9 and torn["label"] is None and torn["abstained"] is True
    assert set(torn["scores"]) == set(tiny_package.LABELS)
    assert all(a["abstained"] is False for a in ask(tiny_package_dir))  # no --min-score: never abstains


def test_info_shows_the_abstention_threshold(tiny_package_dir):
    lines = b'{"op": "info"}\n'
    default = json.loads(decide("--model", str(tiny_package_dir), stdin=lines).stdout)
    assert default["min_score"] is None and default["temperature"] == 1.0
    chosen = json.loads(decide("--model", str(tiny_package_dir), "--min-score", "0.7", stdin=lines).stdout)
    assert chosen["min_score"] == 0.7


@pytest.mark.parametrize("value", ["0", "-0.1", "1.5", "nan"])
def test_impossible_min_score_is_a_usage_error(tiny_package_dir, value):
    result = decide("--model", str(tiny_package_dir), "--min-score", value)
    assert result.returncode == 2 and b"--min-score" in result.stderr and b"Traceback" not in result.stderr


@pytest.mark.parametrize("calibration", [{"temperature": 0}, {"temperature": "2"}, {"temperature": True}, [2.0]])
def test_malformed_calibration_is_a_package_error(tiny_package_dir, tmp_path, calibration):
    package = with_calibration(tiny_package_dir, tmp_path / "bad", calibration)
    result = decide("--model", str(package), stdin=b'{"text": "rain"}\n')
    assert result.returncode == 4 and b"calibration" in result.stderr and b"Traceback" not in result.stderr
