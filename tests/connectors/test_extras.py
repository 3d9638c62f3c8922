"""The install command a missing SDK's error gives follows how talkbridge was installed."""

from __future__ import annotations

import json

import pytest

from talkbridge.connectors.extras import install_command

PY = "/home/you/talkbridge/.venv/bin/python"


def _direct_url(url: str, **dir_info: bool) -> str:
    """A `direct_url.json` as pip writes it for an install from a folder (PEP 610)."""
    return json.dumps({"url": url, "dir_info": dir_info})


@pytest.mark.parametrize(
    ("direct_url", "command"),
    [
        # the README's `pip install -e .` from a clone: the extra from the same clone
        (
            _direct_url("file:///home/you/talkbridge", editable=True),
            f"{PY} -m pip install -e '/home/you/talkbridge[slack]'",
        ),
        # `pip install .`: from the folder again, not editable either
        (
            _direct_url("file:///home/you/talkbridge"),
            f"{PY} -m pip install '/home/you/talkbridge[slack]'",
        ),
        # a folder whose name a shell would split, written percent-encoded in the URL
        (
            _direct_url("file:///home/you/my%20bridge", editable=True),
            f"{PY} -m pip install -e '/home/you/my bridge[slack]'",
        ),
        # from an index (no direct_url.json), an archive or a repository: PyPI's name
        (None, f"{PY} -m pip install 'talkbridge[slack]'"),
        (
            json.dumps({"url": "https://example.com/tb.whl", "archive_info": {}}),
            f"{PY} -m pip install 'talkbridge[slack]'",
        ),
        ("{not json", f"{PY} -m pip install 'talkbridge[slack]'"),
    ],
    ids=["editable", "folder", "space", "index", "archive", "unreadable"],
)
def test_the_install_command_follows_how_talkbridge_was_installed(
    direct_url: str | None, command: str
) -> None:
    assert install_command("slack", direct_url, python=PY) == command


def test_the_interpreter_is_quoted_for_the_shell() -> None:
    command = install_command("email", None, python="/opt/my venv/bin/python")
    assert command == "'/opt/my venv/bin/python' -m pip install 'talkbridge[email]'"
