"""The build of the decide bundle, one module per step; `build.py` is its entry point.

    common      paths, targets (Arch), errors, progress output, running commands
    root        the Debian 11 build root (native chroot on x86_64, extracted arm64 root)
    python      CPython 3.11 from Debian's source pool: compiled in the root or cross-compiled,
                then checked (every extension module imports, on the target CPU)
    wheels      the pinned wheels and the build venv (installed natively, no emulation)
    freeze      PyInstaller inside the root, then strip
    assemble    model, platforms, README, licences next to the frozen app
    legacy      the legacy numeric stack (numpy 1.26) for x86_64 CPUs below x86-64-v2
    checks      glibc floor, smoke test
    archive     the zip, its checksum and the build manifest
    source_tree which commit and inputs a zip was built from
    pipeline    the steps in order, command-line options
    elf         the one ELF reader (header, symbol versions, symbol table)
    qemu_user   run programs on an emulated CPU (private binfmt_misc)
    matrix      the frozen bundle on emulated CPU models: cells and table
"""
