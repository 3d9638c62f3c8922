"""The command that installs a connector's extra, the way talkbridge itself was installed.

Someone who installed talkbridge from a clone (`pip install -e .`, as the README does) must add
an extra from that clone too: `pip install 'talkbridge[slack]'` would fetch whatever PyPI calls
"talkbridge" instead. How it was installed is in the distribution's `direct_url.json` (PEP 610).
The command runs this interpreter's pip, so it installs where talkbridge runs, venv or not.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib.metadata import distributions
from urllib.parse import urlsplit
from urllib.request import url2pathname


def install_command(extra: str, direct_url: str | None, python: str = sys.executable) -> str:
    """`python -m pip install` of `talkbridge[extra]`: from the folder talkbridge was installed
    from (`-e` if it was editable), as `direct_url` (the `direct_url.json` text) says, else from
    PyPI."""
    pip = f"{shlex.quote(python)} -m pip install"
    found = _local_folder(direct_url)
    if found is None:
        return f"{pip} {shlex.quote(f'talkbridge[{extra}]')}"
    folder, editable = found
    return f"{pip}{' -e' if editable else ''} {shlex.quote(f'{folder}[{extra}]')}"


def installed_direct_url() -> str | None:
    """The installed talkbridge's `direct_url.json` (None: installed from an index, or not
    installed at all, e.g. run from a source tree on `PYTHONPATH`). Every distribution of the
    name is looked at: run from a clone's folder (`python -m talkbridge`), the build's
    `talkbridge.egg-info` there comes first, and it has none."""
    for found in distributions(name="talkbridge"):
        text = found.read_text("direct_url.json")
        if text:
            return text
    return None


def _local_folder(direct_url: str | None) -> tuple[str, bool] | None:
    """The local folder installed from and whether it was editable; None for anything else (an
    index, an archive, a VCS URL) or a file that cannot be read."""
    if not direct_url:
        return None
    try:
        info = json.loads(direct_url)
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("dir_info"), dict):
        return None
    url = info.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme != "file":
        return None
    return url2pathname(urlsplit(url).path), bool(info["dir_info"].get("editable"))
