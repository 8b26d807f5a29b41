"""Signed packages: minisign's file formats, the trusted keys, and the check of a package's signature.

A package is signed by signing its manifest.json (which lists every file's size and sha256):
`python -m models sign PACKAGE --key KEY` writes `manifest.json.minisig` next to it, in the format
of minisign (https://jedisct1.github.io/minisign/), so the stock tool checks it too:

    minisign -Vm PACKAGE/manifest.json -p KEY.pub        # finds manifest.json.minisig by itself

    untrusted comment: <free text, not covered by anything>
    base64("ED" | key id (8 bytes) | Ed25519(BLAKE2b-512(manifest.json)))
    trusted comment: timestamp:<unix time>\tfile:manifest.json\tpackage:<name> <version>
    base64(Ed25519(the signature above | the trusted comment))

A public key is `untrusted comment: …` + base64("Ed" | key id | 32-byte Ed25519 key). The key id
is shown as minisign shows it: 16 hex digits of the 8 bytes read as a little-endian number.

Trusted keys (`TrustedKeys.configured`): every `--trust-key FILE`, every file or directory in
$DECIDE_TRUST_KEYS (separated by ':'), and `trusted-keys/` next to the binary (the repository root
from source); a directory contributes its `*.pub` files. When at least one key is configured, a
package must carry a signature by one of them that matches its manifest, or it is refused
(PackageError: exit 4 at start, a failed reload while serving). With none configured, a
signature is shown by `info` as unverified and nothing is enforced.

Stdlib only (checked before the CPU probe); Ed25519 itself is runtime/package/ed25519.py.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.package import ed25519
from runtime.package.manifest import MANIFEST_NAME, PackageError
from runtime.platform.appdir import app_dir
from runtime.platform.safefile import FileRefused, open_dir, read_inside

SIGNATURE_NAME = MANIFEST_NAME + ".minisig"  # minisign's default name for manifest.json's signature
ENV_TRUST_KEYS = "DECIDE_TRUST_KEYS"
TRUSTED_KEYS_DIR = "trusted-keys"
UNTRUSTED_PREFIX = "untrusted comment: "
TRUSTED_PREFIX = "trusted comment: "
KEY_ALGORITHM = b"Ed"
HASHED, LEGACY = b"ED", b"Ed"  # signature over BLAKE2b-512(file) / over the file itself
KEY_ID_BYTES = 8
MAX_SIGNATURE_BYTES = 16 << 10  # minisign caps a trusted comment at 8 KiB
MAX_KEY_FILE_BYTES = 4 << 10
MAX_KEYS_PER_DIR = 256
MAX_COMMENT_CHARS = 1000  # what `info` shows of a trusted comment


class TrustError(Exception):
    """A trusted-key file or directory that cannot be used (a configuration error: exit 2)."""


@dataclass(frozen=True)
class PublicKey:
    """One Ed25519 public key in minisign's format, and where it was read from."""

    key_id: bytes
    key: bytes
    source: str = ""

    @property
    def key_id_hex(self) -> str:
        return key_id_hex(self.key_id)


@dataclass(frozen=True)
class Signature:
    """A parsed minisign signature file."""

    algorithm: bytes  # HASHED or LEGACY
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes
    untrusted_comment: str = ""


@dataclass(frozen=True)
class Signer:
    """Who signed the package being served, for `info`."""

    key_id: str
    trusted_comment: str
    verified: bool  # False: no trusted key is configured, so nothing was checked
    key_source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "trusted_comment": self.trusted_comment[:MAX_COMMENT_CHARS],
                "verified": self.verified, **({"key": self.key_source} if self.key_source else {})}


def describe_signature(signature: dict[str, Any] | None) -> str:
    """One line about who signed a package, from `Signer.to_json()` (None: unsigned)."""
    if signature is None:
        return "none (unsigned)"
    checked = (f"verified with {signature.get('key', 'a trusted key')}" if signature["verified"]
               else "NOT verified (no trusted key configured)")
    return f"key {signature['key_id']}, {checked}; trusted comment: {signature['trusted_comment']}"


def key_id_hex(key_id: bytes) -> str:
    """The key id as minisign prints it (%016X of the little-endian 64-bit number)."""
    return f"{int.from_bytes(key_id, 'little'):016X}"


def _b64(text: str, size: int, what: str) -> bytes:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None
    if len(data) != size:
        raise ValueError(f"{what} has {len(data)} bytes, expected {size} (truncated or not minisign's format?)")
    return data


