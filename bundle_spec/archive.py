"""The zip (symlinks kept), its size report and the closing summary."""

from __future__ import annotations

import os
import stat
import time
import zipfile
from pathlib import Path

from bundle_spec.common import REPO
from bundle_spec.root import BuildRoot
from bundle_spec.wheels import VENV


def write_zip(staging: Path, zip_path: Path) -> None:
    """Zip `staging` as a top-level folder, storing symlinks as symlinks (like `zip -y`)."""
    base = staging.parent
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for path in sorted(staging.rglob("*")):
            name = str(path.relative_to(base))
            if path.is_symlink():
                info = zipfile.ZipInfo(name, time.localtime(path.lstat().st_mtime)[:6])
                info.create_system = 3  # unix, so unzip honours the mode bits below
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                archive.writestr(info, os.readlink(path))
            elif path.is_file():
                archive.write(path, name)
            elif path.is_dir() and not any(path.iterdir()):
                archive.write(path, name + "/")


def bundle_part(relative: tuple[str, ...]) -> str:
    """Which part of the bundle a file belongs to, for the size report."""
    if relative[0] != "_internal":
        return relative[0]  # decide (bootloader + Python code), models, platforms, licenses …
    if len(relative) > 2:
        return relative[1] + ("/lib-dynload (stdlib extension modules)" if relative[1].startswith("python3") else "/")
    if ".so" in relative[1]:
        return "shared libraries (libpython, libstdc++, libffi …)"
    return relative[1]


def size_report(bundle: Path) -> dict[str, object]:
    """Unpacked size, the 10 largest files and the size of each part of the bundle."""
    files = [p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink()]
    parts: dict[str, int] = {}
    for path in files:
        part = bundle_part(path.relative_to(bundle).parts)
        parts[part] = parts.get(part, 0) + path.stat().st_size
    largest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:10]
    return {
        "unpacked_bytes": sum(parts.values()),
        "top_files": [[str(p.relative_to(bundle)), p.stat().st_size] for p in largest],
        "parts": dict(sorted(parts.items(), key=lambda item: item[1], reverse=True)),
    }


def installed_versions(root: BuildRoot) -> dict[str, str]:
    """Versions of the packages in the root's venv, from their dist-info folder names."""
    site = next((root.path / VENV.lstrip("/") / "lib").glob("python3*/site-packages"))
    versions = {}
    for dist_info in site.glob("*.dist-info"):
        name, _, version = dist_info.name.removesuffix(".dist-info").partition("-")
        versions[name] = version
    return dict(sorted(versions.items()))


def print_report(manifest: dict[str, object], zip_path: Path) -> None:
    """The closing summary: what each part costs, the largest files, the result line."""
    print("\n      size by part (unpacked):")
    for part, size in manifest["parts"].items():  # type: ignore[union-attr]
        print(f"        {size / 1e6:7.1f} MB  {part}")
    print("      largest files:")
    for name, size in manifest["top_files"]:  # type: ignore[union-attr]
        print(f"        {size / 1e6:7.1f} MB  {name}")
    cpu = manifest["step_cpu_seconds"]
    steps = ", ".join(f"{name} {seconds:.0f}s ({cpu[name]:.0f}s CPU)"  # type: ignore[index]
                      for name, seconds in manifest["step_seconds"].items())  # type: ignore[union-attr]
    print(f"      steps, wall (CPU): {steps}")
    print(f"      unpacked {manifest['unpacked_bytes'] / 1e6:.1f} MB, built in {manifest['build_seconds']:.0f}s\n")
    print(f"{zip_path.relative_to(REPO) if zip_path.is_relative_to(REPO) else zip_path}  "
          f"({manifest['zip_bytes'] / 1e6:.1f} MB)  glibc floor {manifest['glibc_floor']['glibc']}  "  # type: ignore[index]
          f"sha256 {manifest['zip_sha256']}")
