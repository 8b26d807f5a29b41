"""Command line: `decide [serve]`, `decide info`, `decide selftest`, `decide bench`, `decide score`.

Order matters: arguments → CPU probe → tier choice → numeric stack (runtime.platform.stack: which numpy
goes first on sys.path) → package manifest, all stdlib; only then are numpy/onnxruntime imported
(runtime.engine.engine). A CPU below the baseline tier, or a tier whose numeric stack is missing, is
refused with one line on stderr and EXIT_CPU_UNSUPPORTED before anything could die with
"Illegal instruction".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.engine import classifier
from runtime.engine.classifier import Setup
from runtime.engine.startup import (
    ENV_MODEL,
    ENV_TIER,
    ENV_VARIANT,
    UsageError,
    load_engine,
    model_dir,
    overrides,
    prepare,
)
from runtime.exits import (
    EXIT_CPU_UNSUPPORTED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTPUT_FAILED,
    EXIT_PACKAGE,
    EXIT_SELFTEST_FAILED,
    EXIT_USAGE,
)
from runtime.logs import configure_logging
from runtime.package import signing
from runtime.package.load import PackageError, load_package
from runtime.platform.appdir import DEFAULT_MODEL, find_data_dir
from runtime.platform.cpu import probe
from runtime.platform.stack import LegacyStackMissing, stack_for
from runtime.platform.tiers import (
    CpuUnsupported,
    NoUsableVariant,
    OverrideError,
    PlatformDataError,
    check_tiers,
    load_platform,
    select,
)
from runtime.protocol import DEFAULT_MAX_BATCH, DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_TEXTS
from runtime.serve.framing import OutputFailed
from runtime.version import __version__

COMMANDS = ("serve", "info", "selftest", "bench", "score")
SWAP_COMMANDS = ("reload", "rollback")  # clients of a running socket service (runtime/serve/swapclient.py)
ENV_DEBUG = "DECIDE_DEBUG"

log = logging.getLogger("decide")


def build_parser(command: str) -> argparse.ArgumentParser:
    """The argument parser of one command (shared options + the command's own)."""
    parser = argparse.ArgumentParser(
        prog="decide" if command == "serve" else f"decide {command}",
        description={
            "serve": "Classify JSON lines from stdin to stdout (the default command).",
            "info": "Show the probed CPU, every tier with pass/fail, and the choice.",
            "selftest": "Check the golden examples against each variant's own expected outputs and the FP32 reference on this machine.",
            "bench": "Latency percentiles and throughput per batch size, short and long texts.",
            "score": "Classify a CSV, JSON-lines or Parquet file into a file of answers (resumable).",
        }[command],
        epilog="Commands: serve (default), info, selftest, bench, score, reload, rollback. Exit codes: 0 ok, 1 internal error, "
        "2 usage, 3 CPU unsupported, 4 model package error, 5 selftest failed, 6 output failed.",
    )
    parser.add_argument("--model", type=Path, default=None,
                        help=f"model package directory (env {ENV_MODEL}; default: the embedded package, {DEFAULT_MODEL} from source or models/<name> next to the binary)")
    parser.add_argument("--tier", default=None, help=f"force a CPU tier (env {ENV_TIER})")
    parser.add_argument("--variant", default=None, help=f"force a model variant (env {ENV_VARIANT})")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: usable cores)")
    parser.add_argument("--workers", type=int, default=None,
                        help="batches of one model call run at once (default: usable cores; 1 = one after another)")
    parser.add_argument("--spin", action="store_true",
                        help="let ORT worker threads spin between requests (lower latency, burns CPU)")
    parser.add_argument("--trust-key", action="append", default=[], metavar="FILE",
                        help=f"a minisign public key (or a directory of *.pub) the package must be signed with; "
                             f"repeatable; also ${signing.ENV_TRUST_KEYS} and {signing.TRUSTED_KEYS_DIR}/ next to the binary. "
                             "With any trusted key, unsigned or wrongly signed packages are refused (exit 4)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    parser.add_argument("--version", action="version", version=f"decide {__version__}")
    if command == "serve":
        parser.add_argument("--ready", action="store_true",
                            help='print {"event": "ready", …} as the first line once the model is warm')
        parser.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES,
                            help="longest request line accepted (default 1 MiB)")
        parser.add_argument("--max-texts", type=int, default=DEFAULT_MAX_TEXTS,
                            help="most texts in one {\"texts\": [...]} request")
        parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="most texts per model call")
        parser.add_argument("--min-score", type=float, default=None, metavar="X",
                            help='abstain below this calibrated score: "label": null, "abstained": true, '
                                 "scores kept (default: never abstain; pick X from `python -m models "
                                 "evaluate`'s coverage table)")
        parser.add_argument("--watch", type=Path, default=None, metavar="DIR",
                            help="serve each new complete package that appears in DIR (one subdirectory each), "
                                 "after checking, warming and self-testing it in the background")
        parser.add_argument("--watch-interval", type=float, default=2.0, metavar="SECONDS",
                            help="how often --watch looks (default 2)")
        from runtime.serve import server  # stdlib only, like this module

        server.add_arguments(parser)
    if command == "score":
        from runtime.score import job as score  # stdlib only until it loads the model

        score.add_arguments(parser)
    if command in ("info", "selftest", "bench"):
        parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    if command == "selftest":
        parser.add_argument("--all-variants", action="store_true", help="check every variant in the package")
    if command == "bench":
        parser.add_argument("--batch-sizes", default="1,4,16,32", help="comma-separated batch sizes")
        parser.add_argument("--seconds", type=float, default=2.0, help="time budget per measurement")
    return parser


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """The command name (serve if none given) and its arguments."""
    if argv and argv[0] in (*COMMANDS, *SWAP_COMMANDS):
        return argv[0], argv[1:]
    return "serve", argv


