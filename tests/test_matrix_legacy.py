"""Below x86-64-v2 (Core 2 class: qemu Conroe, Penryn): the legacy numeric stack, from source.

Why it exists: numpy 2.4's baseline is x86-64-v2 (SSE4.2 + POPCNT): on Penryn it refuses at
import, on Conroe it dies with SIGILL (test_pinned_numpy_2_cannot_run_below_v2). numpy 1.26.4's
baseline is SSE3, and the pinned onnxruntime 1.32 wheel (built against the numpy 2 ABI, metadata
numpy>=1.21.6) runs with it there, FP32 and int8 alike. So the legacy stack needs no second
onnxruntime (ORT 1.16.3, the other candidate, works too but would add +21 MB zipped).

Decision (issue 5): the `baseline` tier of platforms/x86_64.json uses it (runtime/platform/stack.py); the
frozen bundle ships it in _internal/legacy (build.py, about +17 MB zipped), proven by
tests/test_matrix.py's Conroe cell. Here, from source: `python -m runtime` on emulated Conroe
picks the baseline tier and the legacy numpy by itself, and refuses with exit 3 naming
numpy 1.26.4 when it is not available.

numpy 1.26.4 is fetched with pip into ~/.cache/decide-build/legacy (PyPI only). CI runs the
Conroe cases (about 25 s); DECIDE_MATRIX=full adds Penryn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundle_spec import qemu_user
from runtime.platform.offline import keep_offline
from runtime.platform.stack import ENV_LEGACY_PATH, LEGACY_NUMPY

CACHE = Path.home() / ".cache" / "decide-build" / "legacy"
REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.heavy
FULL = os.environ.get("DECIDE_MATRIX") == "full"
BELOW_V2 = ["Conroe", "Penryn"] if FULL else ["Conroe"]

PROBE = '''\
import json, sys
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer, models, pre_tokenizers
tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
x = np.asarray(json.loads(sys.argv[2]), dtype=np.float32)
out = {"numpy": np.__version__, "ort": ort.__version__, "ids": tok.encode("hello world x").ids}
for name in ("fp32", "int8"):
    session = ort.InferenceSession(f"{sys.argv[1]}/{name}.onnx", providers=["CPUExecutionProvider"])
    out[name] = session.run(None, {"x": x})[0].tolist()
print(json.dumps(out))
'''


def legacy_numpy_dir() -> Path:
    """numpy 1.26.4 installed alone into a cached directory (pip, binary wheel only)."""
    target = CACHE / "np126"
    if not (target / "numpy" / "__init__.py").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
             "--target", str(target), LEGACY_NUMPY],
            check=True, capture_output=True, text=True,
        )
    return target


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """fp32.onnx and int8.onnx (IR 8, opset 17), with the input and the numpy FP32 reference."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((64, 256)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((256, 8)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["p"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = tmp_path_factory.mktemp("legacy-model")
    onnx.save(model, out / "fp32.onnx")
    quantize_dynamic(out / "fp32.onnx", out / "int8.onnx", weight_type=QuantType.QUInt8)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    z = np.maximum(x @ w1, 0) @ w2
    reference = np.exp(z - z.max(axis=1, keepdims=True))
    return out, x, reference / reference.sum(axis=1, keepdims=True)


def run_python(cpu: str, paths: list[Path], args: list[str], extra_env: dict[str, str] | None = None,
               stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run Python with only `paths` importable (-S: no site-packages) on an emulated x86 CPU."""
    try:
        qemu_user.ensure_qemu()
    except qemu_user.EmulationUnavailable as exc:
        pytest.skip(str(exc))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(str(p) for p in paths), **(extra_env or {})}
    keep_offline(env)  # PROBE imports onnxruntime itself, and without HOME its telemetry writes to /root
    # The resolved interpreter: a wrapper script (pyenv shim) would exec it natively.
    argv = [str(Path(sys.executable).resolve()), "-S", *args]
    return qemu_user.run_emulated(argv, "x86_64", cpu, env=env, input=stdin, timeout=900)


def run_stack(cpu: str, paths: list[Path], model: Path, x: np.ndarray) -> subprocess.CompletedProcess:
    """PROBE (numpy + onnxruntime + tokenizers) with only `paths` importable, on an emulated CPU."""
    return run_python(cpu, paths, ["-c", PROBE, str(model), json.dumps(x.tolist())])


def pinned_site_packages() -> Path:
    """Where this interpreter's onnxruntime/tokenizers/numpy 2 live."""
    import onnxruntime

    return Path(onnxruntime.__file__).resolve().parent.parent


@pytest.mark.parametrize("cpu", BELOW_V2)
def test_numpy_126_with_pinned_onnxruntime_runs_below_v2(cpu: str, model_dir) -> None:
    model, x, reference = model_dir
    done = run_stack(cpu, [legacy_numpy_dir(), pinned_site_packages()], model, x)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["numpy"] == "1.26.4"
    assert out["ids"] == [1, 2, 0]
    assert np.abs(np.asarray(out["fp32"]) - reference).max() < 1e-5
    # int8 with unsigned weights (U8U8): same kernels family as the FP32 check, small error.
    assert np.abs(np.asarray(out["int8"]) - reference).max() < 2e-2


@pytest.mark.parametrize("cpu,signature", [("Conroe", "sigill"), ("Penryn", "baseline")][:len(BELOW_V2)])
def test_pinned_numpy_2_cannot_run_below_v2(cpu: str, signature: str, model_dir) -> None:
    """Why the legacy stack exists: today's pins on a Core 2."""
    model, x, _ = model_dir
    done = run_stack(cpu, [pinned_site_packages()], model, x)
    assert done.returncode != 0
    if signature == "sigill":
        assert done.returncode == qemu_user.SIGILL_EXIT
    else:
        assert "X86_V2" in done.stderr


# ----------------------------------------------------------------------------- `python -m runtime`

@pytest.mark.parametrize("cpu", BELOW_V2)
def test_source_run_below_v2_serves_on_the_legacy_numpy(cpu: str, tiny_package_dir: Path) -> None:
    """numpy 2.4 is the installed one; the launcher must put DECIDE_LEGACY_PATH first by itself."""
    paths = [REPO, pinned_site_packages()]
    env = {ENV_LEGACY_PATH: str(legacy_numpy_dir())}
    info = run_python(cpu, paths, ["-m", "runtime", "info", "--json", "--model", str(tiny_package_dir)], env)
    assert info.returncode == 0, info.stderr[-2000:]
    report = json.loads(info.stdout)
    assert report["choice"]["tier"] == "baseline"
    assert (report["numeric_stack"]["name"], report["numeric_stack"]["numpy"]) == ("legacy", "1.26.4")
    requests = '{"id": 1, "text": "rain and snow"}\n{"id": 2, "text": "Pumpe 3: Vibration über Grenzwert"}\n'
    served = run_python(cpu, paths, ["-m", "runtime", "--model", str(tiny_package_dir)], env, stdin=requests)
    assert served.returncode == 0, served.stderr[-2000:]
    answers = [json.loads(line) for line in served.stdout.splitlines()]
    assert [a["label"] for a in answers] == ["weather", "tech"]


def test_source_run_below_v2_without_legacy_numpy_exits_3_naming_it(tiny_package_dir: Path) -> None:
    done = run_python("Conroe", [REPO, pinned_site_packages()], ["-m", "runtime", "--model", str(tiny_package_dir)],
                      stdin='{"id": 1, "text": "hello"}\n')
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and LEGACY_NUMPY in lines[0]
