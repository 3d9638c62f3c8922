"""The starter project `talkbridge init` writes: a config and one example hook."""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path


def _walk(node: Traversable, prefix: Path) -> list[tuple[Path, Traversable]]:
    found: list[tuple[Path, Traversable]] = []
    for child in node.iterdir():
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            found.extend(_walk(child, prefix / child.name))
        else:
            found.append((prefix / child.name, child))
    return found


def write_starter(target: Path, *, force: bool = False) -> tuple[list[Path], list[Path]]:
    """Copy the template into `target`: the files written, and those kept because they exist
    already (none with `force`, which overwrites them)."""
    entries = _walk(files(__package__).joinpath("files"), Path())
    written, kept = [], []
    for relative, source in sorted(entries, key=lambda e: str(e[0])):
        path = target / relative
        if path.exists() and not force:
            kept.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(source.read_bytes())
        written.append(path)
    return written, kept
