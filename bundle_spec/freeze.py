"""PyInstaller onedir inside the root (it must run the target's Python), then strip."""

from __future__ import annotations

import shutil
from pathlib import Path

from bundle_spec import elf
from bundle_spec.common import REPO, note, run
from bundle_spec.root import BuildRoot
from bundle_spec.wheels import VENV


def freeze(root: BuildRoot, logs: Path, nice: int) -> Path:
    """Run PyInstaller on bundle_spec/decide.spec inside the root; returns the onedir (in the root)."""
    src = root.path / "build" / "src"
    shutil.rmtree(src, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("runtime", "bundle_spec"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for leftover in ("dist", "work"):
        shutil.rmtree(root.path / "build" / leftover, ignore_errors=True)
    with root.mounted():
        root.chroot([f"{VENV}/bin/python", "-m", "PyInstaller", "--noconfirm", "--clean",
                     "--distpath", "/build/dist", "--workpath", "/build/work",
                     "/build/src/bundle_spec/decide.spec"], logs / "pyinstaller.log", nice)
    onedir = root.path / "build" / "dist" / "decide"
    strip_binaries(root, onedir, logs / "strip.log", nice)
    return onedir


def strip_binaries(root: BuildRoot, onedir: Path, log: Path, nice: int) -> None:
    """strip --strip-unneeded the libraries that still carry symbols.

    Not PyInstaller's --strip: it also strips auditwheel's vendored libraries (`<pkg>.libs/`,
    rewritten by patchelf), and numpy's OpenBLAS then fails to load ("ELF load command
    address/offset not properly aligned"). The executable itself is skipped too: PyInstaller
    appends its archive to it. Another arch's files are stripped by the host's cross binutils
    (no emulation), the host's arch's by the root's own strip.
    """
    candidates = [p for p in sorted(onedir.rglob("*"))
                  if p.is_file() and not p.is_symlink() and p != onedir / "decide"
                  and not any(part.endswith(".libs") for part in p.relative_to(onedir).parts)
                  and elf.has_symbol_table(p)]
    if not candidates:
        note("nothing to strip")
        return
    before = sum(p.stat().st_size for p in candidates)
    if root.emulated:
        run(["nice", "-n", str(nice), f"{root.arch.triplet}-strip", "--strip-unneeded", *map(str, candidates)],
            log=log)
    else:
        root.chroot(["strip", "--strip-unneeded", *(f"/{p.relative_to(root.path)}" for p in candidates)],
                    log, nice)
    saved = before - sum(p.stat().st_size for p in candidates)
    note(f"stripped {len(candidates)} libraries: -{saved / 1e6:.1f} MB "
         f"({', '.join(p.name for p in candidates[:4])}{' …' if len(candidates) > 4 else ''})")
