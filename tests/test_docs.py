"""The docs say what the code does: the README's hook is the one `init` writes, and the reference
lists every top-level key, environment variable and exit code."""

from __future__ import annotations

import importlib
import logging
import os
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

from talkbridge.config import BridgeConfig, ConnectionConfig, parse_config

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "talkbridge" / "init_template" / "files"
REFERENCE = ROOT / "docs" / "configuration.md"


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


@pytest.mark.parametrize("channel", ["telegram", "slack", "discord", "email"])
def test_the_reference_lists_every_key_of_each_channel(channel: str) -> None:
    module = importlib.import_module(f"talkbridge.connectors.{channel}.config")
    [model] = [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, ConnectionConfig)
        and v.__module__ == module.__name__
    ]
    section = REFERENCE.read_text(encoding="utf-8").split(f"### `channel: {channel}`")[1]
    section = section.split("\n## ")[0].split("\n### ")[0]
    missing = [
        key
        for key in model.model_fields
        if key not in ConnectionConfig.model_fields
        and f"`{key}`" not in section
        and f"`{key}." not in section
    ]
    assert missing == [], f"docs/configuration.md, channel {channel}: undocumented {missing}"


def test_the_readme_starts_from_a_clone_and_shows_what_run_prints() -> None:
    readme = (ROOT / "README.md").read_text()
    before_first_command = readme.split("```sh", 1)[0]
    assert "git clone" in before_first_command and "`cd talkbridge`" in before_first_command
    shown = readme.split("`talkbridge run` prints the address", 1)[1].split("```\n", 2)[1]
    assert shown.splitlines()[-1] == "Press Ctrl-C to stop."  # the third line `run` prints
    assert '_console.out("Press Ctrl-C to stop.")' in (ROOT / "talkbridge" / "cli.py").read_text()


async def test_a_run_in_the_clone_leaves_no_file_git_would_list(tmp_path: Path) -> None:
    """The README runs the bridge from the clone: every file the default store makes beside
    itself (the lock too) is one `.gitignore` names, so `git status` stays clean."""
    from talkbridge.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    store.lock_for_serving()  # as `talkbridge run` does
    made = sorted(os.listdir(tmp_path))
    await store.close()
    patterns = (ROOT / ".gitignore").read_text().split()
    listed = [name for name in made if not any(fnmatch(name, p) for p in patterns)]
    assert "talkbridge.db.lock" in made and listed == []


def test_the_slack_section_says_which_events_to_subscribe_to() -> None:
    """It named `message.channels` only: an app set up from it never heard a direct message,
    though the connector answers every one."""
    section = REFERENCE.read_text().split("### `channel: slack`")[1].split("\n### ")[0]
    for event in ("message.im", "message.channels", "message.groups", "app_mention"):
        assert f"`{event}`" in section
    for scope in ("chat:write", "im:history", "channels:history", "users:read"):
        assert f"`{scope}`" in section


def test_the_readme_that_offers_a_redis_store_says_it_must_keep_its_data() -> None:
    """A reader switching to Redis from the README never learnt that one without persistence
    loses the messages waiting to be answered (the reference says so, far below)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    offer = readme.split("`store: redis://", 1)[1].split("## 2.", 1)[0]
    assert "`appendonly yes`" in offer and "`talkbridge check` warns" in offer
    assert "`appendonly yes`" in REFERENCE.read_text()


def test_the_readme_and_the_starter_config_agree_on_connections_and_credentials() -> None:
    readme = (ROOT / "README.md").read_text()
    starter = (TEMPLATE / "talkbridge.yaml").read_text()
    section = readme.split("## 1. Configure a connection", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # as read, whatever the line breaks
    assert "replace the line `connections: []`" in section
    assert "\nconnections: []\n" in starter
    assert "a token written in the file itself works too" in section
    assert "never the file" not in starter and "a token written here\n# works too" in starter


@pytest.mark.parametrize("doc", ["docs/configuration.md", "README.md"])
def test_the_config_examples_of_the_docs_are_valid(
    doc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each YAML example that is a config of its own (top-level keys; not one list entry) is
    accepted as written: an example a reader copies never fails with a config error."""
    examples = re.findall(r"```yaml\n(.*?)```", (ROOT / doc).read_text(), re.DOTALL)
    configs = [data for data in map(yaml.safe_load, examples) if isinstance(data, dict)]
    assert configs, f"{doc}: no config example found"
    for name in {n for e in examples for n in re.findall(r"\$\{(\w+)\}", e)}:
        # Slack's tokens have their own prefixes; a Telegram bot token's shape fits the rest.
        shapes = {"SLACK_BOT_TOKEN": "xoxb-1-example", "SLACK_APP_TOKEN": "xapp-1-example"}
        monkeypatch.setenv(name, shapes.get(name, "123456:example-Value_1"))
    for data in configs:
        assert set(data) <= set(BridgeConfig.model_fields), data
        parse_config(data)


