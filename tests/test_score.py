"""decide score: a file of records goes in, a file of answers comes out — the protocol's answers,
one error row per bad record, whole-run problems refused before anything is written, and a run
killed at any point finishing with --resume without losing or repeating a record."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import tiny_package

REPO = Path(__file__).resolve().parent.parent
WORDS = [w for label in tiny_package.LABELS for w in tiny_package.WORDS[label]] + tiny_package.NEUTRAL


def score(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime", "score", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def texts(count: int, seed: int = 0) -> list[str]:
    """Short texts of the tiny package's words, 1 to 12 words each (so several length buckets)."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(count)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def protocol_answers(package: Path, items: list[str], *flags: str) -> list[dict]:
    """What `decide` (stdio) answers for the texts: the reference every entry point must match."""
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(items))
    done = subprocess.run([sys.executable, "-m", "runtime", "--model", str(package), "-q", *flags],
                          cwd=REPO, input=lines, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_answers_are_the_protocols_and_bad_records_become_error_rows(tiny_scoped_package_dir, tmp_path):
    good = texts(300) + ["hello and thanks", "rain zzkq wqxx qqqq", "the a is"]  # out_of_scope, unreadable
    long = "rain " * 250_000  # a 1.25 MB line: read in pieces, answered from its first characters, truncated
    records = [{"id": f"r{i}", "text": t} for i, t in enumerate(good)]
    lines = [json.dumps(r) for r in records[:150]] + [
        "", '{"id": "empty", "text": "  "}', '{"id": "no-text"}', "not json", '{"id": "number", "text": 5}',
        '[1, 2]', '{"id": "long", "text": "' + long + '"}', '{"id": {"a": 1}, "text": "rain"}',
        '{"id": "broken", "text": "rain"',
    ] + [json.dumps(r) for r in records[150:]]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = ("--variant", "fp32", "--min-score", "0.5")
    done = score(str(source), "--output", str(tmp_path / "out.jsonl"), "--model", str(tiny_scoped_package_dir), *flags)
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(150)] + [
        "empty", "no-text", None, "number", None, "long", None, "broken"] + [f"r{i}" for i in range(150, len(good))]
    errors = [r["error"].split(":")[0] for r in rows if r["error"]]
    assert errors == ["empty_text", "missing_text", "invalid_json", "invalid_request", "invalid_request",
                      "invalid_request", "invalid_json"]
    assert "record 151" in rows[150]["error"]  # records are counted, the blank line is not one
    answers = [r for r in rows if not r["error"]]
    fields = ("label", "leaning", "score", "abstained", "reason", "truncated")
    reference = protocol_answers(tiny_scoped_package_dir, good[:150] + [long] + good[150:], *flags,
                                 "--max-line-bytes", str(2 << 20))  # the whole long text, as one request
    assert [[r[f] for f in fields] for r in answers] == [[r[f] for f in fields] for r in reference]
    assert rows[155]["truncated"] is True and rows[155]["label"] == "weather"
    assert {"out_of_scope", "unreadable", "low_score", None} <= {r["reason"] for r in answers}
    assert "7 error rows" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.jsonl.parts").exists()


def test_csv_in_csv_out_keeps_the_id_column_and_quoted_newlines(tiny_package_dir, tmp_path):
    source = tmp_path / "tickets.csv"
    items = texts(200, seed=1)
    with open(source, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["ticket", "body", "other"])
        for i, text in enumerate(items):
            writer.writerow([f"T-{i}", text + ("\nthe rain" if i % 50 == 0 else ""), i])
        fh.write("T-short,only two fields\n")
    done = score(str(source), "--output", str(tmp_path / "out.csv"), "--text-column", "body", "--id-column", "ticket",
                 "--model", str(tiny_package_dir))
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "out.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["ticket", "label", "leaning", "score", "abstained", "reason", "truncated", "error"]
    assert [r["ticket"] for r in rows] == [f"T-{i}" for i in range(200)] + ["T-short"]
    assert rows[-1]["error"].startswith("invalid_request: record 201: 2 fields") and rows[-1]["label"] == ""
    assert all(r["label"] in tiny_package.LABELS and r["abstained"] == "false" for r in rows[:200])


def test_parquet_in_and_out(tiny_package_dir, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet or ray extra)")
    import pyarrow.parquet as pq

    items = texts(3000, seed=2)
    table = pa.table({"n": pa.array(range(3000), pa.int64()), "text": pa.array(items[:2999] + [None])})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=700)
    done = score(str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out.parquet"), "--id-column", "n",
                 "--model", str(tiny_package_dir))
    assert done.returncode == 0, done.stderr
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.schema.field("n").type == pa.int64() and out.column("n").to_pylist() == list(range(3000))
    assert out.column("error").to_pylist()[-1].startswith("missing_text") and out.num_rows == 3000


