"""The figures of issue 13 for a package's int8 variants: determinism, batch-1 speed, accuracy.

    python3 benchmarks/int8.py determinism [--model DIR] [--texts 320]
    python3 benchmarks/int8.py socket      [--model DIR] [--texts 240] [--others 8]
    python3 benchmarks/int8.py speed       [--model DIR] [--threads 1,2] [--rounds 40]
    python3 benchmarks/int8.py accuracy    [--model DIR]
    python3 benchmarks/int8.py torch       [--model DIR]

determinism: each held-out text alone (batch 1, its own length) vs the same text mixed into
  batches of other texts of varied lengths (random sizes 2–32, shuffled; the engine pads them to
  its buckets), twice with different mixes: label changes and max |Δp| per variant.
socket: `decide serve --socket` with the variant forced; one client sends the texts one at a time
  while N other clients stream other texts (short and long), so the server batches them
  together; answers compared with the same engine run alone in this process.
speed: bare ORT sessions (no tokenizer, no protocol), batch 1, each text at its own length;
  short = held-out texts of ≤ 16 tokens, medium = held-out texts joined to 64 tokens. Variants
  interleaved text by text (A, B, C, A, B, C …), median per text, ratio FP32 / variant of the
  summed medians. Prints the load average: the box is shared.
accuracy: the held-out file (--heldout, default the default model's test.csv), through the engine: accuracy,
  macro-F1, worst class-recall drop vs FP32, label agreement with FP32.
torch: the PyTorch contender of benchmarks/compare.py (the package's FP32 weights in PyTorch, and
  PyTorch's dynamic int8 of it) next to the package's ORT variants, on the golden texts and the
  held-out split: accuracy, macro-F1, label agreement and max |Δp| against ORT FP32.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import numpy as np

from runtime.package.load import load_package
from runtime.platform.appdir import DEFAULT_MODEL as DEFAULT_MODEL_DIR

DEFAULT_MODEL = REPO / DEFAULT_MODEL_DIR  # the embedded default (runtime/platform/appdir.py)
# Held-out texts of the default: the independent writer's test set (never trained or calibrated on)
HELDOUT = REPO / "models" / "tasks" / "machine-alarms" / "test" / "test.csv"
SHORT_TOKENS = 16
MEDIUM_TOKENS = 64


def heldout_examples() -> list:
    """The labelled held-out texts (--heldout; default: the default model's independent test set)."""
    from models.data.userdata import read_labelled_file

    return read_labelled_file(HELDOUT, for_training=False).examples


def sample_texts(count: int, seed: int = 7) -> list[str]:
    """`count` held-out texts, a fixed random sample."""
    texts = [e.text for e in heldout_examples()]
    return random.Random(seed).sample(texts, min(count, len(texts)))


def determinism(model: Path, count: int) -> None:
    from runtime.engine.engine import Engine

    package = load_package(model)
    texts = sample_texts(count)
    others = sample_texts(2000, seed=11)
    print(f"{len(texts)} held-out texts: alone vs mixed into batches of 2–32 other texts (2 mixes)")
    print(f"{'variant':<11} {'label changes':>13} {'max |Δp|':>10}")
    for name in package.manifest.variants:
        engine = Engine(package, name)
        alone = [engine.classify([t])[0] for t in texts]
        changes, worst = 0, 0.0
        for mix in range(2):
            rng = random.Random(100 + mix)
            mixed: list = [None] * len(texts)
            position = 0
            while position < len(texts):
                size = rng.randint(2, 32)
                own = list(range(position, min(position + rng.randint(1, 4), len(texts))))
                batch = [(i, texts[i]) for i in own] + [(None, t) for t in rng.sample(others, max(0, size - len(own)))]
                rng.shuffle(batch)
                for (index, _), result in zip(batch, engine.classify([t for _, t in batch])):
                    if index is not None:
                        mixed[index] = result
                position = own[-1] + 1
            for a, b in zip(alone, mixed):
                changes += a.label != b.label
                worst = max(worst, max(abs(p - q) for p, q in zip(a.probs, b.probs)))
        print(f"{name:<11} {changes:>13} {worst:>10.1e}")


async def _socket_run(where: str, texts: list[str], others: list[str], clients: int) -> list[dict]:
    import json

    from benchmarks.load import client, open_connection

    stop = [False]
    latencies: list[float] = []
    errors: list[str] = []

    async def stream(offset: int) -> None:
        while not stop[0]:
            await client(where, others, offset, time.perf_counter() + 0.5, float("inf"), latencies, errors)

    background = [asyncio.create_task(stream(1000 * (k + 1))) for k in range(clients)]
    await asyncio.sleep(1.0)
    reader, writer = await open_connection(where)
    answers = []
    for number, text in enumerate(texts):
        writer.write(json.dumps({"id": number, "text": text}, ensure_ascii=False).encode() + b"\n")
        answers.append(json.loads(await reader.readline()))
    writer.close()
    stop[0] = True
    await asyncio.gather(*background)
    return answers


def socket_check(model: Path, count: int, clients: int) -> None:
    from benchmarks.load import request, start_server
    from runtime.engine.engine import Engine

    package = load_package(model)
    labels = package.manifest.labels
    texts = sample_texts(count)
    rng = random.Random(5)
    pool = sample_texts(1500, seed=13)
    others = pool[:1000] + [" ".join(rng.sample(pool, 8)) for _ in range(200)]  # short and long
    print(f"{len(texts)} texts over the socket, {clients} other clients streaming; vs the engine alone")
    print(f"{'variant':<11} {'label changes':>13} {'max |Δp|':>10} {'batches seen (size: count)'}")
    for name in package.manifest.variants:
        engine = Engine(package, name)
        alone = [engine.classify([t])[0] for t in texts]
        with tempfile.TemporaryDirectory() as directory:
            proc, ready = start_server(model, ["--variant", name], directory)
            try:
                answers = asyncio.run(_socket_run(ready["listen"], texts, others, clients))
                stats = asyncio.run(request(ready["listen"], {"id": "s", "op": "stats"}))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        changes, worst = 0, 0.0
        for a, answer in zip(alone, answers):
            changes += a.label != answer.get("label")
            # the protocol rounds scores to 6 decimals
            worst = max(worst, max(abs(p - answer["scores"][label]) for p, label in zip(a.probs, labels)))
        sizes = stats.get("batch_sizes") or stats.get("stats", {}).get("batch_sizes") or {}
        print(f"{name:<11} {changes:>13} {worst:>10.1e} {dict(list(sizes.items())[:8]) if sizes else ''}")


def speed_texts(model: Path) -> dict[str, list[list[int]]]:
    """Token ids: short (≤ 16 tokens) and medium (held-out texts joined, cut to 64 tokens)."""
    from tokenizers import Tokenizer

    package = load_package(model)
    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=package.manifest.max_length)
    texts = sample_texts(400, seed=3)
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    short = [s for s in ids if len(s) <= SHORT_TOKENS][:60]
    medium = []
    for start in range(0, len(texts), 8):
        joined = tokenizer.encode(" ".join(texts[start:start + 12])).ids
        if len(joined) >= MEDIUM_TOKENS:
            medium.append(joined[:MEDIUM_TOKENS - 1] + joined[-1:])  # keep the closing special token
    return {"short": short, "medium": medium[:30]}


