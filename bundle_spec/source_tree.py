"""Which tree a zip was built from: the commit and a digest of every input of the bundle.

Tests and the matrix use a zip only when its build manifest names the commit under test and the
same inputs digest; a dirty tree's commit reads `<sha>+dirty`, so its digest tells its states apart.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from bundle_spec.common import REPO


def inputs_digest(model_dir: Path) -> str:
    """sha256 over everything that decides the bundle's content (tests reuse a matching build)."""
    paths = [REPO / "build.py", REPO / "requirements.txt", REPO / "requirements-build.txt",
             model_dir / "manifest.json"]
    for folder, pattern in (("bundle_spec", "*"), ("runtime", "*.py"), ("platforms", "*.json")):
        paths += sorted(p for p in (REPO / folder).rglob(pattern) if p.is_file()
                        and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path).encode())
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    return digest.hexdigest()


def git_commit() -> str:
    """The repository's HEAD commit, with '+dirty' when tracked files differ from it; 'unknown'
    outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)

    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except FileNotFoundError:
        return "unknown"
    if head.returncode != 0 or status.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")
