"""The project's own gates: ruff (lint and format) and mypy --strict on the package."""

from __future__ import annotations

import ast
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


# Each platform's SDK belongs to its own connector folder; the core reaches connectors only
# through the channel catalog (`talkbridge.connectors`), never a connector's own modules.
PLATFORM_SDKS = {
    "aiogram": "telegram",
    "slack_sdk": "slack",
    "discord": "discord",
    "aioimaplib": "email",
    "aiosmtplib": "email",
    "publicsuffixlist": "email",
}
CORE_FOLDERS = ("router", "store", "agents", "hooks", "cluster")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _package_modules() -> list[tuple[Path, set[str]]]:
    return [(p.relative_to(ROOT), _imports(p)) for p in sorted((ROOT / "talkbridge").rglob("*.py"))]


def test_platform_sdks_are_imported_only_inside_their_connector() -> None:
    strays = [
        f"{path} imports {name}"
        for path, names in _package_modules()
        for name in names
        if (channel := PLATFORM_SDKS.get(name.split(".")[0]))
        and path.parts[1:3] != ("connectors", channel)
    ]
    assert strays == []


def test_the_core_imports_no_connector_module() -> None:
    strays = [
        f"{path} imports {name}"
        for path, names in _package_modules()
        if path.parts[1] in CORE_FOLDERS
        for name in names
        if name.startswith("talkbridge.connectors.")
    ]
    assert strays == []
