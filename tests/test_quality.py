"""The project's own gates: ruff (lint and format) and mypy --strict on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_lint_and_format_are_clean() -> None:
    lint = _run("ruff", "check", "talkbridge", "tests", "benchmarks")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run("ruff", "format", "--check", "talkbridge", "tests", "benchmarks")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict_is_clean() -> None:
    result = _run("mypy", "--strict", "talkbridge")
    assert result.returncode == 0, result.stdout + result.stderr
