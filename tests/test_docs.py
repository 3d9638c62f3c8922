"""The docs say what the code does: the README's hook is the one `init` writes, and the reference
lists every top-level key, environment variable and exit code."""

from __future__ import annotations

import re
from pathlib import Path

from talkbridge.config import BridgeConfig

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "talkbridge" / "init_template" / "files"


def test_the_readme_shows_the_hook_init_writes() -> None:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("`talkbridge init` wrote `hooks/channel-message/keyword-router/hook.py`:")
    shown = after[1].split("```python\n", 1)[1].split("```\n", 1)[0]
    assert shown == (TEMPLATE / "hooks/channel-message/keyword-router/hook.py").read_text()


def test_the_reference_lists_every_top_level_key() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    table = reference.split("## Top level", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE))
    keys = {name for name, field in BridgeConfig.model_fields.items() if not field.exclude}
    assert keys == listed


def test_the_command_line_reference_names_the_environment_and_exit_codes() -> None:
    reference = (ROOT / "docs" / "configuration.md").read_text()
    commands = reference.split("## Command line", 1)[1]
    assert "Every command takes" not in commands  # `init` takes no --config
    for name in ("TALKBRIDGE_CONFIG", "TALKBRIDGE_LOG", "TALKBRIDGE_NODE_ID", "--version"):
        assert name in commands
    for code in ("0", "1", "2", "130"):
        assert f"\n| {code} |" in commands
