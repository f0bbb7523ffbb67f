"""Real servers on 127.0.0.1 for the distributed tests: moto's S3 server (``moto[server]``, the test
extra) and Debian's ``redis-server`` (started here when it is on PATH, persistence off), each
skipped when missing and failed under CI (``needs``, ``need``, ``unavailable``), and a TCP proxy in
front of one to cut a client off from it (``TcpProxy``: a server down, a network partition)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key-0123456789",
    "AWS_REGION": "us-east-1",
}


@dataclass
class S3:
    """A moto S3 server: ``endpoint`` (http://127.0.0.1:PORT), ``env`` (credentials and the
    endpoint, for processes), ``uri(prefix)`` for ``--cache-remote``."""

    endpoint: str
    bucket: str
    env: dict[str, str]

    def uri(self, prefix: str = "dxi") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

    def keys(self, prefix: str = "") -> list[str]:
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        # (pyarrow leaves an empty "dir/" marker object where it deleted a folder's last file)
        return sorted(
            o["Key"]
            for page in pages
            for o in page.get("Contents", [])
            if not o["Key"].endswith("/")
        )


@contextlib.contextmanager
def moto_s3(monkeypatch: pytest.MonkeyPatch | None = None) -> Iterator[S3]:
    """A ThreadedMotoServer on 127.0.0.1 (a random port) with one bucket; with ``monkeypatch``, this
    process's environment gets the credentials and ``AWS_ENDPOINT_URL_S3`` too. A moto that is
    missing or cannot start skips the test, and fails it under CI (``CI`` set), as ``need`` does."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        unavailable(f"moto[server] is not installed ({exc}): the test extra has it")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    try:
        server.start()
    except Exception as exc:  # noqa: BLE001 - whatever stops it, the test cannot run
        unavailable(f"moto's S3 server did not start: {type(exc).__name__}: {exc}")
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = dict(CREDENTIALS, AWS_ENDPOINT_URL_S3=endpoint)
        s3 = S3(
            endpoint, f"dxi-test-{uuid.uuid4().hex[:12]}", env
        )  # moto's state is per process: a bucket each
        s3.client().create_bucket(Bucket=s3.bucket)
        if monkeypatch is not None:
            for k, v in env.items():
                monkeypatch.setenv(k, v)
        yield s3
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def needs(why: str | None) -> pytest.MarkDecorator:
    """A mark for tests that need a real server or program: none when ``why`` is None; otherwise the
    test is skipped with ``why`` on a developer's machine, and fails with it under CI (``CI`` set),
    where ``.ci/run`` installs every such program, so a failed install cannot pass as skipped
    tests."""
    if why is None:
        return pytest.mark.skipif(False, reason="")
    if os.environ.get("CI"):
        return pytest.mark.needs_in_ci(why)
    return pytest.mark.skip(reason=why)


def unavailable(message: str) -> NoReturn:
    """A real server or program the test needs is missing: skip, or under CI (``CI`` set) fail,
    saying ``message``: CI installs every such server, so a failed install cannot pass as skipped
    tests."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (.ci/run installs it)", pytrace=False)
    pytest.skip(message)


def need(program: str, why: str = "a test runs it") -> str:
    """The path of ``program``, else a skip (a failure under CI) saying ``why`` it is needed."""
    path = shutil.which(program) or (
        f"/usr/bin/{program}" if Path(f"/usr/bin/{program}").exists() else None
    )
    if path is None:
        unavailable(f"{program} is not installed: {why}")
    return path


requires_redis = needs(
    None
    if shutil.which("redis-server")
    else "redis-server not on PATH (apt-get install -y redis-server)"
)


@contextlib.contextmanager
def redis_server(port: int | None = None) -> Iterator[str]:
    """``redis-server`` on 127.0.0.1 with ``port`` (default: a random one) and no persistence;
    yields redis://127.0.0.1:PORT/0."""
    port = port or free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=0.2),
            ):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def env_with(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}


class TcpProxy:
    """A TCP proxy on 127.0.0.1 (``port``) to ``target_port``, in the test's event loop: ``cut()``
    closes its connections and refuses new ones (a server gone: clients fail at once),
    ``cut(blackhole=True)`` keeps them open but passes nothing either way (a partition: clients time
    out), ``heal()`` passes again (closing the connections cut, so clients connect afresh). Use as
    ``async with TcpProxy(port) as proxy``."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = 0
        self.state = "open"  # open | refuse | blackhole
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._close_all()
        self._server.close()
        await self._server.wait_closed()

    def _close_all(self) -> None:
        for a, b in list(self._conns):
            a.close()
            b.close()
        self._conns.clear()

    def cut(self, blackhole: bool = False) -> None:
        self.state = "blackhole" if blackhole else "refuse"
        if not blackhole:
            self._close_all()

    def heal(self) -> None:
        self.state = "open"
        self._close_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.state == "refuse":
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self._conns.add(pair)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    if self.state == "open":
                        dst.write(data)
                        await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._conns.discard(pair)
