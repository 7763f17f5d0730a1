"""Start `python app.py` on a free port for the UI tests, and stop it (by its pid) afterwards."""
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 180
# Stop needs an answer that is still streaming: a story sampled warm from the shipped model often runs
# on; the tests try seeds in turn until an answer passes LONG_TOKENS still streaming, so a retrained
# model needs no test change.
LONG_PROMPT = "Tell me a long story about a dragon."
LONG_SAMPLING = {"temperature": 1.5, "max_tokens": 3000}   # hot enough that some seed writes past LONG_TOKENS
LONG_SEEDS = range(16)
LONG_TOKENS = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(*args: str, log_path: Path | None = None):
    """Yield the URL of a playground serving the shipped model; its output goes to `log_path`."""
    port = free_port()
    log = open(log_path or os.devnull, "w")
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), *args], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"app.py exited with {proc.returncode}; see {log_path}"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, f"app.py did not answer within {START_TIMEOUT_S} s"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
