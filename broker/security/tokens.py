"""Bearer tokens → principals: a TOML file of hashed tokens (a Kubernetes Secret mounted as a file).

Format (one table per token; a principal may have several tokens, which is how a token is rotated:
add the new one, move clients over, remove the old one; the file is re-read when it changes)::

    [[token]]
    principal = "admin"
    sha256 = "9f86d081884c7d65..."         # hex sha256 of the token (tokens are random: 32+ bytes)
    expires_at = 2026-12-31T00:00:00Z       # optional (TOML date-time, with a zone)

    [[token]]
    principal = "billing"
    scrypt = "16384$8$1$<salt hex>$<hash hex>"   # scrypt(token, salt, n, r, p), 32-byte hash

Only hashes are stored. :func:`hash_token_sha256` and :func:`hash_token_scrypt` make the values.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.security.watched import WatchedFile

TOKEN_BYTES_MAX = 4096
PRINCIPAL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:/=-]{0,127}")
_SCRYPT_N_MAX = 1 << 17
_SCRYPT_VERIFIED_MAX = 1024  # verified scrypt tokens remembered (by sha256) to spare the CPU


class AuthenticationError(Exception):
    """The call carries no usable credential; the message says why (never the token)."""


@dataclass(frozen=True)
class TokenEntry:
    principal: str
    sha256: bytes | None  # digest, when stored as sha256
    scrypt: tuple[int, int, int, bytes, bytes] | None  # n, r, p, salt, hash
    expires_at_s: float | None  # unix time; None: never

    def matches(self, token: bytes) -> bool:
        if self.sha256 is not None:
            return hmac.compare_digest(hashlib.sha256(token).digest(), self.sha256)
        assert self.scrypt is not None
        n, r, p, salt, digest = self.scrypt
        return hmac.compare_digest(hashlib.scrypt(token, salt=salt, n=n, r=r, p=p, dklen=len(digest)), digest)


def hash_token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hash_token_scrypt(token: str, n: int = 16384, r: int = 8, p: int = 1) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(token.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"{n}${r}${p}${salt.hex()}${digest.hex()}"


def _parse_scrypt(text: str, where: str) -> tuple[int, int, int, bytes, bytes]:
    parts = text.split("$")
    try:
        n, r, p = (int(x) for x in parts[:3])
        salt, digest = bytes.fromhex(parts[3]), bytes.fromhex(parts[4])
    except (ValueError, IndexError):
        raise ValueError(f"{where}: scrypt must be N$R$P$SALT_HEX$HASH_HEX") from None
    if len(parts) != 5 or not (2 <= n <= _SCRYPT_N_MAX and n & (n - 1) == 0) or not 1 <= r <= 32 \
            or not 1 <= p <= 16 or len(digest) < 16:
        raise ValueError(f"{where}: scrypt parameters out of range (N a power of 2 up to {_SCRYPT_N_MAX}, "
                         "r 1..32, p 1..16, hash of 16+ bytes)")
    return n, r, p, salt, digest


def parse_tokens(text: str) -> list[TokenEntry]:
    """The entries of a tokens file; ``ValueError`` naming the entry for anything malformed."""
    data = tomllib.loads(text)
    unknown = set(data) - {"token"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}: expected [[token]] tables")
    entries: list[TokenEntry] = []
    for i, item in enumerate(data.get("token", [])):
        where = f"token {i + 1}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a table")
        extra = set(item) - {"principal", "sha256", "scrypt", "expires_at"}
        if extra:
            raise ValueError(f"{where}: unknown key(s) {sorted(extra)}")
        principal = item.get("principal")
        if not isinstance(principal, str) or not PRINCIPAL_RE.fullmatch(principal):
            raise ValueError(f"{where}: principal must match {PRINCIPAL_RE.pattern}")
        sha, scr = item.get("sha256"), item.get("scrypt")
        if (sha is None) == (scr is None):
            raise ValueError(f"{where}: give exactly one of sha256 and scrypt")
        digest = None
        if sha is not None:
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
                raise ValueError(f"{where}: sha256 must be 64 hex digits")
            digest = bytes.fromhex(sha)
        scrypt = _parse_scrypt(scr, where) if isinstance(scr, str) else None
        if scr is not None and scrypt is None:
            raise ValueError(f"{where}: scrypt must be a string")
        expires = item.get("expires_at")
        if expires is not None and (not isinstance(expires, dt.datetime) or expires.tzinfo is None):
            raise ValueError(f"{where}: expires_at must be a TOML date-time with a zone, e.g. 2026-12-31T00:00:00Z")
        entries.append(TokenEntry(principal, digest, scrypt, expires.timestamp() if expires else None))
    return entries


class TokenStore:
    """Authenticates bearer tokens against the tokens file (re-read when it changes)."""

    def __init__(self, path: Path, clock_s: Callable[[], float] | None = None) -> None:
        self._file = WatchedFile(path, parse_tokens)
        self._clock_s = clock_s or (lambda: dt.datetime.now(dt.UTC).timestamp())
        self._verified: dict[bytes, TokenEntry] = {}  # sha256(token) -> scrypt entry it matched

    def authenticate(self, token: str) -> str:
        """The principal of ``token``; :class:`AuthenticationError` if unknown or expired."""
        raw = token.encode()
        if not raw or len(raw) > TOKEN_BYTES_MAX:
            raise AuthenticationError("the bearer token is empty or too long")
        entries = self._file.get()
        key = hashlib.sha256(raw).digest()
        found = self._verified.get(key)
        if found is not None and found not in entries:
            found = None
        if found is None:
            found = next((e for e in entries if e.sha256 is not None and e.matches(raw)), None)
        if found is None:
            found = next((e for e in entries if e.scrypt is not None and e.matches(raw)), None)
            if found is not None:
                if len(self._verified) >= _SCRYPT_VERIFIED_MAX:
                    self._verified.clear()
                self._verified[key] = found
        if found is None:
            raise AuthenticationError("unknown bearer token")
        if found.expires_at_s is not None and self._clock_s() >= found.expires_at_s:
            raise AuthenticationError(f"the bearer token of principal {found.principal!r} has expired")
        return found.principal
