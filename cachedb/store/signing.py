"""Optional HMAC signing of stored entries, so a shared database only serves the team's.

With ``CACHEDB_HMAC_KEY`` set (any string; use a long random one), every FX graph /
AOTAutograd entry, best config, PGO profile and Dynamo package written is signed with
HMAC-SHA256 over what identifies it and its bytes' SHA-256; entries are served (and exported or
imported) only if their signature verifies under that key. Without the variable nothing is
signed or checked.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

ENV_KEY = "CACHEDB_HMAC_KEY"


@dataclass(frozen=True)
class Signer:
    """HMAC-SHA256 signatures (64 hex characters) under one secret key."""

    key: bytes

    @classmethod
    def from_environment(cls) -> Signer | None:
        value = os.environ.get(ENV_KEY)
        return cls(value.encode("utf-8")) if value else None

    def sign(self, *parts: str) -> str:
        message = "\x1f".join(parts).encode("utf-8")
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def verify(self, signature: str | None, *parts: str) -> bool:
        return signature is not None and hmac.compare_digest(signature, self.sign(*parts))

    # The signed message of each kind of row.
    def guarded(self, kind: str, key: str, variant: str, checksum: str) -> str:
        return self.sign("guarded", kind, key, variant, checksum)

    def best_config(self, key: str, content: str) -> str:
        return self.sign("best_config", key, hashlib.sha256(content.encode("utf-8")).hexdigest())

    def dynamo(self, kind: str, key: str, checksum: str) -> str:
        """One of Dynamo's caches (``kind``: ``pgo`` or ``precompile``), by its key and the
        SHA-256 of its pickle."""
        return self.sign("dynamo", kind, key, checksum)
