"""Servers the HTTP benchmarks start in their own processes, as a user runs them.

``server_process`` starts a command on a free port, returns once its ``/health`` answers
(a process that exits first is an error, with the end of its log), and stops it on exit.
``speclane_server`` runs ``speclane serve`` that way; ``bench/llama_cpp.py`` runs
llama.cpp's ``llama-server``. ``ServerProcess.resident_mib`` reads the process's resident
memory, what the server holds once loaded.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from speclane.config import EngineConfig

LOG_TAIL_CHARS = 2000


@dataclass(frozen=True)
class ServerProcess:
    url: str  # http://127.0.0.1:PORT
    pid: int

    def resident_mib(self) -> float | None:
        """The process's resident memory (VmRSS) in MiB, or None where /proc has none."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            return None
        return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(command: list[str], port: int, timeout_s: float = 300) -> Iterator[ServerProcess]:
    """``command`` (which listens on ``port``) running until the block ends; its output goes
    to a temporary log, quoted when the server dies or never becomes healthy."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, process, log, timeout_s)
            yield ServerProcess(url, process.pid)
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
            if process.poll() is None:
                process.kill()
                process.wait()


def _wait_healthy(url: str, process: subprocess.Popen, log, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with status {process.returncode} before serving:\n"
                               f"{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not become healthy in {timeout_s:.0f} s:\n{_tail(log)}")


def _tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-LOG_TAIL_CHARS:]


@contextlib.contextmanager
def speclane_server(config: EngineConfig, extra: Sequence[str] = ()) -> Iterator[ServerProcess]:
    """``speclane serve`` of ``config``'s model on its threads (the rest of the engine
    options at their defaults, or as ``extra`` arguments set them), in its own process."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("speclane")), "serve", "--model", config.model.model,
               "--num-threads", str(config.model.num_threads or 2), "--port", str(port), *extra]
    with server_process(command, port) as server:
        yield server
