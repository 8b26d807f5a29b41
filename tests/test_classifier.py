"""The library API: `Classifier.load(...).classify(texts)` answers exactly like the protocol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import Answer, Classifier
from runtime.engine.engine import Engine
from runtime.package.load import load_package
from runtime.serve.service import Service

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["rain and wind", "hello and thanks for the lunch", "the a is and", "rain zzkq wqxx qqqq", "rain goal",
         "Pumpe 3: Vibration über Grenzwert " * 20]


@pytest.mark.parametrize("variant", ["fp32", "int8-u8u8"])
def test_answers_are_the_protocols_answers(tiny_scoped_package_dir, variant):
    classifier = Classifier.load(tiny_scoped_package_dir, variant=variant, threads=1, min_score=0.9)
    service = Service(Engine(load_package(tiny_scoped_package_dir), variant), min_score=0.9)
    lines = service.answer_lines([json.dumps({"id": i, "text": t}).encode() for i, t in enumerate(TEXTS)])
    wire = [json.loads(line) for line in lines]
    answers = classifier.classify(TEXTS)
    assert all(isinstance(a, Answer) for a in answers)
    assert [a.to_json() for a in answers] == [{k: v for k, v in w.items() if k not in ("id", "variant", "model", "ms")}
                                              for w in wire]
    assert [a.reason for a in answers] == [None, "out_of_scope", "out_of_scope", "unreadable", "low_score", None]
    assert answers[-1].truncated and answers[0].label == "weather" and answers[1].label is None
    assert classifier.variant == variant and classifier.describe()["abstention"]["min_score"] == 0.9


def test_texts_the_protocol_refuses_are_refused_before_anything_runs(tiny_package_dir):
    classifier = Classifier.load(tiny_package_dir, threads=1)
    with pytest.raises(ValueError, match=r"texts\[1\]: text is empty"):
        classifier.classify(["rain", "   "])
    with pytest.raises(ValueError, match=r"texts\[0\]: text must be a string"):
        classifier.classify([None])
    with pytest.raises(TypeError, match="classify\\(\\[text\\]\\)"):
        classifier.classify("rain")
    assert classifier.classify([]) == []
    with pytest.raises(ValueError, match="min_score"):
        Classifier.load(tiny_package_dir, min_score=1.5)


def test_the_cpu_is_probed_before_numpy_is_imported(tiny_package_dir):
    code = ("import sys\nfrom runtime import Classifier\nfrom runtime.platform.tiers import CpuUnsupported\n"
            "try:\n    Classifier.load(sys.argv[1])\nexcept CpuUnsupported as exc:\n"
            "    print('refused', 'numpy' in sys.modules, 'onnxruntime' in sys.modules, exc)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tiny_package_dir)], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "DECIDE_FAKE_CPU": "x86_64:sse,sse2"}, timeout=60, check=False)
    assert done.stdout.startswith("refused False False") and "pni" in done.stdout, done.stdout + done.stderr


def test_the_library_example_runs(tiny_package_dir):
    done = subprocess.run([sys.executable, "examples/library.py", "--model", str(tiny_package_dir), "rain and snow",
                           "the team scored a goal"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stderr
    assert [line.split("\t")[0] for line in done.stdout.splitlines()[1:]] == ["weather", "sports"]
