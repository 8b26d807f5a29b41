"""Ed25519 signature verification (RFC 8032, section 5.1.7) in plain Python.

Why not libcrypto through ctypes: the bundle carries none (bundle_spec/decide.spec excludes
_hashlib and _ssl, which is what brought libcrypto in: 4.5 MB), and a wheel (PyNaCl 1.4 MB,
cryptography 4.7 MB, both + cffi) would be a new dependency for one function. Verifying touches
only public data (key, message, signature), so the timing side channels that make hand-written
signing dangerous do not apply here; what matters is being strict, like libsodium (which the
stock `minisign` uses): a non-canonical S, a public key or R that does not decode to a point of
the curve, and a small-order public key are refused. About 5 ms per signature in CPython 3.11 (both scalar products in one pass).

Stdlib only, imported before the CPU check. `tests/test_signing.py` checks it against RFC 8032's
vectors, libcrypto and the stock minisign.
"""

from __future__ import annotations

import hashlib

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493  # the group order
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64

Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z


def _add(a: Point, b: Point) -> Point:
    """a + b (RFC 8032 5.1.4, complete for Ed25519)."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    e = (y1 - x1) * (y2 - x2) % P
    f = (y1 + x1) * (y2 + x2) % P
    g = 2 * t1 * t2 * D % P
    h = 2 * z1 * z2 % P
    e, f, g, h = f - e, h - g, h + g, f + e
    return e * f % P, g * h % P, f * g % P, e * h % P


def _double(a: Point) -> Point:
    """2a (RFC 8032 5.1.4, doubling)."""
    x1, y1, z1, _ = a
    aa, bb, cc = x1 * x1 % P, y1 * y1 % P, 2 * z1 * z1 % P
    h = aa + bb
    e = h - (x1 + y1) * (x1 + y1)
    g = aa - bb
    f = cc + g
    return e * f % P, g * h % P, f * g % P, e * h % P


def _multiply_two(a: int, p: Point, b: int, q: Point) -> Point:
    """a·p + b·q in one double-and-add pass (Shamir's trick: half the doublings of two passes)."""
    both = _add(p, q)
    result: Point = (0, 1, 1, 0)
    for bit in range(max(a.bit_length(), b.bit_length()) - 1, -1, -1):
        result = _double(result)
        pick = ((a >> bit) & 1, (b >> bit) & 1)
        if pick == (1, 1):
            result = _add(result, both)
        elif pick == (1, 0):
            result = _add(result, p)
        elif pick == (0, 1):
            result = _add(result, q)
    return result


def _x_from_y(y: int, sign: int) -> int | None:
    """The x of the curve point with this y and sign bit (RFC 8032 5.1.3), None if there is none."""
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P) % P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        return None
    return P - x if (x & 1) != sign else x


def _decode(encoded: bytes) -> Point | None:
    """The point a 32-byte encoding names, None if it names none."""
    value = int.from_bytes(encoded, "little")
    y, sign = value & ((1 << 255) - 1), value >> 255
    x = _x_from_y(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


def _encode(point: Point) -> bytes:
    x, y, z, _ = point
    inverse = pow(z, P - 2, P)
    x, y = x * inverse % P, y * inverse % P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


BASE = _decode((4 * pow(5, P - 2, P) % P).to_bytes(32, "little"))
assert BASE is not None


def _small_order(point: Point) -> bool:
    """True for the eight points whose order divides the cofactor 8 (libsodium refuses such keys)."""
    return _encode(_double(_double(_double(point)))) == _encode((0, 1, 1, 0))


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True if `signature` is public_key's Ed25519 signature of `message` (strict: see the module
    docstring); False for anything else, including malformed keys and signatures."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    a = _decode(public_key)
    if a is None or _small_order(a):
        return False
    r_bytes, s = signature[:32], int.from_bytes(signature[32:], "little")
    if s >= L or _decode(r_bytes) is None:
        return False
    k = int.from_bytes(hashlib.sha512(r_bytes + public_key + message).digest(), "little") % L
    # [S]B = R + [k]A  ⇔  encode([S]B - [k]A) == R (cofactorless, as libsodium and OpenSSL check)
    negative_a = ((P - a[0]) % P, a[1], a[2], (P - a[3]) % P)
    return _encode(_multiply_two(s, BASE, k, negative_a)) == r_bytes
