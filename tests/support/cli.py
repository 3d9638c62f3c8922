"""`talkbridge` as a real subprocess (`python -m talkbridge`), as a user runs it."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path


async def talkbridge(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    merged: bool = False,
) -> asyncio.subprocess.Process:
    """Start `talkbridge *args` with piped output; `env` is added to this process's environment.
    `merged`: stderr goes into stdout's pipe, so the two read in the order they were written."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "talkbridge",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merged else asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    """Wait for the process to end: its exit code, stdout and stderr. One that does not end
    within a minute fails the test and is killed, not left running after it."""
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def write_config(folder: Path, connections: str) -> Path:
    """`folder/talkbridge.yaml`: a SQLite store in `folder` and `connections` (the YAML list
    under `connections:`, as a user writes it)."""
    config = folder / "talkbridge.yaml"
    body = f"store: sqlite:///{folder}/talkbridge.db\nconnections:\n{connections}"
    config.write_text(body, encoding="utf-8")
    return config


async def check(
    config: Path, *args: str, env: Mapping[str, str] | None = None
) -> tuple[int, list[str], str]:
    """`talkbridge check --config config *args`: its exit code, its table's lines (stdout),
    and all it printed (stdout and stderr, where no secret may appear)."""
    process = await talkbridge("check", "--config", str(config), *args, env=env)
    code, out, err = await finish(process)
    return code, out.splitlines(), out + err
