"""A real Redis server on a loopback port, started and stopped by the tests (Debian's
`redis-server`). Where it is missing, the tests that need it are skipped, loudly."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
MISSING = (
    "REDIS NOT INSTALLED: the shared-state tests (docs/deploying.md) did NOT run; install Debian's "
    "redis-server (scripts/setup dev does it where it can)"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    def __init__(self, workdir: Path, password: str | None = None) -> None:
        if REDIS_SERVER is None:
            pytest.skip(MISSING)
        self.port = free_port()
        self.workdir = workdir
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()