def test_the_readme_chooses_a_webchat_token_in_the_starter_config_and_exports_it() -> None:
    """Pasted as a block of its own, `webchat:` would be a key given twice in the starter; and
    a `${WEBCHAT_TOKEN}` nobody exported is a config error."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## 3. Chat in the webchat", 1)[1].split("\n## ", 1)[0]
    shown = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    starter = (TEMPLATE / "talkbridge.yaml").read_text()
    block = starter.split("\nwebchat:\n", 1)[1].split("\n\n", 1)[0]
    assert shown == "webchat:\n" + block.replace("  # tokens:", "  tokens:") + "\n"
    assert "export WEBCHAT_TOKEN=" in section


def test_the_hooks_doc_lists_the_hook_yaml_keys_each_kind_takes() -> None:
    from talkbridge.hooks.registry import KIND_OPTIONS

    doc = (ROOT / "docs" / "hooks.md").read_text()
    table = doc.split("| kind | `hook.yaml` keys besides `kind` and `name` |", 1)[1]
    rows = re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|$", table.split("\n\n", 1)[0], re.MULTILINE)
    listed: dict[str, set[str]] = {}
    for kinds, keys in rows:
        taken = set(re.findall(r"`(\w+)`", keys.split(" (")[0].split(":")[0]))
        for kind in re.findall(r"`([\w-]+)`", kinds):
            listed[kind] = taken
    assert listed == {kind: set(options) - {"scope"} for kind, options in KIND_OPTIONS.items()}


async def test_the_hooks_doc_middleware_example_is_a_hook_folder_as_it_stands(
    tmp_path: Path,
) -> None:
    """It had no `create_hook` (pasted into hook.py, the start stopped), and compared
    `agent_name` with the python agent's class `name` while the config example named the
    agent `mine`: it never ran."""
    from talkbridge.hooks import HookDeps, HookRegistry, load_hooks
    from tests.hooks.support import make_ctx

    doc = (ROOT / "docs" / "hooks.md").read_text()
    code = doc.split("## turn-middleware", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    first = code.splitlines()[0]
    assert first.startswith("# hooks/turn-middleware/"), "the example says which file it is"
    path = first.removeprefix("# ")
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(code)
    registry = HookRegistry()
    deps = HookDeps("test", logging.getLogger("test"), None, None, hooks=registry)  # type: ignore[arg-type]
    [hook] = load_hooks([(tmp_path / path).parent], deps, registry)
    assert (hook.kind, hook.name) == ("turn-middleware", "polite")

    block = REFERENCE.read_text().split("```yaml\nagents:", 1)[1].split("```", 1)[0]
    definitions = yaml.safe_load("agents:" + block)["agents"]["definitions"]
    [python_agent] = [name for name, d in definitions.items() if d["kind"] == "python"]
    seen: list[str] = []

    async def agent(ctx: Any) -> None:
        seen.append(ctx.input.prompt)

    turn = registry.compose_turn(agent)
    await turn(make_ctx("  hello  ", agent=python_agent))
    await turn(make_ctx("  hello  ", agent="echo"))
    assert seen == ["hello", "  hello  "]
