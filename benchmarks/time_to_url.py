"""Time from `talkbridge run` to the printed webchat URL, with Telegram, Slack and Discord
connections configured (pointed at a closed port on 127.0.0.1: no platform is reached), against
the baseline of the same run with the webchat only.

    .venv/bin/python benchmarks/time_to_url.py [runs]

Prints each run's seconds to "starting…" and to the URL, then the medians and their ratio.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(folder: Path, connections: bool) -> Path:
    dead = f"http://127.0.0.1:{closed_port()}"
    path = folder / "talkbridge.yaml"
    if not connections:
        path.write_text(f"store: sqlite:///{folder}/talkbridge.db\nwebchat: {{port: 0}}\n")
        return path
    path.write_text(
        f"store: sqlite:///{folder}/talkbridge.db\n"
        "webchat: {port: 0}\n"
        "connections:\n"
        f"  - {{id: tg, channel: telegram, token: '1:x', api_base: '{dead}'}}\n"
        f"  - {{id: sl, channel: slack, bot_token: xoxb-1, app_token: xapp-1,"
        f" api_base: '{dead}/api/'}}\n"
        f"  - {{id: dc, channel: discord, token: x, api_base: '{dead}/api/v10',"
        f" gateway_url: 'ws://127.0.0.1:{closed_port()}'}}\n",
        encoding="utf-8",
    )
    return path


def one_run(path: Path) -> tuple[float, float]:
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "talkbridge", "run", "--config", str(path), "--log-level", "error"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "0"},
    )
    assert proc.stderr is not None and proc.stdout is not None
    starting = url = 0.0
    line = proc.stderr.readline()
    if "starting" in line:
        starting = time.monotonic() - began
    while True:
        out = proc.stdout.readline()
        if not out:
            raise SystemExit(f"no URL; stderr: {proc.stderr.read()}")
        if out.startswith("http"):
            url = time.monotonic() - began
            break
    proc.terminate()
    proc.wait(30)
    return starting, url


def median_to_url(connections: bool, runs: int) -> float:
    label = "telegram+slack+discord" if connections else "webchat only"
    with tempfile.TemporaryDirectory() as tmp:
        path = config(Path(tmp), connections)
        one_run(path)  # warm-up: .pyc files and the page cache
        urls = []
        for n in range(runs):
            starting, url = one_run(path)
            urls.append(url)
            print(f"{label} run {n + 1}: starting… at {starting:.2f}s, URL at {url:.2f}s")
    median = statistics.median(urls)
    print(f"{label}: median time to URL {median:.2f}s over {runs} runs")
    return median


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    baseline = median_to_url(False, runs)
    configured = median_to_url(True, runs)
    print(f"ratio (three connections / webchat only): {configured / baseline:.2f}x")


if __name__ == "__main__":
    main()
