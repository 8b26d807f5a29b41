"""`python -m models keygen` and `python -m models sign`: minisign-compatible Ed25519 keys and
package signatures.

    python -m models keygen --key keys/plant.key          # keys/plant.key (secret, 0600) + keys/plant.pub
    python -m models sign models/packages/alarms --key keys/plant.key
    minisign -Vm models/packages/alarms/manifest.json -p keys/plant.pub   # the stock tool agrees

The secret key file is minisign's format without a password (what `minisign -G -W` writes), so
`minisign -S -s keys/plant.key -m FILE` can use it too; keep it off the boxes and readable by you
only. A password-protected minisign key (`minisign -G`) is refused with a message saying how to
strip the password (`minisign -C -s KEY`, empty password). The file formats and the check are
runtime/package/signing.py's, so what is signed here is read by the same code that verifies it.

Signing is Ed25519 through the host's libcrypto (OpenSSL ≥ 1.1.1, via ctypes): hand-written
signing code would leak the secret key through timing; verification (public data only) is
plain Python in runtime/package/ed25519.py, and every signature is verified before it is written.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import ctypes.util
import hashlib
import os
import secrets
import time
from pathlib import Path

from runtime.package import ed25519
from runtime.package.load import load_package, verify_files
from runtime.package.signing import (
    HASHED,
    KEY_ALGORITHM,
    KEY_ID_BYTES,
    SIGNATURE_NAME,
    UNTRUSTED_PREFIX,
    PublicKey,
    Signature,
    comment_message,
    format_public_key,
    format_signature,
    key_id_hex,
    signed_message,
)

NID_ED25519 = 1087
KDF_NONE, KDF_SCRYPT, CHECKSUM_ALGORITHM = b"\0\0", b"Sc", b"B2"
SECRET_KEY_BYTES = 2 + 2 + 2 + 32 + 8 + 8 + KEY_ID_BYTES + 64 + 32  # minisign's SeckeyStruct
MAX_COMMENT_CHARS = 1000


class SigningError(Exception):
    """A key or package that cannot be used for signing (one line, exit 2)."""


class _Libcrypto:
    """The few EVP calls Ed25519 signing needs."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("crypto")
        if name is None:
            raise SigningError("signing needs the host's libcrypto (OpenSSL ≥ 1.1.1); none was found")
        lib = ctypes.CDLL(name)
        lib.EVP_PKEY_new_raw_private_key.restype = ctypes.c_void_p
        lib.EVP_PKEY_new_raw_private_key.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.EVP_PKEY_get_raw_public_key.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
        lib.EVP_PKEY_free.argtypes = [ctypes.c_void_p]
        lib.EVP_MD_CTX_new.restype = ctypes.c_void_p
        lib.EVP_MD_CTX_free.argtypes = [ctypes.c_void_p]
        lib.EVP_DigestSignInit.argtypes = [ctypes.c_void_p] * 5
        lib.EVP_DigestSign.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.c_char_p, ctypes.c_size_t]
        self.lib = lib

    def _key(self, seed: bytes) -> int:
        key = self.lib.EVP_PKEY_new_raw_private_key(NID_ED25519, None, seed, len(seed))
        if not key:
            raise SigningError("libcrypto refused the Ed25519 key (OpenSSL older than 1.1.1?)")
        return key

    def public_key(self, seed: bytes) -> bytes:
        key = self._key(seed)
        try:
            out, size = ctypes.create_string_buffer(32), ctypes.c_size_t(32)
            if self.lib.EVP_PKEY_get_raw_public_key(key, out, ctypes.byref(size)) != 1 or size.value != 32:
                raise SigningError("libcrypto could not derive the Ed25519 public key")
            return out.raw
        finally:
            self.lib.EVP_PKEY_free(key)

    def sign(self, seed: bytes, message: bytes) -> bytes:
        key = self._key(seed)
        context = self.lib.EVP_MD_CTX_new()
        try:
            out, size = ctypes.create_string_buffer(64), ctypes.c_size_t(64)
            if (not context or self.lib.EVP_DigestSignInit(context, None, None, None, key) != 1
                    or self.lib.EVP_DigestSign(context, out, ctypes.byref(size), message, len(message)) != 1):
                raise SigningError("libcrypto failed to make an Ed25519 signature")
            return out.raw
        finally:
            self.lib.EVP_MD_CTX_free(context)
            self.lib.EVP_PKEY_free(key)


def _checksum(key_id: bytes, secret: bytes) -> bytes:
    """minisign's check value of a secret key: BLAKE2b-256("Ed" | key id | secret key)."""
    return hashlib.blake2b(KEY_ALGORITHM + key_id + secret, digest_size=32).digest()


def format_secret_key(key_id: bytes, seed: bytes, public: bytes) -> str:
    """An unencrypted minisign secret key file (as `minisign -G -W` writes it, with its checksum)."""
    secret = seed + public  # libsodium's 64-byte secret key
    body = (KEY_ALGORITHM + KDF_NONE + CHECKSUM_ALGORITHM + bytes(32) + bytes(16) + key_id + secret
            + _checksum(key_id, secret))
    return f"{UNTRUSTED_PREFIX}minisign secret key (no password)\n{base64.b64encode(body).decode('ascii')}\n"