def test_parquet_without_pyarrow_is_one_clear_line(tiny_package_dir, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "rain"}])
    code = ("import sys; sys.modules['pyarrow'] = None; from runtime.cli import main; "
            f"sys.exit(main(['score', {str(source)!r}, '--output', {str(tmp_path / 'out.parquet')!r}, "
            f"'--model', {str(tiny_package_dir)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        ("decide: Parquet needs pyarrow, which is not installed: pip install 'decide-classifier[parquet]' "
         "(or pip install pyarrow), or use CSV or JSON lines")]
    assert not list(tmp_path.glob("out*"))


def _start_and_kill(args: list[str], work: Path, parts: int) -> None:
    """Start decide score and SIGKILL it once `parts` part files exist."""
    process = subprocess.Popen([sys.executable, "-m", "runtime", "score", *args], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if work.is_dir() and len(list(work.glob("part-*[0-9].jsonl"))) >= parts:
            break
        time.sleep(0.01)
    assert process.poll() is None, "the run finished before it could be killed: make the input longer"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_run_killed_with_sigkill_resumes_without_losing_or_repeating_a_record(tiny_package_dir, tmp_path,
                                                                                   processes):
    count = 40_000
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts(count, seed=3))])
    output = tmp_path / "out.jsonl"
    args = [str(source), "--output", str(output), "--model", str(tiny_package_dir), "--part-records", "3000",
            "--processes", processes, "-q"]
    _start_and_kill(args, tmp_path / "out.jsonl.parts", parts=3)
    assert not output.exists()
    again = score(*args)
    assert again.returncode == 2 and "--resume" in again.stderr  # an unfinished job is never overwritten by accident
    resumed = score(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = read_jsonl(output)
    assert [r["id"] for r in rows] == list(range(count))
    fresh = score(str(source), "--output", str(tmp_path / "fresh.jsonl"), "--model", str(tiny_package_dir), "-q")
    assert fresh.returncode == 0 and read_jsonl(tmp_path / "fresh.jsonl") == rows
    assert not (tmp_path / "out.jsonl.parts").exists()


def test_resume_recovers_every_state_a_kill_can_leave(tiny_package_dir, tmp_path):
    """A part written but not renamed (.tmp), a half-made work directory, assembly half done, OUTPUT
    renamed into place but the parts not yet removed: --resume ends with the complete output."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts(20_000, seed=4))])
    reference = tmp_path / "reference.jsonl"
    assert score(str(source), "--output", str(reference), "--model", str(tiny_package_dir), "-q").returncode == 0
    for name in ("first.jsonl", "second.jsonl"):
        output = tmp_path / name
        args = [str(source), "--output", str(output), "--model", str(tiny_package_dir), "--part-records", "2000", "-q"]
        work = tmp_path / f"{name}.parts"
        _start_and_kill(args, work, parts=2)
        if name == "first.jsonl":
            (work / "part-000000019001-000000019999@1.jsonl.tmp").write_text("half a part")
            (work / "assembled.tmp").write_text("half an output")
            (tmp_path / f"{name}.parts.tmp").mkdir()
        else:
            shutil.copy(reference, output)  # as if killed between the final rename and the clean-up
        resumed = score(*args, "--resume")
        assert resumed.returncode == 0, resumed.stderr
        assert output.read_bytes() == reference.read_bytes() and not work.exists()


def test_resume_refuses_a_different_job(tiny_package_dir, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts(20_000, seed=5))])
    args = [str(source), "--output", str(tmp_path / "out.jsonl"), "--model", str(tiny_package_dir),
            "--part-records", "2000", "-q"]
    _start_and_kill(args, tmp_path / "out.jsonl.parts", parts=1)
    done = score(*args, "--resume", "--min-score", "0.9")
    assert done.returncode == 2 and "min_score differs" in done.stderr
    with open(source, "a", encoding="utf-8") as fh:
        fh.write('{"id": "new", "text": "rain"}\n')
    done = score(*args, "--resume")
    assert done.returncode == 2 and "INPUT changed since" in done.stderr
    assert score(*args, "--overwrite").returncode == 0
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 20_001


@pytest.mark.parametrize("case", ["unknown column", "missing file", "directory", "mixed encodings", "utf-16",
                                  "output exists", "unknown extension", "bad package"])
def test_whole_run_problems_are_one_line_and_write_nothing(tiny_package_dir, tmp_path, case):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "rain"}, {"id": 2, "text": "goal"}])
    output = tmp_path / "out.jsonl"
    model = tiny_package_dir
    extra: list[str] = []
    if case == "unknown column":
        extra = ["--text-column", "body"]
    elif case == "missing file":
        source = tmp_path / "nowhere.jsonl"
    elif case == "directory":
        source = tmp_path / "dir.csv"
        source.mkdir()
    elif case == "mixed encodings":
        source = tmp_path / "mixed.csv"
        source.write_bytes("id,text\n1,Öllache\n".encode() + "2,Ölfleck\n".encode("latin-1"))
    elif case == "utf-16":
        source = tmp_path / "wide.csv"
        source.write_bytes("id,text\n1,rain\n".encode("utf-16"))
    elif case == "output exists":
        output.write_text("keep me")
    elif case == "unknown extension":
        output = tmp_path / "out.txt"
    else:
        model = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
        (model / "fp32.data").write_bytes(b"\0" * (model / "fp32.data").stat().st_size)
        extra = ["--variant", "fp32"]
    done = score(str(source), "--output", str(output), "--model", str(model), *extra)
    assert done.returncode == (4 if case == "bad package" else 2)
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == (
        ["out.jsonl"] if case == "output exists" else [])
    if case == "output exists":
        assert output.read_text() == "keep me"


def test_no_id_column_numbers_the_records_and_processes_give_the_same_answers(tiny_package_dir, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts(5000, seed=6)])
    one = score(str(source), "--output", str(tmp_path / "one.jsonl"), "--model", str(tiny_package_dir), "-q")
    two = score(str(source), "--output", str(tmp_path / "two.jsonl"), "--model", str(tiny_package_dir), "-q",
                "--processes", "2", "--workers", "1")
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    rows = read_jsonl(tmp_path / "one.jsonl")
    assert [r["id"] for r in rows] == list(range(1, 5001)) and read_jsonl(tmp_path / "two.jsonl") == rows


def test_a_damaged_package_in_a_worker_process_is_exit_4_and_nothing_is_written(tiny_package_dir, tmp_path):
    model = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    (model / "int8-u8u8.onnx").write_bytes(b"not a graph")
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "rain"}])
    done = score(str(source), "--output", str(tmp_path / "out.jsonl"), "--model", str(model), "--variant",
                 "int8-u8u8", "--processes", "2")
    assert done.returncode == 4 and "int8-u8u8.onnx" in done.stderr and len(done.stderr.splitlines()) == 1
    assert not list(tmp_path.glob("out*"))


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    import io

    from runtime.score.progress import Progress

    bar, plain = io.StringIO(), io.StringIO()
    for stream, tty in ((bar, True), (plain, False)):
        progress = Progress(1000, stream=stream, tty=tty)
        progress.started -= 10  # ten seconds in
        progress.shown -= 60
        progress.update(250, 400)
        progress.finish()
    assert bar.getvalue().startswith("\r") and "40.0%" in bar.getvalue() and "ETA 15s" in bar.getvalue()
    assert plain.getvalue() == "decide: score:  40.0%  250 records  25/s  ETA 15s\n"


def test_score_modules_import_neither_numpy_nor_ray_nor_pyarrow():
    """The probe-first rule, and Ray/pyarrow stay optional: importing any of it loads none of them."""
    code = ("import sys, runtime.score.job, runtime.score.inputs, runtime.score.long, runtime.score.outputs, "
            "runtime.score.pool, runtime.score.ray_data, runtime.engine.classifier, runtime.score.progress; from runtime import Classifier; "
            "print(sorted(m for m in ('numpy', 'onnxruntime', 'ray', 'pyarrow', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    spec = (REPO / "bundle_spec" / "decide.spec").read_text(encoding="utf-8")
    assert '"ray"' in spec and '"pyarrow"' in spec  # never frozen into the bundle


def long_records() -> list[tuple[str, str]]:
    """Issue 38's records: a 200 KB and a 5 MB text among ordinary ones, quotes and newlines in
    them, and one blank as far as the model reads."""
    report = "Schichtbericht: Hydraulikpumpe 2 verliert Öl, die Lache unter der Presse wächst.\n"
    return [("r1", "Öllache unter der Hydraulikpresse, bitte schnell kommen"),
            ("r2", (report * 3000)[:200_000]),
            ("r3", ("Conveyor belt 4 jammed, material is piling up at the transfer point. " * 80_000)[:5_000_000]),
            ("r4", "temperature back to normal at 45 °C"),
            ("r5", 'Sensor "B12" liefert keine Werte mehr, Kabel prüfen'),
            ("r6", " " * 150_000 + "Motor 3 überhitzt")]


# Broken records after them: an unclosed quote (the rest of the file is not swallowed), an empty
# id, a row with one field: each one error row with its id.
BROKEN_CSV_TAIL = 'r7,"never closed\nr8,Kühlwasser tritt aus der Leitung\n,Leck an Ventil 3\nr10\n'


def write_records(path: Path, records: list[tuple[str, str]], tail: str = "") -> Path:
    """The records as CSV, TSV, JSON lines or Parquet, by extension."""
    if path.suffix in (".csv", ".tsv"):
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t" if path.suffix == ".tsv" else ",", lineterminator="\n")
            writer.writerow(["id", "text"])
            writer.writerows(records)
            fh.write(tail)
    elif path.suffix == ".jsonl":
        write_jsonl(path, [{"id": i, "text": t} for i, t in records])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": [i for i, _ in records], "text": [t for _, t in records]}), path)
    return path


ANSWER_FIELDS = ("label", "leaning", "abstained", "reason", "truncated")


def test_a_200_kb_and_a_5_mb_field_are_answered_with_their_ids_in_every_format(real_model_dir, tmp_path):
    """Issue 38's acceptance: every record answered with its id, the protocol's answer for the
    whole text (truncated), the same in CSV, TSV, JSON lines and Parquet."""
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet or ray extra)")
    records = long_records()
    extra = "Kühlwasser tritt aus der Leitung"
    flags = ("--variant", "fp32")  # batched like alone: the formats' windows differ by the broken rows
    reference = protocol_answers(real_model_dir, [t for _, t in records] + [extra], *flags,
                                 "--max-line-bytes", str(8 << 20))
    expected = {key: reference[i] for i, key in enumerate([k for k, _ in records] + ["r8"])}
    assert [expected[k]["truncated"] for k in ("r1", "r2", "r3", "r6")] == [False, True, True, True]
    for suffix in (".csv", ".tsv", ".jsonl", ".parquet"):
        source = write_records(tmp_path / f"in{suffix}", records, BROKEN_CSV_TAIL if suffix == ".csv" else "")
        output = tmp_path / f"out{suffix}.jsonl"
        done = score(str(source), "--output", str(output), "--model", str(real_model_dir), "-q", *flags)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        rows = read_jsonl(output)
        ids = [k for k, _ in records] + (["r7", "r8", "", "r10"] if suffix == ".csv" else [])
        assert [r["id"] for r in rows] == ids, suffix
        for row in rows:
            if row["id"] in expected:
                want = expected[row["id"]]
                assert [row[f] for f in ANSWER_FIELDS] == [want[f] for f in ANSWER_FIELDS], (suffix, row["id"])
                assert abs(row["score"] - want["score"]) <= 1e-5 and row["error"] is None, (suffix, row["id"])
        if suffix == ".csv":
            assert [r["error"].split(":")[0] for r in rows[6:] if r["error"]] == [
                "invalid_request", "missing_id", "invalid_request"]
            assert "record 7: not CSV: unexpected end of data" in rows[6]["error"]
    assert expected["r1"]["label"] == expected["r2"]["label"] == "leak" and expected["r3"]["leaning"] == "material_jam"


def peak_rss_mib(args: list[str]) -> float:
    """decide score's peak RSS (MiB), measured in a parent of its own (RUSAGE_CHILDREN)."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "runtime", "score", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout) / 1024


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_one_50_mb_record_is_answered_in_bounded_memory(tiny_package_dir, tmp_path, suffix):
    big = ("rain and wind " * 3_600_000)[:50_000_000]
    rss = {}
    for name, text in (("short", "rain and wind"), ("big", big)):
        source = write_records(tmp_path / f"{name}{suffix}", [("a", "goal"), ("b", text), ("c", "server")])
        output = tmp_path / f"out-{name}.jsonl"
        rss[name] = peak_rss_mib([str(source), "--output", str(output), "--model", str(tiny_package_dir), "-q"])
        assert [(r["id"], r["label"], r["truncated"]) for r in read_jsonl(output)] == [
            ("a", "sports", False), ("b", "weather", text is big), ("c", "tech", False)]
    assert rss["big"] - rss["short"] < 25, rss  # the 50 MB text never in memory (the long path keeps 769 characters)