def speed(model: Path, thread_counts: list[int], rounds: int) -> None:
    import onnxruntime as ort

    from runtime.engine.engine import SessionSettings, session_options

    package = load_package(model)
    names = list(package.manifest.variants)
    sets = speed_texts(model)
    print(f"load average before: {os.getloadavg()}; cores usable: {len(os.sched_getaffinity(0))}; "
          f"short {len(sets['short'])} texts ({min(map(len, sets['short']))}–{max(map(len, sets['short']))} tokens), "
          f"medium {len(sets['medium'])} texts ({MEDIUM_TOKENS} tokens)")
    for threads in thread_counts:
        sessions = {}
        for name in names:
            options = session_options(SessionSettings(threads=threads))
            sessions[name] = ort.InferenceSession(str(package.path(package.manifest.variants[name].file)),
                                                  options, providers=["CPUExecutionProvider"])
        for kind, seqs in sets.items():
            feeds = [{"input_ids": np.array([s], dtype=np.int64),
                      "attention_mask": np.ones((1, len(s)), dtype=np.int64)} for s in seqs]
            for session in sessions.values():
                for feed in feeds[:10]:
                    session.run(["logits"], feed)
            times = {name: [[] for _ in feeds] for name in names}
            cpu = {name: [[] for _ in feeds] for name in names}
            for _ in range(rounds):
                for index, feed in enumerate(feeds):
                    for name in names:
                        start, start_cpu = time.perf_counter(), time.process_time()
                        sessions[name].run(["logits"], feed)
                        cpu[name][index].append(time.process_time() - start_cpu)
                        times[name][index].append(time.perf_counter() - start)
            # CPU time too: on a shared box wall time includes waiting for a core
            for label, table in (("wall", times), ("cpu", cpu)):
                total = {n: sum(statistics.median(t) for t in table[n]) / len(feeds) * 1000 for n in names}
                line = " ".join(f"{n} {total[n]:.3f} ms ({total['fp32'] / total[n]:.2f}×)" for n in names)
                print(f"threads {threads} {kind:<6} {label:<4}: {line}", flush=True)
    print(f"load average after: {os.getloadavg()}")