def read_secret_key(path: Path) -> tuple[bytes, bytes, bytes]:
    """(key id, 32-byte seed, public key) of a minisign secret key file without a password."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        data = base64.b64decode(lines[1], validate=True) if len(lines) == 2 else b""
    except FileNotFoundError:
        raise SigningError(f"--key {path}: no such file") from None
    except (OSError, UnicodeDecodeError, binascii.Error, ValueError) as exc:
        raise SigningError(f"--key {path}: not a minisign secret key ({exc})") from None
    if len(data) != SECRET_KEY_BYTES or data[:2] != KEY_ALGORITHM or data[4:6] != CHECKSUM_ALGORITHM:
        raise SigningError(f"--key {path}: not a minisign Ed25519 secret key (wrong size or algorithm)")
    if data[2:4] == KDF_SCRYPT:
        raise SigningError(f"--key {path}: the key is password-protected; make a copy without the password "
                           "with `minisign -C -s COPY` (empty password) or create one with `python -m models keygen`")
    if data[2:4] != KDF_NONE:
        raise SigningError(f"--key {path}: unknown key derivation {data[2:4]!r}")
    key_id, secret, check = data[54:62], data[62:126], data[126:158]
    if check != bytes(32) and check != _checksum(key_id, secret):  # minisign -W leaves it zero
        raise SigningError(f"--key {path}: the key's checksum does not match (damaged file)")
    seed, public = secret[:32], secret[32:]
    if _Libcrypto().public_key(seed) != public:
        raise SigningError(f"--key {path}: the secret and public halves do not belong together (damaged file)")
    return key_id, seed, public


def _write_new(path: Path, text: str, mode: int, force: bool) -> None:
    """Create `path` with `mode` (never wider, whatever the umask), refusing to replace a file."""
    if force:
        path.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise SigningError(f"{path} exists; not replacing a key (pass --force to replace it)") from None
    except OSError as exc:
        raise SigningError(f"cannot create {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(text)


def keygen(key_path: Path, public_path: Path | None = None, force: bool = False) -> PublicKey:
    """A new key pair: the secret key file (0600) and the public key file beside it."""
    public_path = public_path or key_path.with_suffix(".pub")
    if public_path == key_path:
        raise SigningError(f"--key {key_path}: the public key would overwrite it; name the key *.key")
    if not force:
        for path in (key_path, public_path):
            if path.exists():
                raise SigningError(f"{path} exists; not replacing a key (pass --force to replace it)")
    seed, key_id = secrets.token_bytes(32), secrets.token_bytes(KEY_ID_BYTES)
    public = _Libcrypto().public_key(seed)
    key = PublicKey(key_id=key_id, key=public, source=str(public_path))
    key_path.parent.mkdir(parents=True, exist_ok=True)
    _write_new(key_path, format_secret_key(key_id, seed, public), 0o600, force)
    _write_new(public_path, format_public_key(key), 0o644, force)
    return key


def trusted_comment(name: str, version: str, comment: str | None, now: float | None = None) -> str:
    """minisign's default trusted comment plus the package; the user's comment last."""
    text = f"timestamp:{int(time.time() if now is None else now)}\tfile:manifest.json\tpackage:{name} {version}"
    if comment:
        if len(comment) > MAX_COMMENT_CHARS or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in comment):
            raise SigningError(f"--comment: at most {MAX_COMMENT_CHARS} characters, no control characters")
        text += f"\t{comment}"
    return text


def sign_package(package_dir: Path, key_path: Path, comment: str | None = None) -> Signature:
    """Sign PACKAGE/manifest.json into PACKAGE/manifest.json.minisig, after checking that every
    file matches the manifest (a signature vouches for the files, not just the manifest)."""
    package = load_package(package_dir)
    verify_files(package, package.manifest.files())
    key_id, seed, public = read_secret_key(key_path)
    crypto = _Libcrypto()
    first = crypto.sign(seed, signed_message(package.manifest_bytes, HASHED))
    manifest = package.manifest
    unsigned = Signature(algorithm=HASHED, key_id=key_id, signature=first,
                         trusted_comment=trusted_comment(manifest.name, manifest.version, comment),
                         global_signature=b"", untrusted_comment=f"signature from decide key {key_id_hex(key_id)}")
    signature = Signature(**{**unsigned.__dict__, "global_signature": crypto.sign(seed, comment_message(unsigned))})
    if not (ed25519.verify(public, signed_message(package.manifest_bytes), signature.signature)
            and ed25519.verify(public, comment_message(signature), signature.global_signature)):
        raise SigningError("the new signature does not verify (libcrypto and runtime/package/ed25519.py disagree); nothing written")
    target = package_dir / SIGNATURE_NAME
    temporary = package_dir / f".{SIGNATURE_NAME}.{os.getpid()}.tmp"
    try:
        temporary.write_text(format_signature(signature), encoding="utf-8")
        os.replace(temporary, target)  # a reader sees the old signature or the new one, never half
    finally:
        temporary.unlink(missing_ok=True)
    return signature
