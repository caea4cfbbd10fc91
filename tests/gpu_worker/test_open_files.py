"""The open-file soft limit (gpu_worker.open_files), in real processes started with a low soft
limit, as containerd 2.x starts them: the function raises it to the hard limit, and a real
gateway has done so by the time it serves."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hashring.ports import free_port

LOW = 256


def low_soft_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def soft_limit_of(pid: int) -> int:
    (line,) = [x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files")]
    return int(line.split()[3])


def test_the_soft_limit_is_raised_to_the_hard_limit():
    code = ("import resource; from gpu_worker.open_files import raise_open_file_limit; r = raise_open_file_limit(); "
            "print(r.before, r.after, resource.getrlimit(resource.RLIMIT_NOFILE)[1])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=low_soft_limit)
    assert done.returncode == 0, done.stderr
    before, after, hard = map(int, done.stdout.split())
    assert before == LOW and after > LOW
    assert after == hard if hard != resource.RLIM_INFINITY else after >= 1024
    assert "open files: soft limit" not in done.stdout  # logged, not printed


def test_a_gateway_serves_with_the_raised_limit(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOICERING_")}
    env |= {"VOICERING_GATEWAY_UPLOADS_DIR": str(tmp_path / "u"), "VOICERING_GATEWAY_VOICES_DIR": str(tmp_path / "v")}
    proc = subprocess.Popen([sys.executable, "-m", "voicering", "gateway", "--port", str(port), "--metrics-port",
                             str(free_port())], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=low_soft_limit)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the gateway never answered /health"
                time.sleep(0.2)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        assert soft_limit_of(proc.pid) == hard if hard != resource.RLIM_INFINITY else soft_limit_of(proc.pid) > LOW
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert f"open files: soft limit {LOW} -> " in out