def warm(args: argparse.Namespace) -> Callable[[Setup], Any]:
    """The command's way to make a Setup's warm engine, for the swap's candidates (runtime/candidate.py).
    It looks `load_engine` up when called, so a caller that replaced it (a test's slow loader) is used."""
    return lambda setup: load_engine(setup, args, max_batch=args.max_batch)


def watcher_for(args: argparse.Namespace):
    """The --watch directory's watcher (None without --watch), checked before the model loads."""
    from runtime.package.watch import watcher_for as make

    try:
        return make(args.watch, args.watch_interval)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve JSON lines on stdin/stdout."""
    from runtime.protocol import Limits
    from runtime.serve import server, signals, stdio

    if args.max_line_bytes < 1 or args.max_texts < 1 or args.max_batch < 1:
        raise UsageError("--max-line-bytes, --max-texts and --max-batch must be at least 1")
    if args.min_score is not None and not 0.0 < args.min_score <= 1.0:
        raise UsageError(f"--min-score must be in (0, 1], got {args.min_score}")
    signals.before_serving()  # a HUP or USR1 while the model loads must not end the process
    # Claim stdout before importing numpy/onnxruntime, so nothing they print reaches the wire.
    wire = stdio.protect_stdout(require_stdout=not server.wants_socket(args))
    if server.wants_socket(args):
        return serve_socket(args, wire)
    setup = prepare(args)
    watcher = watcher_for(args)
    from runtime import candidate
    from runtime.serve.service import Service, TransportHooks
    from runtime.serve.swap import Swapper

    limits = Limits(max_line_bytes=args.max_line_bytes, max_texts=args.max_texts)
    service = Service(None, limits, info={"tier": setup.choice.tier.name, "arch": setup.features.arch},
                      min_score=args.min_score)
    swapper = Swapper(service, lambda path: candidate.build(setup, args, warm(args), setup.trusted, path),
                      candidate.initial(setup, warm(args)))
    service.hooks = TransportHooks(info=lambda: {"swap": swapper.to_json()},
                                   stats=lambda: {"swap": swapper.stats_json()})
    engine = swapper.current.engine
    log.info("ready: model %s %s, tier %s, variant %s, %d threads, %d workers, warm-up %.0f ms",
             setup.package.manifest.name, setup.package.manifest.version, setup.choice.tier.name,
             engine.variant.name, setup.threads, setup.workers, engine.warm_up_ms)
    return stdio.serve(service, wire, ready=args.ready, swapper=swapper, watcher=watcher)


def serve_socket(args: argparse.Namespace, wire: int) -> int:
    """`serve --socket PATH | --tcp HOST:PORT`: check and bind first, then load the model inside the
    server (health answers "loading" meanwhile); see runtime/serve/server.py."""
    from runtime import candidate
    from runtime.protocol import Limits
    from runtime.serve import server
    from runtime.serve.service import Service  # stdlib only until an engine is attached

    limits = Limits(max_line_bytes=args.max_line_bytes, max_texts=args.max_texts)
    try:
        config = server.config_from_args(args, limits)
    except server.ListenError as exc:
        raise UsageError(str(exc)) from exc
    setup = prepare(args)
    watcher = watcher_for(args)
    service = Service(None, limits, info={"tier": setup.choice.tier.name, "arch": setup.features.arch},
                      min_score=args.min_score)
    try:
        return server.run(config, service, lambda: candidate.initial(setup, warm(args)),
                          ready_wire=wire if args.ready else None,
                          rebuild=lambda path: candidate.build(setup, args, warm(args), setup.trusted, path),
                          watcher=watcher)
    except server.ListenError as exc:
        raise UsageError(str(exc)) from exc


def info_report(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Everything `info` shows, as JSON, and the exit code it implies."""
    features = probe()
    report: dict[str, Any] = {
        "version": __version__,
        "python": sys.version.split()[0],
        "frozen": bool(getattr(sys, "frozen", False)),
        "cpu": {"arch": features.arch, "usable_cores": features.usable_cores, "cores_source": features.cores_source,
                "source": features.source, "flags": sorted(features.flags)},
    }
    code = EXIT_OK
    try:
        platform = load_platform(find_data_dir("platforms"), features.arch)
    except CpuUnsupported as exc:
        report["error"] = {"code": "cpu_unsupported", "message": str(exc)}
        return report, EXIT_CPU_UNSUPPORTED
    report["tiers"] = [
        {"name": c.tier.name, "pass": c.passed, "missing": list(c.missing), "variants": list(c.tier.variants),
         "note": c.tier.note}
        for c in check_tiers(features, platform)
    ]
    path = model_dir(args)
    variants = None
    trusted = signing.TrustedKeys.configured(getattr(args, "trust_key", ()))
    report["trusted_keys"] = trusted.to_json()
    try:
        package = load_package(path)
        variants = package.manifest.variants.keys()
        report["model"] = {"path": str(path), "name": package.manifest.name,
                           "version": package.manifest.version, "variants": sorted(variants)}
        signer = signing.check_signature(package.root, package.manifest_bytes, package.signature, trusted)
        report["model"]["signature"] = signer.to_json() if signer else None
    except PackageError as exc:
        # Reported, not fatal: info is the diagnostic command and still shows the tier choice.
        report["model"] = {**report.get("model", {}), "path": str(path), "error": str(exc)}
    try:
        choice = select(features, platform, variants, *overrides(args))
        report["choice"] = {"tier": choice.tier.name, "variant": choice.variant, "reasons": list(choice.reasons)}
        report["threads"], report["workers"] = classifier.sizes(features, choice.tier, args.threads, args.workers)
        report["numeric_stack"] = stack_for(choice.tier).to_json()
        if choice.variant is not None:
            report["abstention"] = package.manifest.abstention_policy(choice.variant).to_json()
    except LegacyStackMissing as exc:
        report["error"] = {"code": "legacy_stack_missing", "message": str(exc)}
        code = EXIT_CPU_UNSUPPORTED
    except CpuUnsupported as exc:
        report["error"] = {"code": "cpu_unsupported", "message": str(exc)}
        code = EXIT_CPU_UNSUPPORTED
    except OverrideError as exc:
        report["error"] = {"code": "bad_override", "message": str(exc)}
        code = EXIT_USAGE
    except NoUsableVariant as exc:
        report["error"] = {"code": "no_usable_variant", "message": str(exc)}
    return report, code


