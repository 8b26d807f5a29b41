"""Independent check of an imported model: transformers' probabilities vs decide's answers.

The reference is computed the way a transformers user would (AutoTokenizer with truncation at
the tokenizer's model_max_length, AutoModelForSequenceClassification, softmax), from the
save_pretrained folder alone; decide's side is `python -m runtime --model PACKAGE --variant V`
fed JSON lines on stdin, as a client would. Texts: test.csv as written (no whitespace clean-up),
plus texts longer than the max length, scripts the training data lacks, and odd input.

    python models/tasks/machine-alarms/hf_check.py --hf /tmp/ma-hf --model /tmp/ma-imported

Prints, per variant, max |Δp| over all texts and per group, and how many top labels agree.
Exit 1 if FP32 differs by more than --tolerance.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent

# Scripts and inputs the training data has no example of (it has Latin, Cyrillic, Han, kana,
# Hangul, Arabic and Devanagari): what a user may still send.
UNUSUAL = [
    "Η αντλία 3 υπερθερμαίνεται, θερμοκρασία λαδιού 85 °C",  # Greek
    "דליפת שמן מתחת למכבש ההידראולי, נא לבדוק",  # Hebrew
    "สายพานลำเลียงติดขัด ชิ้นงานค้างอยู่ที่ทางเข้า",  # Thai
    "ტუმბოს ვიბრაცია ზღვარს აღემატება",  # Georgian
    "Պոմպի ջերմաստիճանը չափազանց բարձր է",  # Armenian
    "মোটরের বিয়ারিং খুব গরম হয়ে গেছে",  # Bengali
    "கன்வேயர் பெல்ட் நின்றுவிட்டது, பொருள் சிக்கியுள்ளது",  # Tamil
    "የፓምፑ ሙቀት በጣም ከፍተኛ ነው",  # Ethiopic
    "Помпата на линия 2 тече, локва масло под нея",  # Bulgarian
    "Nhiệt độ động cơ quá cao 🔥🔥 pls check",  # emoji
    "ＰＬＣ　ｏｆｆｌｉｎｅ　ＥＲＲ　０４２",  # full-width forms (normalizer)
    "Cafe\u0301 machine: e\u0301tat capteur ge\u0301le\u0301",  # combining accents
    "pump\u200b3\u200d leak\u200e here\u00a0now",  # zero-width and no-break spaces
    "<s> oil leak </s> <pad> under press <unk> <mask>",  # the tokenizer's special tokens as text
    "   \t spaced   \n out \r\n text  ",
    "!!!",
    "x",
]


def long_texts(texts: list[str]) -> list[str]:
    """Texts far beyond the max length: mixed-language concatenations and repetitions."""
    out = [" ".join(texts[i : i + 8]) for i in range(0, 80, 8)]
    out.append("Hydraulic oil temperature rising on press 4, " * 60)  # ~2,700 characters
    out.append("温度过高，请检查电机。" * 100)
    out.append("नमस्ते, पंप 3 से तेल रिस रहा है और फर्श पर तेल फैल गया है। " * 20)
    return out


def transformers_probs(hf_dir: Path, texts: list[str]) -> tuple[np.ndarray, list[str], int]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(hf_dir)).eval()
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    probs = []
    with torch.no_grad():
        for start in range(0, len(texts), 32):
            feed = tokenizer(texts[start : start + 32], truncation=True, padding=True, return_tensors="pt")
            probs.append(torch.softmax(model(**feed).logits, dim=-1).numpy())
    return np.concatenate(probs), labels, tokenizer.model_max_length


def decide_probs(package: Path, variant: str, texts: list[str], labels: list[str]) -> tuple[np.ndarray, int]:
    """Probabilities from the runtime's stdio protocol, in `labels` order; and how many said truncated."""
    lines = "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts))
    done = subprocess.run([sys.executable, "-m", "runtime", "--model", str(package), "--variant", variant, "-q"],
                          check=False, input=lines, capture_output=True, text=True, cwd=REPO, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"runtime exited {done.returncode}: {done.stderr.strip()[-500:]}")
    answers = {}
    for line in done.stdout.splitlines():
        answer = json.loads(line)
        if "error" in answer:
            raise SystemExit(f"text {answer.get('id')}: {answer['error']}")
        answers[answer["id"]] = answer
    probs = np.array([[answers[i]["scores"][label] for label in labels] for i in range(len(texts))])
    return probs, sum(bool(answers[i]["truncated"]) for i in range(len(texts)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", type=Path, required=True, help="the save_pretrained folder that was imported")
    parser.add_argument("--model", type=Path, required=True, help="the package `models import` wrote")
    parser.add_argument("--data", type=Path, default=HERE / "test" / "test.csv")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)

    with open(args.data, encoding="utf-8", newline="") as fh:
        test = [row["text"] for row in csv.DictReader(fh)]
    groups = {"test.csv": test, "longer than max length": long_texts(test), "unusual scripts/input": UNUSUAL}
    texts = [t for group in groups.values() for t in group]
    reference, labels, max_length = transformers_probs(args.hf, texts)
    manifest = json.loads((args.model / "manifest.json").read_text(encoding="utf-8"))
    print(f"{len(texts)} texts ({', '.join(f'{k}: {len(v)}' for k, v in groups.items())}); "
          f"transformers truncates at {max_length} tokens, the package at {manifest['max_length']}")
    failed = False
    for variant in manifest["variants"]:
        probs, truncated = decide_probs(args.model, variant, texts, labels)
        dp = np.abs(probs - reference).max(axis=1)
        agree = int((probs.argmax(1) == reference.argmax(1)).sum())
        parts, start = [], 0
        for name, group in groups.items():
            parts.append(f"{name} {dp[start : start + len(group)].max():.2e}")
            start += len(group)
        print(f"{variant}: max |dp| {dp.max():.2e} ({'; '.join(parts)}); top label equal {agree}/{len(texts)}; "
              f"decide said truncated for {truncated}")
        if variant == "fp32" and dp.max() > args.tolerance:
            worst = int(dp.argmax())
            print(f"  worst: text {worst} {texts[worst][:80]!r}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