def _printable(text: str) -> bool:
    """minisign's rule for a trusted comment: no control character but tab."""
    return all(c == "\t" or not (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F) for c in text)


def parse_public_key(text: str, where: str = "public key") -> PublicKey:
    """A minisign public key file (comment line + base64 line) or the bare base64 line (`-P`)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith(UNTRUSTED_PREFIX.strip()):
        lines = lines[1:]
    if len(lines) != 1:
        raise ValueError(f"{where}: not a minisign public key (expected one base64 line after the comment)")
    data = _b64(lines[0], 2 + KEY_ID_BYTES + ed25519.PUBLIC_KEY_BYTES, f"{where}: the key")
    if data[:2] != KEY_ALGORITHM:
        raise ValueError(f"{where}: unsupported key algorithm {data[:2]!r} (minisign keys are Ed25519, 'Ed')")
    return PublicKey(key_id=data[2:2 + KEY_ID_BYTES], key=data[2 + KEY_ID_BYTES:], source=where)


def format_public_key(key: PublicKey) -> str:
    """The public key file's text, as `minisign -G` writes it."""
    body = base64.b64encode(KEY_ALGORITHM + key.key_id + key.key).decode("ascii")
    return f"{UNTRUSTED_PREFIX}minisign public key {key.key_id_hex}\n{body}\n"


def parse_signature(data: bytes, where: str = SIGNATURE_NAME) -> Signature:
    """A minisign signature file (4 lines); ValueError says what is wrong with it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8 text (not a minisign signature)") from None
    lines = text.split("\n")
    lines = [line.removesuffix("\r") for line in (lines[:-1] if lines[-1] == "" else lines)]
    if len(lines) != 4:
        raise ValueError(f"{where}: {len(lines)} lines, a minisign signature has 4 (truncated?)")
    untrusted, body, trusted, global_body = lines
    if not untrusted.startswith(UNTRUSTED_PREFIX):
        raise ValueError(f"{where}: line 1 must start with {UNTRUSTED_PREFIX.strip()!r}")
    if not trusted.startswith(TRUSTED_PREFIX):
        raise ValueError(f"{where}: line 3 must start with {TRUSTED_PREFIX.strip()!r}")
    comment = trusted[len(TRUSTED_PREFIX):]
    if not _printable(comment):
        raise ValueError(f"{where}: the trusted comment holds control characters")
    raw = _b64(body, 2 + KEY_ID_BYTES + ed25519.SIGNATURE_BYTES, f"{where}: line 2 (the signature)")
    if raw[:2] not in (HASHED, LEGACY):
        raise ValueError(f"{where}: unsupported signature algorithm {raw[:2]!r}")
    return Signature(algorithm=raw[:2], key_id=raw[2:2 + KEY_ID_BYTES], signature=raw[2 + KEY_ID_BYTES:],
                     trusted_comment=comment,
                     global_signature=_b64(global_body, ed25519.SIGNATURE_BYTES, f"{where}: line 4 (the comment's signature)"),
                     untrusted_comment=untrusted[len(UNTRUSTED_PREFIX):])


def format_signature(signature: Signature) -> str:
    """The signature file's text, as `minisign -S` writes it."""
    body = base64.b64encode(signature.algorithm + signature.key_id + signature.signature).decode("ascii")
    return (f"{UNTRUSTED_PREFIX}{signature.untrusted_comment}\n{body}\n{TRUSTED_PREFIX}{signature.trusted_comment}\n"
            f"{base64.b64encode(signature.global_signature).decode('ascii')}\n")


def signed_message(content: bytes, algorithm: bytes = HASHED) -> bytes:
    """What the first Ed25519 signature covers: BLAKE2b-512 of the file ("ED"), or the file ("Ed")."""
    return hashlib.blake2b(content, digest_size=64).digest() if algorithm == HASHED else content


def comment_message(signature: Signature) -> bytes:
    """What the second signature covers: the first signature, then the trusted comment's bytes."""
    return signature.signature + signature.trusted_comment.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Trusted keys