def format_info(report: dict[str, Any]) -> str:
    """The human-readable `info` text."""
    cpu = report["cpu"]
    lines = [
        f"decide {report['version']} (python {report['python']}{', frozen' if report['frozen'] else ''})",
        f"cpu: {cpu['arch']}, {cpu['usable_cores']} usable cores from {cpu['cores_source']}, flags from {cpu['source']}",
        "flags: " + " ".join(cpu["flags"]),
    ]
    if "tiers" in report:
        lines.append("tiers (baseline first):")
        for tier in report["tiers"]:
            status = "pass" if tier["pass"] else "FAIL missing " + ", ".join(tier["missing"])
            lines.append(f"  {tier['name']:<12} {status:<40} variants: {', '.join(tier['variants'])}")
    model = report.get("model")
    if model:
        if "error" in model:
            lines.append(f"model: {model['error']}")
        else:
            lines.append(f"model: {model['name']} {model['version']} at {model['path']} "
                         f"(variants: {', '.join(model['variants'])})")
            lines.append(f"signature: {signing.describe_signature(model.get('signature'))}")
    keys = report.get("trusted_keys", {}).get("keys", [])
    lines.append("trusted keys: " + (", ".join(f"{k['key_id']} ({k['file']})" for k in keys) if keys
                                     else "none (signatures are not enforced)"))
    if "choice" in report:
        choice = report["choice"]
        lines.append(f"choice: tier {choice['tier']}, variant {choice['variant'] or '-'}, "
                     f"{report['threads']} threads, {report['workers']} workers")
        lines.extend(f"  - {reason}" for reason in choice["reasons"])
    if "numeric_stack" in report:
        stack = report["numeric_stack"]
        lines.append(f"numeric stack: {stack['name']}, numpy {stack['numpy']} ({stack['reason']})")
    if "abstention" in report:
        policy = report["abstention"]
        novelty = "none" if policy["novelty_threshold"] is None else f"above {policy['novelty_threshold']:g}"
        margin = policy.get("negative_margin") or 0.0
        lines.append(f"abstention: negative labels {', '.join(policy['negative_labels']) or 'none'}"
                     + (f" (when ahead of the best case by more than {margin:g} log-odds)" if margin else "")
                     + f"; unreadable above {policy['max_unknown_share']:g} unknown characters; novelty {novelty}")
    if "error" in report:
        lines.append(f"error: {report['error']['message']}")
    return "\n".join(lines)


