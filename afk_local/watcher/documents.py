"""The files a person or a program drops for the watcher: one JSON document each.

Requests (``requests/``) and schedules (``schedules/``) are read the same way once their
bytes are in hand: in a keyed store the document must carry a valid MAC under its tag,
else its signature block, if any, is set aside; then the JSON is decoded into its type.
Every failure is a ``ValueError`` saying why the file is unusable.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from afk_local.storage.format.integrity import Signer, split_document

_T = TypeVar("_T")


def open_document(data: bytes, signer: Signer | None, tag: str, kind: type[_T], what: str) -> _T:
    """Decode ``data`` as a ``kind``, checking its MAC under ``tag`` when ``signer`` is given.

    Raises:
        ValueError: ``"untrusted: ..."`` (a keyed store's MAC is missing or wrong) or
            ``"not a <what>: ..."`` (not JSON of that shape).
    """
    if signer is not None:
        try:
            body = signer.open_document(tag, data)
        except ValueError as exc:
            raise ValueError(f"untrusted: {exc}") from None
    else:
        body = split_document(data)[0]
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise ValueError(f"not a {what}: {exc}") from None


__all__ = ["open_document"]
