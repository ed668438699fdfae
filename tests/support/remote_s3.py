"""A real S3 API for the remote tests: moto's server on loopback, or any endpoint you name.

By default a ``ThreadedMotoServer`` is started on 127.0.0.1 (a free port) once per test
process and always stopped at the end; the AWS variables obstore reads are pointed at
it (``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP=true``, dummy credentials) and exported, so
child processes reach the same server.

To run the same tests against another S3-compatible service, set
``AFK_LOCAL_TEST_S3_URL=s3://bucket/prefix`` and the usual ``AWS_*`` variables; no
server is started and nothing is created but objects under a fresh prefix per test.

tests/conftest.py loads this module as a pytest plugin: use ``remote_url`` in any test,
or ``slow_remote_url`` for the same server behind a loopback proxy that delays every
chunk by 20 ms each way (``latency_proxy.py``; moto only), or ``outage_remote`` for a
proxy the test takes down and brings back up.
"""

from __future__ import annotations

import logging
import os
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

TEST_URL_ENV = "AFK_LOCAL_TEST_S3_URL"
BUCKET = "afk-local-test"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The ``s3://bucket/prefix`` every test in this process puts its own prefix under."""
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    given = os.environ.get(TEST_URL_ENV)
    if given:
        yield given.rstrip("/")
        return
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in _AWS_VARS}
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ALLOW_HTTP="true",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
        )
        os.environ.pop("AWS_SESSION_TOKEN", None)
        request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
        yield f"s3://{BUCKET}/runs"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_AWS_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_SESSION_TOKEN",
)


@pytest.fixture
def remote_url(s3_endpoint: str) -> str:
    """A fresh, empty ``s3://`` location for one test."""
    return f"{s3_endpoint}/{uuid.uuid4().hex[:12]}"


SLOW_DELAY_S = 0.02


@pytest.fixture
def slow_remote_url(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh ``s3://`` location reached through a 20 ms-per-chunk latency proxy; the
    proxied endpoint is exported (``AWS_ENDPOINT_URL``) for child processes too."""
    if os.environ.get(TEST_URL_ENV):
        pytest.skip(f"the latency proxy fronts the local moto server only ({TEST_URL_ENV} is set)")
    from latency_proxy import LatencyProxy  # noqa: PLC0415 - tests/support is on sys.path

    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    assert endpoint.hostname is not None and endpoint.port is not None
    proxy = LatencyProxy((endpoint.hostname, endpoint.port), SLOW_DELAY_S).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        yield f"{s3_endpoint}/{uuid.uuid4().hex[:12]}"
    finally:
        proxy.stop()


@pytest.fixture
def outage_remote(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """``(url, proxy)``: a fresh ``s3://`` location reached through a loopback proxy
    (no delay) that ``proxy.down()`` / ``proxy.up()`` take away and bring back; the
    proxied endpoint is exported for child processes too."""
    if os.environ.get(TEST_URL_ENV):
        pytest.skip(f"the outage proxy fronts the local moto server only ({TEST_URL_ENV} is set)")
    from latency_proxy import LatencyProxy  # noqa: PLC0415 - tests/support is on sys.path

    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    assert endpoint.hostname is not None and endpoint.port is not None
    proxy = LatencyProxy((endpoint.hostname, endpoint.port), 0.0).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        yield f"{s3_endpoint}/{uuid.uuid4().hex[:12]}", proxy
    finally:
        proxy.stop()