def emit(text: str) -> None:
    """Print a line of a command's report; a stdout that cannot take it (full disk, closed)
    raises OutputFailed instead of an OSError traceback."""
    if sys.stdout is None:  # started with fd 1 closed (`>&-`)
        raise OutputFailed("stdout is closed")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFailed(exc.strerror or str(exc)) from exc


def cmd_info(args: argparse.Namespace) -> int:
    """Print the probe, the tier table and the choice."""
    report, code = info_report(args)
    emit(json.dumps(report, indent=2) if args.json else format_info(report))
    return code


def cmd_selftest(args: argparse.Namespace) -> int:
    """Golden set on the chosen variant (or all variants)."""
    setup = prepare(args)  # chooses the numeric stack: runtime.selftest imports numpy
    from runtime.selftest import run_golden

    tier = setup.choice.tier
    names = sorted(setup.package.manifest.variants) if args.all_variants else [setup.choice.variant]
    # A forced --variant is judged too: the user asked for it on this machine.
    served = set(tier.variants) | {setup.choice.variant}
    results = [run_golden(load_engine(setup, args, variant=name), for_this_cpu=name in served) for name in names]
    if args.json:
        emit(json.dumps({"tier": tier.name, "results": [r.to_json() for r in results]}, indent=2))
    else:
        emit(f"selftest on tier {tier.name}, model {setup.package.manifest.name} "
              f"{setup.package.manifest.version}")
        for result in results:
            emit(result.summary())
            if not result.for_this_cpu:
                emit(f"  - tier {tier.name} never serves {result.variant} (it serves {', '.join(tier.variants)})")
                continue
            for problem in result.problems[:10]:
                emit(f"  - {problem}")
    judged = [r for r in results if r.for_this_cpu]
    return EXIT_OK if all(r.passed for r in judged) else EXIT_SELFTEST_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    """Latency/throughput table per batch size for short and long texts."""
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError as exc:
        raise UsageError(f"--batch-sizes: {exc}") from exc
    if not batch_sizes or min(batch_sizes) < 1:
        raise UsageError("--batch-sizes needs positive integers")
    setup = prepare(args)  # chooses the numeric stack: runtime.bench imports numpy
    from runtime.bench import format_table, run_bench

    engine = load_engine(setup, args, max_batch=max(batch_sizes))
    report = run_bench(engine, batch_sizes, args.seconds)
    report["tier"] = setup.choice.tier.name
    emit(json.dumps(report, indent=2) if args.json else format_table(report))
    return EXIT_OK


def cmd_score(args: argparse.Namespace) -> int:
    """File in, file of answers out (runtime/score/job.py)."""
    from runtime.score import job as score

    return score.run(args)


HANDLERS = {"serve": cmd_serve, "info": cmd_info, "selftest": cmd_selftest, "bench": cmd_bench, "score": cmd_score}


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the process exit code (see README)."""
    command, rest = split_command(list(sys.argv[1:] if argv is None else argv))
    if command in SWAP_COMMANDS:
        from runtime.serve import swapclient

        return swapclient.main(command, rest)
    args = build_parser(command).parse_args(rest)  # exits 2 on bad arguments
    configure_logging(args.quiet)
    try:
        return HANDLERS[command](args)
    except LegacyStackMissing as exc:
        log.error("%s", exc)
        return EXIT_CPU_UNSUPPORTED
    except CpuUnsupported as exc:
        log.error("CPU not supported: %s. decide needs x86-64 with SSE3 or ARMv8 NEON.", exc)
        return EXIT_CPU_UNSUPPORTED
    except (OverrideError, UsageError, signing.TrustError) as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    except (PackageError, NoUsableVariant) as exc:
        log.error("model package error: %s", exc)
        return EXIT_PACKAGE
    except PlatformDataError as exc:
        log.error("platform data error: %s", exc)
        return EXIT_PACKAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # e.g. `decide info | head -1`: the reader left; nothing useful to say.
        discard_stdout()
        return EXIT_OK
    except OutputFailed as exc:
        log.error("cannot write answers to stdout: %s", exc)
        discard_stdout()
        return EXIT_OUTPUT_FAILED
    except Exception as exc:  # a bug: one line for the user, the traceback on request
        if os.environ.get(ENV_DEBUG):
            log.exception("internal error")
        else:
            log.error("internal error (a bug in decide, please report it): %s: %s (set %s=1 for the traceback)",
                      type(exc).__name__, exc, ENV_DEBUG)
        return EXIT_INTERNAL


def discard_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of sys.stdout cannot fail again
    and print "Exception ignored" after our one line."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
