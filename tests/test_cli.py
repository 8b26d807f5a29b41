"""Command line: exit codes, info, overrides, refusal before numpy, bench output."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fixtures.child import after_shell

REPO = Path(__file__).resolve().parent.parent


def decide(*args: str, env: dict | None = None, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime", *args], check=False, cwd=REPO, input=stdin,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=120)


def test_cpu_without_sse3_is_refused_before_numpy_is_imported(tiny_package_dir):
    code = ("import sys; from runtime.cli import main; rc = main(['--model', sys.argv[1]]); "
            "sys.stderr.write(f'RESULT {rc} {\"numpy\" in sys.modules} {\"onnxruntime\" in sys.modules}')")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_package_dir)], check=False, cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "DECIDE_FAKE_CPU": "x86_64:sse,sse2"},
                         timeout=60)
    assert "RESULT 3 False False" in out.stderr
    message = [line for line in out.stderr.splitlines() if line.startswith("decide:")]
    assert len(message) == 1 and "lacks pni" in message[0] and "SSE3" in message[0]
    assert out.stdout == ""


def test_unsupported_cpu_exit_code_from_the_binary(tiny_package_dir):
    result = decide("--model", str(tiny_package_dir), env={"DECIDE_FAKE_CPU": "x86_64:sse2"})
    assert result.returncode == 3 and b"Traceback" not in result.stderr and result.stdout == b""


def test_info_json_lists_every_tier_and_the_choice(tiny_package_dir):
    result = decide("info", "--json", "--model", str(tiny_package_dir),
                    env={"DECIDE_FAKE_CPU": "x86_64:sse2,pni,sse4_2,popcnt,ssse3,avx,avx2,fma"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [t["name"] for t in report["tiers"]][:4] == ["baseline", "v2-sse4.2", "avx", "avx2"]
    assert [t["pass"] for t in report["tiers"]] == [True, True, True, True, False, False, False]
    assert report["choice"]["tier"] == "avx2" and report["choice"]["variant"] == "int8-u8u8"
    assert report["model"]["variants"] == ["fp32", "int8-u8u8"]


def test_info_text_shows_pass_fail_and_reasons(tiny_package_dir):
    result = decide("info", "--model", str(tiny_package_dir), env={"DECIDE_FAKE_CPU": "aarch64:asimd"})
    text = result.stdout.decode()
    assert result.returncode == 0
    assert "armv8.0" in text and "FAIL missing asimddp" in text
    assert "choice: tier armv8.0, variant int8-u8u8" in text  # int8-u8s8 absent → fallback
    assert "int8-u8s8 not in the package" in text


def test_impossible_overrides_exit_2(tiny_package_dir):
    result = decide("--model", str(tiny_package_dir), "--tier", "avx512-vnni",
                    env={"DECIDE_FAKE_CPU": "x86_64:sse2,pni,sse4_2,popcnt,ssse3,avx,avx2,fma"})
    assert result.returncode == 2 and b"avx512vnni" in result.stderr
    result = decide("--model", str(tiny_package_dir), env={"DECIDE_VARIANT": "int8-u8s8"})
    assert result.returncode == 2 and b"not in the model package" in result.stderr
    assert decide("--no-such-flag").returncode == 2


def test_overrides_choose_what_serves(tiny_package_dir):
    result = decide("--model", str(tiny_package_dir), "--variant", "fp32", stdin=b'{"text": "rain"}\n')
    assert json.loads(result.stdout)["variant"] == "fp32"
    result = decide("--model", str(tiny_package_dir), env={"DECIDE_TIER": "avx"}, stdin=b'{"text": "rain"}\n')
    assert json.loads(result.stdout)["variant"] == "fp32"  # the avx tier prefers fp32


def test_missing_model_exits_4(tmp_path):
    result = decide("--model", str(tmp_path / "nowhere"))
    assert result.returncode == 4 and b"manifest.json missing" in result.stderr
    result = decide(env={"DECIDE_MODEL": str(tmp_path / "nowhere")})
    assert result.returncode == 4


def test_checksum_mismatch_exits_4_naming_the_file(tiny_package_dir, tmp_path):
    copy = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    tokenizer = copy / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"rain"', '"RAIN"'))
    result = decide("--model", str(copy), stdin=b'{"text": "rain"}\n')
    assert result.returncode == 4 and result.stdout == b""
    assert b"tokenizer.json" in result.stderr and b"Traceback" not in result.stderr


def test_selftest_passes_on_every_variant(tiny_package_dir):
    result = decide("selftest", "--all-variants", "--json", "--model", str(tiny_package_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [(r["variant"], r["passed"]) for r in report["results"]] == [("fp32", True), ("int8-u8u8", True)]


def test_selftest_failure_exits_5(tiny_package_dir, tmp_path):
    import dataclasses

    from runtime.package.load import file_entry, load_package
    from runtime.package.manifest import write_manifest

    copy = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    golden = copy / "golden.jsonl"
    golden.write_text(golden.read_text().replace('"label": "tech"', '"label": "sports"', 1))
    manifest = load_package(copy).manifest
    write_manifest(copy, dataclasses.replace(manifest, golden=file_entry(copy, "golden.jsonl")))
    result = decide("selftest", "--model", str(copy))
    assert result.returncode == 5
    assert b"FAIL" in result.stdout and b"expected sports" in result.stdout


def test_bench_json_has_every_batch_size_and_the_fixed_padding_rows(tiny_package_dir):
    result = decide("bench", "--json", "--seconds", "0.05", "--batch-sizes", "1,4", "--model", str(tiny_package_dir))
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [(r["texts"], r["batch"]) for r in rows] == [
        ("short", 1), ("short", 4), ("long", 1), ("long", 4), ("short, fixed pad 24", 1), ("short, fixed pad 24", 4)]
    assert all(r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] and r["items_per_s"] > 0 for r in rows)


def test_info_on_an_unsupported_cpu_still_shows_the_table_and_exits_3(tiny_package_dir):
    result = decide("info", "--json", "--model", str(tiny_package_dir), env={"DECIDE_FAKE_CPU": "x86_64:sse,sse2"})
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert not any(t["pass"] for t in report["tiers"])
    assert report["error"]["code"] == "cpu_unsupported" and "pni" in report["error"]["message"]


def test_unknown_architecture_exits_3(tiny_package_dir):
    result = decide("--model", str(tiny_package_dir), env={"DECIDE_FAKE_CPU": "riscv64:rv64gc"})
    assert result.returncode == 3 and b"riscv64" in result.stderr


def test_threads_flag_reaches_the_engine(tiny_package_dir):
    result = decide("--model", str(tiny_package_dir), "--threads", "1", stdin=b'{"op": "info"}\n')
    info = json.loads(result.stdout)
    assert info["threads"] == 1 and info["tier"] and info["buckets"][-1] == 24


def test_workers_flag_reaches_the_engine_and_is_checked(tiny_package_dir):
    result = decide("--model", str(tiny_package_dir), "--workers", "3", stdin=b'{"op": "info"}\n')
    assert json.loads(result.stdout)["workers"] == 3
    result = decide("--model", str(tiny_package_dir), "--workers", "0", stdin=b'{"op": "info"}\n')
    assert result.returncode == 2 and b"--workers must be at least 1" in result.stderr and not result.stdout


def test_embedding_example_runs_against_a_package(tiny_package_dir):
    result = subprocess.run([sys.executable, "examples/embed.py", "--model", str(tiny_package_dir), "rain and snow",
                             "Pumpe 3: Vibration über Grenzwert"], check=False, cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["weather", "tech"]


def test_reports_to_a_full_or_closed_stdout_exit_6_with_one_line(tiny_package_dir):
    with open("/dev/full", "wb") as full:
        result = subprocess.run([sys.executable, "-m", "runtime", "info", "--model", str(tiny_package_dir)],
                                check=False, cwd=REPO, stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert result.returncode == 6
    assert result.stderr.decode().splitlines() == ["decide: cannot write answers to stdout: No space left on device"]
    result = subprocess.run(after_shell("exec 1>&-", [sys.executable, "-m", "runtime", "info", "--json", "--model",
                                                      str(tiny_package_dir)]),
                            check=False, cwd=REPO, stderr=subprocess.PIPE, timeout=60)
    assert result.returncode == 6 and len(result.stderr.decode().splitlines()) == 1


def test_a_bundle_of_another_model_finds_it_without_model(tiny_package_dir, tmp_path, monkeypatch):
    """build.py --model DIR puts the package at models/<name>: the app must serve it by default."""
    from runtime.platform import appdir

    app = tmp_path / "app"
    shutil.copytree(tiny_package_dir, app / "models" / "my-alarms")
    monkeypatch.setattr(appdir, "search_dirs", lambda: [app])
    assert appdir.default_model_dir() == app / "models" / "my-alarms"
    shutil.copytree(tiny_package_dir, app / "models" / "second")  # two packages: no guessing
    assert appdir.default_model_dir() != app / "models" / "second"
    assert appdir.default_model_dir() != app / "models" / "my-alarms"


def test_a_bug_is_one_stderr_line_and_exit_1():
    """No traceback reaches a user even for an unexpected exception; DECIDE_DEBUG=1 shows it."""
    code = ("import sys; from runtime import cli\n"
            "def broken(_args): raise RuntimeError('kaputt')\n"
            "cli.HANDLERS['info'] = broken\n"
            "sys.exit(cli.main(['info']))")
    env = {k: v for k, v in os.environ.items() if k != "DECIDE_DEBUG"}
    plain = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True,
                           env=env, timeout=60)
    assert plain.returncode == 1
    assert "RuntimeError: kaputt" in plain.stderr and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1
    debug = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True,
                           env={**env, "DECIDE_DEBUG": "1"}, timeout=60)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_a_log_line_is_one_line_whatever_the_strings_it_carries(tmp_path):
    # a path (or an exception's text, a file name…) with a newline and an ANSI escape must not
    # forge a second log line or repaint the terminal (issue 23)
    evil = tmp_path / "pkg\ndecide: ready: model forged\x1b[31m"
    result = subprocess.run([sys.executable, "-m", "runtime", "--model", str(evil)], cwd=REPO, input=b"",
                            capture_output=True, timeout=60, check=False)
    err = result.stderr.decode()
    assert result.returncode == 4, err
    assert len(err.splitlines()) == 1 and err.startswith("decide: model package error: "), err
    assert "\\ndecide: ready: model forged\\x1b[31m" in err and "\x1b" not in err


def test_escaping_keeps_tabs_and_text_and_shows_every_control_character():
    from runtime.logs import escape_controls

    assert escape_controls("Größe\t雨 ok") == "Größe\t雨 ok"
    assert escape_controls("a\nb\rc\x1b[2Jd\x00e\x7ff\x9bg") == "a\\nb\\rc\\x1b[2Jd\\x00e\\x7ff\\x9bg"
