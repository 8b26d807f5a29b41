"""The frozen app becomes the bundle: model, platforms, README and licences next to the binary."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bundle_spec.common import PYTHON_PREFIX, REPO, BuildError, note
from bundle_spec.root import BuildRoot
from runtime.package.load import PackageError, load_package, verify_files


def copy_model(model_dir: Path, target: Path) -> dict[str, object]:
    """Copy the files the model manifest names (verified) into target; returns a summary."""
    try:
        package = load_package(model_dir, allow_unlisted=True)  # only the listed files are copied
        manifest = package.manifest
        entries = [manifest.tokenizer, *([manifest.golden] if manifest.golden else [])]
        for variant in manifest.variants.values():
            entries += variant.files()
        verify_files(package, entries)
    except PackageError as exc:
        raise BuildError(f"model package {model_dir}: {exc}") from exc
    precisions = {v.precision for v in manifest.variants.values()}
    if not {"fp32", "int8"} <= precisions:
        raise BuildError(f"model {manifest.name} must carry an fp32 and an int8 variant, has {precisions}")
    target.mkdir(parents=True)
    names = {"manifest.json", *(e.file for e in entries)}
    names |= {p.name for p in model_dir.iterdir() if re.match(r"(LICEN[CS]E|NOTICE|README)", p.name, re.IGNORECASE)}
    for name in sorted(names):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_dir / name, target / name)
        (target / name).chmod(0o644)  # the factory may write 0600 files; the box is read by anyone
    return {
        "name": manifest.name,
        "version": manifest.version,
        "variants": {
            v.name: {"precision": v.precision, "file": v.file.file, "sha256": v.file.sha256,
                     "bytes": sum(f.bytes for f in v.files())}
            for v in manifest.variants.values()
        },
    }


def dpkg_file_owners(root: Path) -> dict[str, str]:
    """Installed path → Debian package, read from dpkg's file lists (what `dpkg -S` searches).

    Read directly rather than by running dpkg in the root: that is an arm64 program in the
    aarch64 root, one qemu start per lookup.
    """
    owners: dict[str, str] = {}
    for listing in sorted((root / "var" / "lib" / "dpkg" / "info").glob("*.list")):
        package = listing.stem.split(":")[0]  # libssl1.1:arm64.list → libssl1.1
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            owners.setdefault(line, package)
    return owners


def collect_licences(root: BuildRoot, bundle: Path, model_dir: Path, log: Path) -> list[str]:
    """Put the licence of everything the bundle ships under bundle/licenses; returns its index."""
    out = bundle / "licenses"
    out.mkdir()
    index: list[str] = []
    python_licence = root.path / PYTHON_PREFIX.lstrip("/") / "lib" / "python3.11" / "LICENSE.txt"
    shutil.copy(python_licence, out / "CPython-LICENSE.txt")
    index.append("CPython-LICENSE.txt: the Python interpreter and standard library")
    site = next((root.path / "build" / "venv" / "lib").glob("python3*/site-packages"))
    for dist_info in sorted(site.glob("*.dist-info")):
        if dist_info.name.startswith(("pip-", "setuptools-", "altgraph-", "packaging-",
                                      "pyinstaller_hooks_contrib-")):
            continue  # build tools: not shipped (PyInstaller's own bootloader licence is kept)
        dist = dist_info.name.removesuffix(".dist-info")
        # RECORD lists every installed file: licence texts may sit in the package folder too
        # (onnxruntime/LICENSE, ThirdPartyNotices.txt) or as an SBOM (tokenizers' Rust crates).
        record = (dist_info / "RECORD").read_text(encoding="utf-8").splitlines()
        names = [line.split(",")[0] for line in record]
        wanted = [site / name for name in names
                  if re.match(r"(LICEN[CS]E|COPYING|NOTICE|ThirdPartyNotices|AUTHORS)", Path(name).name, re.IGNORECASE)
                  or "/sboms/" in name]
        for path in wanted:
            target = out / dist / path.relative_to(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        metadata = (dist_info / "METADATA").read_text(encoding="utf-8", errors="replace")
        declared = re.findall(r"^(License(?:-Expression)?: .*|Classifier: License :: .*)$", metadata, re.MULTILINE)
        (out / dist).mkdir(exist_ok=True)
        (out / dist / "LICENSE-METADATA.txt").write_text("\n".join(declared) + "\n")
        if not any("LICEN" in p.name.upper() for p in wanted) and "Apache" in " ".join(declared):
            # tokenizers' wheel declares Apache-2.0 but carries no text; Apache-2.0 asks for one.
            shutil.copy(root.path / "usr/share/common-licenses/Apache-2.0", out / dist / "LICENSE-Apache-2.0.txt")
        index.append(f"{dist}/: Python package ({'; '.join(declared) or 'see files'}), {len(wanted)} licence files")
    # Shared libraries PyInstaller copied from the Debian root: ship their Debian copyright.
    owners = dpkg_file_owners(root.path)
    packages: set[str] = set()
    for lib in sorted((bundle / "_internal").glob("*.so*")):
        # Merged /usr: dpkg knows a library under the directory its package installed it to.
        for libdir in (f"/lib/{root.arch.triplet}", f"/usr/lib/{root.arch.triplet}"):
            if f"{libdir}/{lib.name}" in owners:
                packages.add(owners[f"{libdir}/{lib.name}"])
                break
    for package in sorted(packages):
        copyright_file = root.path / "usr" / "share" / "doc" / package / "copyright"
        if copyright_file.is_file():
            (out / "debian").mkdir(exist_ok=True)
            shutil.copy(copyright_file, out / "debian" / f"{package}.copyright")
            index.append(f"debian/{package}.copyright: shared library from Debian 11 ({package})")
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("licences:\n" + "\n".join(index) + "\n")
    for path in model_dir.iterdir():
        if re.match(r"(LICEN[CS]E|NOTICE)", path.name, re.IGNORECASE):
            shutil.copy(path, out / f"model-{path.name}")
            index.append(f"model-{path.name}: the embedded model")
    provenance = load_package(model_dir).manifest.provenance  # base model, data sets, their licences
    (out / "model-provenance.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False) + "\n")
    index.append("model-provenance.json: where the embedded model and its training data come from")
    (out / "README.txt").write_text("Licences of what this bundle ships\n\n" + "\n".join(index) + "\n")
    return index


def assemble(onedir: Path, staging: Path, model_dir: Path, root: BuildRoot,
             logs: Path) -> dict[str, object]:
    """Copy the frozen app to `staging` and add models/, platforms/, README and licences."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(onedir, staging, symlinks=True)
    model = copy_model(model_dir, staging / "models" / model_dir.name)
    note(f"model {model['name']} {model['version']}: variants {', '.join(model['variants'])}")
    (staging / "platforms").mkdir()
    for tier_file in sorted((REPO / "platforms").glob("*.json")):
        shutil.copy(tier_file, staging / "platforms" / tier_file.name)
    shutil.copy(REPO / "bundle_spec" / "README.box.md", staging / "README.md")
    index = collect_licences(root, staging, model_dir, logs / "assemble.log")
    note(f"licences: {len(index)} entries in licenses/README.txt")
    return model
