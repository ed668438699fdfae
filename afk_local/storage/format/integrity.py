"""Optional tamper evidence: HMAC-SHA256 over every record, chained (docs/format.md).

With a key (``Store(key=...)`` or ``$AFK_LOCAL_KEY``) every checkpoint file,
``run.meta`` and every ``effects.log`` record carries a 32-byte HMAC-SHA256.
A checkpoint's MAC covers its run id, seq, phase, the MAC of checkpoint
``seq - 1`` (the chain) and the SHA-256 of its decoded record bytes; a
journal record's covers the run id, the previous record's MAC and its bytes;
``run.meta``'s covers the run id and its bytes. docs/format.md ("Tamper
evidence") gives the exact layout and what is and is not detected.

This module holds the key and the MAC definitions, plus the two ``RunMeta.extra``
entries a keyed store keeps: the chain links that compaction recorded for
deleted checkpoints, and up to which seq a fork may hold each ancestor's records.

Example:
    >>> signer = Signer("correct horse battery staple")
    >>> mac = signer.meta_mac("run-1", b"record bytes")
    >>> signer.matches(mac, signer.meta_mac("run-1", b"record bytes"))
    True
    >>> signer.matches(mac, signer.meta_mac("run-2", b"record bytes"))
    False
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping
from typing import Any

KEY_ENV = "AFK_LOCAL_KEY"
"""Environment variable a :class:`~afk_local.Store` reads its key from when given none."""

MAC_SIZE = 32
"""Bytes of an HMAC-SHA256."""

NO_MAC = bytes(MAC_SIZE)
"""The chain value before the first record (and for a predecessor that carries no MAC)."""

LINKS_KEY = "chain_links"
"""``RunMeta.extra`` key: ``{"<seq>": "<hex MAC>"}``, the MAC checkpoint ``seq - 1`` had
when compaction deleted it, so checkpoint ``seq`` still verifies."""

HISTORY_KEY = "history_run_ids"
"""RunMeta.extra key: the fork ancestors whose run ids the run's shared checkpoints carry."""
HISTORY_UNTIL_KEY = "history_until_seq"
"""``RunMeta.extra`` key of a keyed fork: ``{"<ancestor run id>": max seq}``, the
checkpoints of each ancestor the fork shares (a fork made without a key has none)."""

_CHECKPOINT_TAG = b"afk-local/checkpoint/v1\x00"
_META_TAG = b"afk-local/meta/v1\x00"
_EFFECT_TAG = b"afk-local/effect/v1\x00"
_DOCUMENT_TAG = b"afk-local/document/v1\x00"
_PACK_TAG = b"afk-local/pack/v1\x00"
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")


def _field(text: str) -> bytes:
    # Length-prefixed, so (run "a", phase "bc") and (run "ab", phase "c") differ.
    data = text.encode()
    return _U16.pack(len(data)) + data


def record_digest(raw: bytes | memoryview) -> bytes:
    """SHA-256 of a record's bytes: what a checkpoint or meta MAC covers."""
    return hashlib.sha256(raw).digest()


