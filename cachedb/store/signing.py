"""Signing of stored entries, so a shared database only serves what trusted writers wrote.

Two modes. **Public keys** (Ed25519, through ``cryptography``): writers hold a private key
(``CACHEDB_SIGNING_KEY``, :class:`SigningKey`) and sign each row they send to a shared tier or
copy out; consumers hold public keys only (``CACHEDB_TRUSTED_KEYS``, :class:`TrustedKeys`) and
check rows where they cross into the machine (:mod:`cachedb.fleet.trust`). **HMAC** (below), for
single-team setups:

With ``CACHEDB_HMAC_KEY`` set (any string; use a long random one), every FX graph /
AOTAutograd entry, best config, PGO profile and Dynamo package written is signed with
HMAC-SHA256 over what identifies it and its bytes' SHA-256; entries are served (and exported or
imported) only if their signature verifies under that key. Without the variable nothing is
signed or checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
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


# -- public-key signatures (Ed25519) -------------------------------------------------------------

#: A writer's private key: a PEM file (``openssl genpkey -algorithm ed25519``), inline PEM, or
#: the base64 of its 32 raw bytes.
ENV_SIGNING_KEY = "CACHEDB_SIGNING_KEY"
#: Public keys whose signatures are trusted: comma-separated, each a PEM file, a file of one
#: key per line, inline PEM, or the base64 of the 32 raw bytes (``cachedb fleet keygen`` prints it).
ENV_TRUSTED_KEYS = "CACHEDB_TRUSTED_KEYS"


def key_id(public_raw: bytes) -> str:
    """A public key's id: the first 16 hex digits of the SHA-256 of its 32 raw bytes."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _text_of(value: str) -> str:
    """``value`` itself, or the text of the file it names."""
    if "-----BEGIN" in value:
        return value
    candidate = os.path.expanduser(value.strip())
    if candidate and os.path.isfile(candidate):
        try:
            with open(candidate, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            from .._errors import KeyConfigError

            raise KeyConfigError(f"{candidate}: cannot read key file: {exc.strerror or exc}") from exc
    return value


class SigningKey:
    """A writer's Ed25519 private key: signs rows (:meth:`sign`, 64-byte signatures written as
    ``<key id>:<base64>``, 105 characters). Loaded from PEM or the base64 of its 32 raw bytes.

    Raises :class:`~cachedb.KeyConfigError` on anything else."""

    def __init__(self, private: object) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        if not isinstance(private, Ed25519PrivateKey):
            from .._errors import KeyConfigError

            raise KeyConfigError("signing key: not an Ed25519 private key")
        self._key = private
        self.public_raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id(self.public_raw)

    @classmethod
    def generate(cls) -> SigningKey:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, value: str) -> SigningKey:
        """From a PEM file's path, PEM text, or base64 of 32 raw bytes."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        from .._errors import KeyConfigError

        text = _text_of(value).strip()
        try:
            if "-----BEGIN" in text:
                return cls(load_pem_private_key(text.encode("ascii"), password=None))
            raw = base64.b64decode(text, validate=True)
            return cls(Ed25519PrivateKey.from_private_bytes(raw))
        except KeyConfigError:
            raise
        except (ValueError, TypeError, binascii.Error) as exc:
            raise KeyConfigError(f"{ENV_SIGNING_KEY}: not an Ed25519 private key (PEM or base64 of 32 bytes): {exc}") from exc

    @classmethod
    def from_environment(cls) -> SigningKey | None:
        value = os.environ.get(ENV_SIGNING_KEY)
        return cls.load(value) if value else None

    def private_pem(self) -> str:
        from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

        return self._key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode("ascii")

    def public_line(self) -> str:
        """The public key as ``CACHEDB_TRUSTED_KEYS`` takes it inline: base64 of 32 raw bytes."""
        return base64.b64encode(self.public_raw).decode("ascii")

    def sign(self, message: bytes) -> str:
        return f"{self.key_id}:{base64.b64encode(self._key.sign(message)).decode('ascii')}"


class TrustedKeys:
    """The Ed25519 public keys whose signatures a consumer accepts, by key id. Verifying needs
    no secret: a holder of these keys cannot make a signature another consumer accepts."""

    def __init__(self, public_raws: list[bytes]) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        self._keys = {key_id(raw): Ed25519PublicKey.from_public_bytes(raw) for raw in public_raws}

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    @classmethod
    def load(cls, value: str) -> TrustedKeys:
        """From ``CACHEDB_TRUSTED_KEYS``' syntax (see :data:`ENV_TRUSTED_KEYS`). Raises
        :class:`~cachedb.KeyConfigError` naming the entry that is not an Ed25519 public key."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

        from .._errors import KeyConfigError

        raws: list[bytes] = []
        for entry in (e.strip() for e in value.split(",")):
            if not entry:
                continue
            text = _text_of(entry)
            pems = re.findall(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", text, re.S)
            lines = [] if pems or "-----BEGIN" in text else [ln.strip() for ln in text.splitlines() if ln.strip()]
            try:
                for pem in pems:
                    key = load_pem_public_key(pem.encode("ascii"))
                    if not isinstance(key, Ed25519PublicKey):
                        raise ValueError("not an Ed25519 key")
                    raws.append(key.public_bytes(Encoding.Raw, PublicFormat.Raw))
                for line in lines:
                    raw = base64.b64decode(line.split()[-1], validate=True)
                    Ed25519PublicKey.from_public_bytes(raw)
                    raws.append(raw)
            except (ValueError, TypeError, binascii.Error) as exc:
                raise KeyConfigError(f"{ENV_TRUSTED_KEYS}: {entry[:60]!r} is not an Ed25519 public key: {exc}") from exc
            if not pems and not lines:
                raise KeyConfigError(f"{ENV_TRUSTED_KEYS}: {entry[:60]!r} holds no public key")
        return cls(raws)

    @classmethod
    def from_environment(cls) -> TrustedKeys | None:
        value = os.environ.get(ENV_TRUSTED_KEYS)
        return cls.load(value) if value else None

    def verify(self, signature: str | None, message: bytes) -> str | None:
        """The id of the trusted key ``signature`` (``<key id>:<base64>``) verifies
        ``message`` under, or ``None`` (no, malformed or untrusted signature)."""
        from cryptography.exceptions import InvalidSignature

        if not signature or ":" not in signature:
            return None
        kid, _, b64 = signature.partition(":")
        key = self._keys.get(kid)
        if key is None:
            return None
        try:
            key.verify(base64.b64decode(b64, validate=True), message)
        except (InvalidSignature, ValueError, binascii.Error):
            return None
        return kid
