"""Checks of the assembled bundle: the glibc floor of every ELF file, and `decide selftest`."""

from __future__ import annotations

import re
from pathlib import Path

from bundle_spec import elf, qemu_user
from bundle_spec.common import run, version_tuple
from bundle_spec.root import BuildRoot


def glibc_floor(bundle: Path) -> dict[str, object]:
    """Highest GLIBC_ / GLIBCXX_ / CXXABI_ version any ELF in the bundle needs, and who needs it."""
    highest: dict[str, tuple[tuple[int, ...], str]] = {}
    elf_count = 0
    for path in sorted(bundle.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        needed = elf.needed_versions(path)
        if needed is None:
            continue
        elf_count += 1
        for symbol_version in needed:
            match = re.fullmatch(r"(GLIBC|GLIBCXX|CXXABI)_([\d.]+)", symbol_version)
            if not match:
                continue  # GLIBC_PRIVATE, library-specific versions (OPENSSL_1_1_0 …)
            family, number = match.group(1), version_tuple(match.group(2))
            if family not in highest or number > highest[family][0]:
                highest[family] = (number, str(path.relative_to(bundle)))
    return {
        "elf_files": elf_count,
        **{family.lower(): ".".join(map(str, number)) for family, (number, _) in highest.items()},
        "set_by": {family.lower(): who for family, (_, who) in highest.items()},
    }


def smoke_test(staging: Path, root: BuildRoot, log: Path) -> None:
    """Run `decide selftest` from the staging folder: the build fails if the frozen app does.

    Emulated: under qemu with the root's glibc (QEMU_LD_PREFIX), on the arch's oldest CPU model.
    """
    command = [str(staging / "decide"), "selftest"]
    if root.emulated:
        command = qemu_user.emulated_command(command, root.arch.name, root.arch.emulated_cpu,
                                             ld_prefix=root.path)
    run(command, log=log)