class Signer:
    """The key of a keyed store and the MACs it makes. The key is never shown.

    Args:
        key: the secret, as bytes or text (text is UTF-8 encoded). Must not be empty.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes | str) -> None:
        data = key.encode() if isinstance(key, str) else bytes(key)
        if not data:
            raise ValueError(f"an empty key signs nothing: pass a secret or unset {KEY_ENV}")
        self._key = data

    def __repr__(self) -> str:
        return "Signer(key=<hidden>)"

    def checkpoint_mac(
        self, run_id: str, seq: int, phase: str, prev: bytes, digest: bytes
    ) -> bytes:
        """MAC of checkpoint ``seq`` of ``run_id``, chained on ``prev`` (the MAC of ``seq - 1``).

        ``digest`` is :func:`record_digest` of the decoded record bytes.
        """
        message = b"".join(
            (_CHECKPOINT_TAG, _field(run_id), _U64.pack(seq), _field(phase), prev, digest)
        )
        return hmac.digest(self._key, message, "sha256")

    def meta_mac(self, run_id: str, raw: bytes) -> bytes:
        """MAC of a ``run.meta`` record of ``run_id`` (its decoded bytes)."""
        message = b"".join((_META_TAG, _field(run_id), record_digest(raw)))
        return hmac.digest(self._key, message, "sha256")

    def document_mac(self, tag: str, body: bytes) -> bytes:
        """MAC of a small signed document (a head record, a request, the keyed-store marker).

        ``tag`` says what the document is, so one kind can never pass for another.
        """
        message = b"".join((_DOCUMENT_TAG, _field(tag), record_digest(body)))
        return hmac.digest(self._key, message, "sha256")

    def sign_document(self, tag: str, body: bytes) -> bytes:
        """``body`` (one line, no newline) followed by a line holding its hex MAC."""
        if b"\n" in body:
            raise ValueError("a signed document's body is one line")
        return body + b"\n" + self.document_mac(tag, body).hex().encode() + b"\n"

    def open_document(self, tag: str, data: bytes) -> bytes:
        """The body of a document made by :meth:`sign_document`; ValueError when its MAC
        is missing or does not match (edited, another kind of document, another key)."""
        body, mac = split_document(data)
        if mac is None:
            raise ValueError("unsigned (a keyed store signs it)")
        if not self.matches(self.document_mac(tag, body), mac):
            raise ValueError("HMAC mismatch: edited, or signed with another key")
        return body

    def effect_mac(self, run_id: str, prev: bytes, digest: bytes) -> bytes:
        """MAC of one ``effects.log`` record, chained on ``prev`` (the previous record's MAC).

        ``digest`` is :func:`record_digest` of the record's msgpack bytes.
        """
        message = b"".join((_EFFECT_TAG, _field(run_id), prev, digest))
        return hmac.digest(self._key, message, "sha256")

    def pack_mac(self, run_id: str, digest: bytes) -> bytes:
        """MAC of a pack file of ``run_id``; ``digest`` is the SHA-256 of its header and index."""
        message = b"".join((_PACK_TAG, _field(run_id), digest))
        return hmac.digest(self._key, message, "sha256")

    @staticmethod
    def matches(expected: bytes, given: bytes | memoryview) -> bool:
        """Constant-time comparison of two MACs."""
        return hmac.compare_digest(expected, bytes(given))


def split_document(data: bytes) -> tuple[bytes, bytes | None]:
    """A document's body and its MAC (None when it has no MAC line); nothing is checked."""
    body, newline, rest = data.partition(b"\n")
    line = rest.strip()
    if not newline or not line:
        return body, None
    try:
        mac = bytes.fromhex(line.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return body, None
    return (body, mac) if len(mac) == MAC_SIZE and b"\n" not in line else (body, None)


def signer_for(key: bytes | str | Signer | None) -> Signer | None:
    """The signer for ``key``; None for no key (``$AFK_LOCAL_KEY`` is read by
    :meth:`~afk_local.storage.rundir.options.StoreOptions.from_environ`, not here)."""
    if key is None or isinstance(key, Signer):
        return key
    return Signer(key)


def chain_links(extra: Any) -> dict[int, bytes]:
    """The chain links recorded in a ``RunMeta.extra`` (malformed entries are ignored)."""
    table = extra.get(LINKS_KEY) if isinstance(extra, Mapping) else None
    links: dict[int, bytes] = {}
    if not isinstance(table, Mapping):
        return links
    for seq, value in table.items():
        try:
            mac = bytes.fromhex(value) if isinstance(value, str) else b""
            number = int(seq)
        except ValueError:
            continue
        if len(mac) == MAC_SIZE and number > 1:
            links[number] = mac
    return links


def with_chain_links(extra: Mapping[str, Any], links: Mapping[int, bytes]) -> dict[str, Any]:
    """A copy of ``extra`` holding ``links`` (the key is dropped when there are none)."""
    result = dict(extra)
    result.pop(LINKS_KEY, None)
    if links:
        result[LINKS_KEY] = {str(seq): links[seq].hex() for seq in sorted(links)}
    return result


def history_run_ids(meta: Any) -> tuple[str, ...]:
    """Run ids (besides its own) that a run's checkpoint records may carry: its fork ancestors."""
    ids = meta.extra.get(HISTORY_KEY) if isinstance(meta.extra, dict) else None
    if not isinstance(ids, list):
        return ()
    return tuple(i for i in ids if isinstance(i, str))


def history_until(extra: Any) -> dict[str, int]:
    """A keyed fork's ``{ancestor run id: max seq}`` (empty when absent or malformed)."""
    table = extra.get(HISTORY_UNTIL_KEY) if isinstance(extra, Mapping) else None
    if not isinstance(table, Mapping):
        return {}
    return {
        run_id: seq
        for run_id, seq in table.items()
        if isinstance(run_id, str) and isinstance(seq, int) and not isinstance(seq, bool)
    }


__all__ = [
    "HISTORY_UNTIL_KEY",
    "KEY_ENV",
    "LINKS_KEY",
    "MAC_SIZE",
    "NO_MAC",
    "Signer",
    "chain_links",
    "history_until",
    "record_digest",
    "signer_for",
    "split_document",
    "with_chain_links",
]
