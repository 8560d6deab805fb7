"""`conclave serve --http HOST:PORT --workers N`: N server processes accepting on one port.

Each worker is a whole `conclave serve --http` of its own, bound with SO_REUSEPORT, so the
kernel spreads new connections over them and a Python process per core does the work. This
process only supervises: it holds the port (bound, never listening, so a port 0 is chosen once
for all), starts the workers, passes their messages on, restarts one that dies, and stops them
all on Ctrl-C or SIGTERM. What the workers share is what the state backend shares: nothing with
`state.backend: memory` (each has its own breakers, limits, budgets and tasks), everything that
docs/deploying.md#what-is-shared lists with Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

READY_MARK = "conclave: serving MCP on "
RESTART_DELAY_SECONDS = 1.0
START_TIMEOUT_SECONDS = 60.0
# A worker that dies this soon after starting, this many times in a row, will not do better
# when started again: the supervisor gives up rather than loop.
EARLY_DEATH_SECONDS = 10.0
EARLY_DEATHS_TOLERATED = 5


def reuse_port_available() -> bool:
    return hasattr(socket, "SO_REUSEPORT")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT: workers bind the same port beside it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[str]
    ready: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    early_deaths: int = 0


class Supervisor:
    def __init__(self, host: str, port: int, count: int, serve_args: Sequence[str]) -> None:
        self._host = host
        self._count = count
        self._serve_args = list(serve_args)
        self._holder = reuse_port_socket(host, port)
        self.port: int = self._holder.getsockname()[1]
        self._stopping = threading.Event()
        self._workers: list[_Worker] = []

    def run(self) -> int:
        """Serve until interrupted; the exit status of the whole group."""
        previous = signal.signal(signal.SIGTERM, lambda *_: self._stopping.set())
        try:
            self._workers = [self._start(index) for index in range(self._count)]
            if not self._await_ready():
                print("conclave serve: a worker did not start; stopping", file=sys.stderr)
                return 1
            print(
                f"{READY_MARK}http://{self._host}:{self.port}/mcp and JSON-RPC on /rpc "
                f"({self._count} worker processes)",
                file=sys.stderr,
                flush=True,
            )
            return self._supervise()
        except KeyboardInterrupt:  # Ctrl-C is how a server is stopped
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._stop_all()
            self._holder.close()

    def _start(self, index: int) -> _Worker:
        command = [
            sys.executable,
            "-m",
            "conclave",
            "serve",
            "--http",
            f"[{self._host}]:{self.port}" if ":" in self._host else f"{self._host}:{self.port}",
            f"--worker-of={os.getpid()}",
            *self._serve_args,
        ]
        # our own interpreter and CLI, with the arguments this command was given
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # noqa: S603
        worker = _Worker(index, process)
        assert process.stderr is not None
        threading.Thread(target=self._relay, args=(worker, process.stderr), daemon=True).start()
        return worker

    def _relay(self, worker: _Worker, stream: IO[str]) -> None:
        """A worker's messages, passed on with its number; its ready line is kept to ourselves."""
        for line in stream:
            if line.startswith(READY_MARK) and not worker.ready.is_set():
                worker.ready.set()
                continue
            sys.stderr.write(f"[worker {worker.index}] {line}")
            sys.stderr.flush()

    def _await_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        for worker in self._workers:
            while not worker.ready.wait(0.1):
                if (
                    worker.process.poll() is not None
                    or time.monotonic() > deadline
                    or self._stopping.is_set()
                ):
                    return False
        return True

    def _supervise(self) -> int:
        """Restart workers that die until stopped (0), or give up on one that keeps dying (1)."""
        while not self._stopping.wait(0.5):
            for position, worker in enumerate(self._workers):
                status = worker.process.poll()
                if status is None or self._stopping.is_set():
                    continue
                early = time.monotonic() - worker.started < EARLY_DEATH_SECONDS
                deaths = worker.early_deaths + 1 if early else 0
                if deaths >= EARLY_DEATHS_TOLERATED:
                    print(
                        f"conclave serve: worker {worker.index} died {deaths} times in a row right "
                        "after starting; stopping (its messages above say why)",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                print(
                    f"conclave serve: worker {worker.index} exited with status {status}; restarting it",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(RESTART_DELAY_SECONDS)
                replacement = self._start(worker.index)
                replacement.early_deaths = deaths
                self._workers[position] = replacement
        return 0

    def _stop_all(self) -> None:
        for worker in self._workers:
            if worker.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        for worker in self._workers:
            try:
                worker.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