def _read_key_file(path: Path) -> PublicKey:
    """One public key file (a regular file, not through a symlink at its last step, capped)."""
    try:
        dir_fd = open_dir(path.parent if str(path.parent) else Path("."))
        try:
            data = read_inside(dir_fd, path.name, MAX_KEY_FILE_BYTES, "public key file")
        finally:
            os.close(dir_fd)
        return parse_public_key(data.decode("utf-8"), str(path))
    except FileNotFoundError:
        raise TrustError(f"trusted key {path}: no such file") from None
    except FileRefused as exc:
        raise TrustError(f"trusted key {path.parent}/{exc}") from None
    except OSError as exc:
        raise TrustError(f"trusted key {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TrustError(f"trusted key {path}: not text (not a minisign public key)") from None
    except ValueError as exc:  # parse_public_key's message names the file
        raise TrustError(f"trusted key {exc}") from None


def _keys_in(path: Path, must_exist: bool) -> list[PublicKey]:
    """The key of a file, or the `*.pub` keys of a directory."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if must_exist:
            raise TrustError(f"trusted key {path}: no such file or directory") from None
        return []
    except OSError as exc:
        raise TrustError(f"trusted key {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(mode):
        return [_read_key_file(path)]
    names = sorted(name for name in os.listdir(path) if name.endswith(".pub"))
    if len(names) > MAX_KEYS_PER_DIR:
        raise TrustError(f"trusted keys {path}: more than {MAX_KEYS_PER_DIR} *.pub files")
    return [_read_key_file(path / name) for name in names]


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a package may be signed with; empty = signatures are not enforced."""

    keys: tuple[PublicKey, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def enforced(self) -> bool:
        return bool(self.keys)

    @classmethod
    def configured(cls, files: Iterable[Path | str] = (), environ: Mapping[str, str] | None = None,
                   app: Path | None = None) -> TrustedKeys:
        """--trust-key files, $DECIDE_TRUST_KEYS entries, then trusted-keys/ next to the app.
        A named file or directory must exist and hold valid keys (TrustError otherwise); the
        trusted-keys/ directory may be absent."""
        environ = os.environ if environ is None else environ
        named = [Path(f) for f in files]
        named += [Path(entry) for entry in environ.get(ENV_TRUST_KEYS, "").split(os.pathsep) if entry]
        keys: list[PublicKey] = []
        sources: list[str] = []
        for path in named:
            found = _keys_in(path, must_exist=True)
            if not found:
                raise TrustError(f"trusted keys {path}: the directory holds no *.pub file")
            keys += found
            sources.append(str(path))
        default_dir = (app or app_dir()) / TRUSTED_KEYS_DIR
        found = _keys_in(default_dir, must_exist=False)
        if found:
            keys += found
            sources.append(str(default_dir))
        return cls(tuple(keys), tuple(sources))

    def describe(self) -> str:
        return ", ".join(sorted({key.key_id_hex for key in self.keys})) or "none"

    def to_json(self) -> dict[str, Any]:
        return {"enforced": self.enforced, "keys": [{"key_id": k.key_id_hex, "file": k.source} for k in self.keys]}


# ---------------------------------------------------------------------------------------------
# The check


def check_signature(root: Path, manifest: bytes, signature_file: bytes | None,
                    trusted: TrustedKeys) -> Signer | None:
    """Who signed this manifest. With trusted keys: a trusted key's valid signature, or
    PackageError naming the file and the reason. Without: the signature as it claims to be
    (unverified), None when there is none or it does not parse."""
    sig_path, manifest_path = root / SIGNATURE_NAME, root / MANIFEST_NAME
    if signature_file is None:
        if trusted.enforced:
            raise PackageError(f"{manifest_path}: the package is not signed (no {SIGNATURE_NAME}) and trusted keys "
                               f"are configured ({trusted.describe()}); sign it with `python -m models sign`")
        return None
    try:
        signature = parse_signature(signature_file, str(sig_path))
    except ValueError as exc:
        if trusted.enforced:
            raise PackageError(f"{exc}; the package is refused") from None
        return None
    claimed = key_id_hex(signature.key_id)
    if not trusted.enforced:
        return Signer(claimed, signature.trusted_comment, verified=False)
    candidates = [key for key in trusted.keys if key.key_id == signature.key_id]
    if not candidates:
        raise PackageError(f"{sig_path}: signed by key {claimed}, which is not trusted "
                           f"(trusted: {trusted.describe()})")
    message = signed_message(manifest, signature.algorithm)
    for key in candidates:
        if not ed25519.verify(key.key, message, signature.signature):
            continue
        if not ed25519.verify(key.key, comment_message(signature), signature.global_signature):
            raise PackageError(f"{sig_path}: the trusted comment was changed after signing (its signature by key "
                               f"{claimed} does not match)")
        return Signer(claimed, signature.trusted_comment, verified=True, key_source=key.source)
    raise PackageError(f"{sig_path}: the signature by key {claimed} does not match {manifest_path} (the manifest "
                       "was changed after signing, or the signature is damaged)")
