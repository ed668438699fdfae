"""One remote location (``s3://``, ``gs://``, ``az://``, ``file:///``) through obstore.

:class:`Bucket` is the only module that talks to obstore. It offers what the mirror
needs and nothing more: create-only puts (``If-None-Match: *`` on S3, an exclusive
link on a local directory), bounded reads, listings and existence checks. Object
stores other than S3 come from obstore as they are (credentials from their usual
environment variables).

S3 is configured by the standard AWS environment variables: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``
(an S3-compatible service) and ``AWS_ALLOW_HTTP=true`` (a plain-http endpoint such
as a local test server). obstore sends create-only puts as ``If-None-Match: *``
(its ``conditional_put`` default, ``etag``), which S3 has honoured since 2024.

Example:
    >>> bucket = Bucket("file:///tmp/afk-doc-bucket")
    >>> bucket.create("run-1/lease/000000000001.lease", b"{}")
    True
    >>> bucket.create("run-1/lease/000000000001.lease", b"{}")
    False
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import unquote, urlsplit

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from obstore.store import LocalStore, from_url

from afk_local.errors import BucketRequestError, MirrorError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

log = logging.getLogger("afk_local")

SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "file")
"""URL schemes a :class:`Bucket` accepts."""

_RETRY: RetryConfig = {
    "max_retries": 4,
    "retry_timeout": dt.timedelta(seconds=30),
    "backoff": {
        "init_backoff": dt.timedelta(milliseconds=100),
        "max_backoff": dt.timedelta(seconds=5),
        "base": 2,
    },
}

_TIMEOUTS: ClientConfig = {
    # A hanging endpoint fails a request within these bounds instead of blocking for
    # ever; the retries above (and the mirror's, with backoff) are layered on top.
    "connect_timeout": "5s",
    "read_timeout": "20s",
    "timeout": "300s",
}
"""Connect, read (no byte for that long) and whole-request timeouts of every request."""

_ALLOW_HTTP_ENV = ("AWS_ALLOW_HTTP", "AZURE_ALLOW_HTTP", "GOOGLE_ALLOW_HTTP")


def client_options() -> ClientConfig:
    """obstore client options for a remote: the timeouts, plus ``allow_http`` when the
    environment asks for it (passing client options replaces obstore's own reading of it)."""
    options: ClientConfig = dict(_TIMEOUTS)  # type: ignore[assignment]
    if any(os.environ.get(name, "").lower() == "true" for name in _ALLOW_HTTP_ENV):
        options["allow_http"] = True
    return options


class ListedObject(NamedTuple):
    """A key (relative to the bucket's prefix) and its size."""

    key: str
    size: int


class Bucket:
    """A remote location given by URL; every key is relative to the URL's path.

    Args:
        url: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``
            or ``file:///absolute/directory`` (created if missing).

    Raises:
        MirrorError: an unsupported or malformed URL.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise MirrorError(
                url, f"unsupported scheme {scheme!r}: use s3://, gs://, az://, file://"
            )
        store: ObjectStore
        try:
            if scheme == "file":
                if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                    raise MirrorError(url, "a file URL names an absolute path: file:///abs/path")
                directory = Path(unquote(parts.path))
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                store = LocalStore(directory)
            else:
                if not parts.netloc:
                    raise MirrorError(url, "no bucket in the URL: s3://BUCKET/prefix")
                store = from_url(url, retry_config=_RETRY, client_options=client_options())
        except BaseError as exc:
            raise MirrorError(url, f"cannot open: {exc}") from exc
        except OSError as exc:
            raise MirrorError(url, f"cannot open: {exc}") from exc
        self._store = store

    def __repr__(self) -> str:
        return f"Bucket({self.url!r})"

    # -- reading ------------------------------------------------------------------

    def get(self, key: str, max_bytes: int) -> bytes | None:
        """The object's bytes, or None when it does not exist.

        Raises:
            MirrorError: the object is larger than ``max_bytes``, or the request failed.
        """
        try:
            result = obstore.get(self._store, key)
            size = int(result.meta["size"])
            if size > max_bytes:
                raise MirrorError(self.url, f"{key}: {size} bytes, over the bound of {max_bytes}")
            data = bytes(result.bytes())
        except (NotFoundError, FileNotFoundError):
            return None
        except BaseError as exc:
            raise self._error("read", key, exc) from exc
        if len(data) != size:
            raise MirrorError(self.url, f"{key}: read {len(data)} bytes, listed {size}")
        return data

    def size(self, key: str) -> int | None:
        """The object's size, or None when it does not exist."""
        try:
            return int(obstore.head(self._store, key)["size"])
        except (NotFoundError, FileNotFoundError):
            return None
        except BaseError as exc:
            raise self._error("look up", key, exc) from exc

    def modified_ms(self, key: str) -> int | None:
        """When the object was last written, by the server's clock (ms); None if absent."""
        try:
            meta = obstore.head(self._store, key)
        except (NotFoundError, FileNotFoundError):
            return None
        except BaseError as exc:
            raise self._error("look up", key, exc) from exc
        return int(meta["last_modified"].timestamp() * 1000)

    def exists(self, key: str) -> bool:
        """True when the object exists."""
        return self.size(key) is not None

    def list_objects(self, prefix: str, *, limit: int) -> Iterator[ListedObject]:
        """Every object under the directory ``prefix`` (recursive), in no set order.

        Raises:
            MirrorError: more than ``limit`` objects, or the request failed.
        """
        count = 0
        try:
            for batch in obstore.list(self._store, prefix.rstrip("/"), chunk_size=1000):
                for meta in batch:
                    count += 1
                    if count > limit:
                        raise MirrorError(
                            self.url, f"more than {limit} objects under {prefix}: refused"
                        )
                    yield ListedObject(str(meta["path"]), int(meta["size"]))
        except (NotFoundError, FileNotFoundError):
            return
        except BaseError as exc:
            raise self._error("list", prefix, exc) from exc

    def list_dirs(self, prefix: str = "", *, limit: int) -> list[str]:
        """The names of the directories directly under ``prefix`` (not recursive)."""
        try:
            result = obstore.list_with_delimiter(self._store, prefix.rstrip("/") or None)
        except (NotFoundError, FileNotFoundError):
            return []
        except BaseError as exc:
            raise self._error("list", prefix or "/", exc) from exc
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"]]
        if len(names) > limit:
            raise MirrorError(self.url, f"more than {limit} runs under {prefix or '/'}: refused")
        return names

    # -- writing ------------------------------------------------------------------

    def create(self, key: str, data: bytes) -> bool:
        """Create the object unless it exists: True if this call created it.

        The check and the write are one atomic step on the server (``If-None-Match: *``),
        so of two writers racing for one key exactly one gets True.
        """
        try:
            obstore.put(self._store, key, data, mode="create", use_multipart=False)
        except AlreadyExistsError:
            return False
        except BaseError as exc:
            raise self._error("create", key, exc) from exc
        return True

    def replace(self, key: str, data: bytes) -> None:
        """Write the object, replacing it: only for the lease renewal, never for run data."""
        try:
            obstore.put(self._store, key, data, use_multipart=False)
        except BaseError as exc:
            raise self._error("write", key, exc) from exc

    def _error(self, action: str, key: str, exc: BaseException) -> BucketRequestError:
        denied = isinstance(exc, (PermissionDeniedError, UnauthenticatedError))
        hint = "; check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY...)"
        text = str(exc).strip()
        first_line = text.splitlines()[0] if text else type(exc).__name__
        return BucketRequestError(
            self.url,
            f"cannot {action} {key}: {first_line[:300]}{hint if denied else ''}",
            retryable=not denied,
        )


def file_url(path: str | os.PathLike[str]) -> str:
    """The ``file://`` URL of a local directory (made absolute)."""
    return Path(path).absolute().as_uri()


__all__ = [
    "SCHEMES",
    "Bucket",
    "BucketRequestError",
    "ListedObject",
    "client_options",
    "file_url",
]