def engine_logits(package, name: str, texts: list[str]) -> np.ndarray:
    """A variant's log-probabilities through the runtime's engine, without the package's temperature
    (logits up to a per-row constant: what a bare session computes)."""
    from models.gate.measure import classify_probs, uncalibrated
    from runtime.engine.engine import Engine, SessionSettings

    engine = Engine(uncalibrated(package), name, SessionSettings(threads=1))
    return np.log(np.maximum(classify_probs(engine, texts), 1e-300))


def accuracy(model: Path) -> None:
    from models.training.metrics import classification_metrics

    package = load_package(model)
    labels = package.manifest.labels
    examples = heldout_examples()
    y = np.array([labels.index(e.label) for e in examples])
    predictions, metrics = {}, {}
    for name in package.manifest.variants:
        predictions[name] = engine_logits(package, name, [e.text for e in examples]).argmax(1)
        metrics[name] = classification_metrics(y, predictions[name], labels)
    ref = metrics["fp32"]
    print(f"held-out ({HELDOUT}): {len(y)} examples")
    print(f"{'variant':<11} {'accuracy':>8} {'macro-F1':>8} {'worst recall Δ':>14} {'agree w/ FP32':>13}")
    for name, m in metrics.items():
        worst = max(100 * (r - m["recall"].get(k, 0.0)) for k, r in ref["recall"].items())
        agree = int((predictions[name] == predictions["fp32"]).sum())
        print(f"{name:<11} {100 * m['accuracy']:>8.2f} {100 * m['macro_f1']:>8.2f} {-worst:>+14.2f} {agree:>8}/{len(y)}")


def torch_check(model: Path) -> None:
    import torch
    from tokenizers import Tokenizer

    from benchmarks.torch_model import dynamic_int8, torch_classifier, torch_logits
    from models.gate.calibration import softmax_t as softmax
    from models.training.metrics import classification_metrics
    from runtime.package.load import read_golden

    torch.set_num_threads(1)
    package = load_package(model)
    labels, pad_id = package.manifest.labels, package.manifest.pad_id
    fp32 = torch_classifier(package)
    contenders = {"torch fp32": fp32, "torch int8 (dynamic)": dynamic_int8(torch_classifier(package))}
    tokenizer = Tokenizer.from_file(str(package.path(package.manifest.tokenizer)))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=package.manifest.max_length)
    golden = read_golden(package)
    heldout = heldout_examples()
    for title, texts, gold in (("golden texts", [g["text"] for g in golden], [g["label"] for g in golden]),
                               ("held-out", [e.text for e in heldout], [e.label for e in heldout])):
        seqs = [e.ids for e in tokenizer.encode_batch(texts)]
        y = np.array([labels.index(label) for label in gold])
        logits = {f"ORT {name}": engine_logits(package, name, texts) for name in package.manifest.variants}
        logits.update({name: torch_logits(m, seqs, pad_id) for name, m in contenders.items()})
        reference = softmax(logits["ORT fp32"])
        print(f"{title}: {len(y)} examples; agreement and max |Δp| against ORT fp32")
        print(f"{'system':<21} {'accuracy':>8} {'macro-F1':>8} {'agree w/ FP32':>13} {'max |Δp|':>9}")
        for name, value in logits.items():
            m = classification_metrics(y, value.argmax(1), labels)
            agree = int((value.argmax(1) == reference.argmax(1)).sum())
            dp = float(np.abs(softmax(value) - reference).max())
            print(f"{name:<21} {100 * m['accuracy']:>8.2f} {100 * m['macro_f1']:>8.2f} {agree:>8}/{len(y):<4} {dp:>9.2e}")


def main() -> int:
    global HELDOUT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("determinism", "socket", "speed", "accuracy", "torch"))
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--heldout", type=Path, default=HELDOUT,
                        help="labelled CSV/JSONL of texts the model never saw (default: %(default)s)")
    parser.add_argument("--texts", type=int, default=None)
    parser.add_argument("--others", type=int, default=8)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    HELDOUT = args.heldout
    if args.what == "determinism":
        determinism(args.model, args.texts or 320)
    elif args.what == "socket":
        socket_check(args.model, args.texts or 240, args.others)
    elif args.what == "speed":
        speed(args.model, [int(t) for t in args.threads.split(",")], args.rounds)
    elif args.what == "torch":
        torch_check(args.model)
    else:
        accuracy(args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
