"""The one ELF reader of the build and the tests: header, needed symbol versions, symbol table.

Standard library on purpose (pyelftools was the alternative): build.py runs from a fresh clone
with nothing but python3, and qemu_user's namespace helper runs by path before any install. Only
what the bundle holds is read: 64-bit little-endian ELF (x86_64, aarch64); checked against
`readelf` in tests/test_bundle_tools.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

ET_EXEC, ET_DYN = 2, 3
SHT_SYMTAB = 2
SHT_GNU_VERNEED = 0x6FFFFFFE
MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}
Section = tuple[int, int, int, int, int, int, int, int, int, int]  # Elf64_Shdr fields


class NotElf64(ValueError):
    """An ELF file this reader does not handle (32-bit or big-endian)."""


@dataclass(frozen=True)
class ElfInfo:
    """What binfmt_misc and the arch checks look at: the architecture and the ELF type."""

    arch: str  # "x86_64", "aarch64" or "other"
    elf_type: int  # ET_EXEC or ET_DYN (PIE executables and shared libraries)


def read_elf_info(path: Path) -> ElfInfo | None:
    """Architecture and ELF type from the header, or None if the file is not ELF64-LE."""
    with open(path, "rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[:6] != b"\x7fELF\x02\x01":
        return None
    elf_type, machine = struct.unpack_from("<HH", head, 16)
    return ElfInfo(arch=MACHINES.get(machine, "other"), elf_type=elf_type)


def _sections(path: Path) -> tuple[bytes, list[Section]] | None:
    """File bytes and section headers; None if not ELF, NotElf64 if not 64-bit little-endian."""
    with open(path, "rb") as fh:
        if fh.read(4) != b"\x7fELF":
            return None
        data = b"\x7fELF" + fh.read()
    if data[4] != 2 or data[5] != 1:
        raise NotElf64(f"{path}: not a 64-bit little-endian ELF")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return data, [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def needed_versions(path: Path) -> set[str] | None:
    """Symbol versions an ELF file needs (GLIBC_2.28, GLIBCXX_3.4.22 …); None if not ELF.

    Walks the .gnu.version_r section (Elf64_Verneed entries and their Elf64_Vernaux names).
    """
    elf = _sections(path)
    if elf is None:
        return None
    data, sections = elf
    needed: set[str] = set()
    for _name, kind, _flags, _addr, offset, _size, link, count, _align, _entsize in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strings = sections[link][4]
        entry = offset
        for _ in range(count):
            _version, aux_count, _file, aux, next_entry = struct.unpack_from("<HHIII", data, entry)
            aux_at = entry + aux
            for _ in range(aux_count):
                _hash, _aux_flags, _other, name, next_aux = struct.unpack_from("<IHHII", data, aux_at)
                end = data.index(b"\0", strings + name)
                needed.add(data[strings + name:end].decode())
                aux_at += next_aux
            entry += next_entry
    return needed


def has_symbol_table(path: Path) -> bool:
    """True for an ELF file that still carries a full symbol table (i.e. not stripped)."""
    elf = _sections(path)
    return elf is not None and any(section[1] == SHT_SYMTAB for section in elf[1])
