"""Loading hook folders: each kind, layouts, and precise errors for broken folders."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest

from talkbridge.agents.base import Result, TurnContext
from talkbridge.errors import HookLoadError
from talkbridge.hooks import (
    KINDS,
    Drop,
    HookDeps,
    HookRegistry,
    Modify,
    RouteToAgent,
    load_hook_folders,
    load_hooks,
)
from talkbridge.hooks.calls import shown_path

from .support import make_ctx, make_msg

TEMPLATE = Path(__file__).parents[2] / "talkbridge/init_template/files/hooks/channel-message"


def write_hook(folder: Path, code: str, spec: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hook.py").write_text(textwrap.dedent(code), encoding="utf-8")
    if spec is not None:
        (folder / "hook.yaml").write_text(textwrap.dedent(spec), encoding="utf-8")
    return folder


def deps(registry: HookRegistry, **context: Any) -> HookDeps:
    return HookDeps(
        app_id="test",
        logger=logging.getLogger("test.hooks"),
        router=None,
        agent_runner=None,
        context=dict(context),
        hooks=registry,
    )


ROUTER = """
from talkbridge.hooks import RouteToAgent

class Router:
    def __init__(self, agent):
        self.agent = agent

    async def on_message(self, msg):
        return RouteToAgent(self.agent)

def create_hook(deps):
    return Router(deps.context["agent"])
"""


async def test_declarative_channel_message_in_nested_layout(tmp_path: Path) -> None:
    root = tmp_path / "hooks" / "channel-message"
    write_hook(root / "b-router", ROUTER, "order: 5\nfilter: {channels: [telegram]}\n")
    write_hook(
        root / "a-dropper",
        """
        from talkbridge.hooks import Drop
        async def drop(msg):
            return Drop("closed") if "closed" in msg.text else None
        def create_hook(deps):
            return drop
        """,
    )
    registry = HookRegistry()
    loaded = load_hooks([root], deps(registry, agent="billing"), registry)
    assert [(h.kind, h.name) for h in loaded] == [
        ("channel-message", "a-dropper"),
        ("channel-message", "b-router"),
    ]
    decide = registry.channel_message.decide
    assert (await decide(make_msg("we are closed"))).decision == Drop("closed")
    assert (await decide(make_msg("hi"))).decision is None  # b-router filters on telegram
    routed = await decide(make_msg("hi", channel="telegram"))
    assert routed.decision == RouteToAgent("billing") and routed.decided_by == "b-router"


async def test_a_hook_imports_its_own_modules_beside_hook_py(tmp_path: Path) -> None:
    """A hook split into modules (`helpers.py` beside `hook.py`) failed to load: a relative
    import had "no known parent package" and `import helpers` found nothing. Each folder is a
    package now; two folders' `helpers.py` stay apart; `import helpers` says how to write it."""
    root = tmp_path / "hooks" / "channel-message"
    for name, agent in (("a", "billing"), ("b", "support")):
        (root / name).mkdir(parents=True)
        (root / name / "helpers.py").write_text(f"AGENT = {agent!r}\n")
        write_hook(
            root / name,
            f"""
            from talkbridge.hooks import RouteToAgent
            from .helpers import AGENT
            async def route(msg):
                return RouteToAgent(AGENT) if msg.text == {name!r} else None
            def create_hook(deps):
                return route
            """,
        )
    registry = HookRegistry()
    load_hooks([root], deps(registry), registry)
    decide = registry.channel_message.decide
    assert (await decide(make_msg("a"))).decision == RouteToAgent("billing")
    assert (await decide(make_msg("b"))).decision == RouteToAgent("support")

    write_hook(root / "c", "import helpers\ndef create_hook(deps): ...\n")
    (root / "c" / "helpers.py").write_text("")
    with pytest.raises(HookLoadError, match=r"No module named 'helpers' \(a module beside "):
        load_hooks([root / "c"], deps(HookRegistry()), HookRegistry())


async def test_folder_named_after_its_kind_is_itself_a_hook(tmp_path: Path) -> None:
    folder = write_hook(tmp_path / "channel-message", ROUTER)
    registry = HookRegistry()
    load_hooks([folder], deps(registry, agent="x"), registry)
    assert registry.kind_of("channel-message") == "channel-message"


def test_imperative_channel_message_hook_is_registered_and_returned(tmp_path: Path) -> None:
    folder = write_hook(
        tmp_path / "channel-message" / "mirror",
        """
        class Mirror:
            def __init__(self, log):
                self.log = log
            def register(self):
                self.log.append("register")
            def register_connection(self, connection_id):
                self.log.append(connection_id)

        def create_hook(deps):
            return Mirror(deps.context["log"])
        """,
    )
    log: list[str] = []
    registry = HookRegistry()
    objects = load_hook_folders([folder], deps(registry, log=log), registry)
    assert log == ["register"]
    assert len(objects) == 1
    objects[0].register_connection("telegram-1")
    registry.register_connection("slack-1")
    assert log == ["register", "telegram-1", "slack-1"]


async def test_other_kinds_load(tmp_path: Path) -> None:
    record: list[Any] = []
    write_hook(
        tmp_path / "turn-middleware" / "shout",
        """
        class Shout:
            async def handle(self, ctx, next):
                ctx.input.prompt = ctx.input.prompt.upper()
                await next()
        def create_hook(deps):
            return Shout()
        """,
        "order: 3\non_error: fail-closed\n",
    )
    write_hook(
        tmp_path / "agent-turn-started",
        "def create_hook(deps):\n"
        "    return lambda event: deps.context['record'].append(event.type)\n",
    )
    write_hook(
        tmp_path / "watchers" / "done",
        """
        class Done:
            def on_turn_finished(self, event):
                self.record.append(event.status)
        def create_hook(deps):
            d = Done(); d.record = deps.context["record"]; return d
        """,
        "kind: agent-turn-finished\n",
    )
    write_hook(
        tmp_path / "run-listener",
        """
        class Audit:
            def before_run(self, ctx):
                ctx.state["audited"] = True
        def create_hook(deps):
            return Audit()
        """,
    )
    write_hook(
        tmp_path / "chat",
        "def create_hook(deps):\n    return lambda messages: messages.append('extra')\n",
    )
    write_hook(
        tmp_path / "reply",
        """
        class Canned:
            def on_reply(self, messages):
                return "canned"
        def create_hook(deps):
            return Canned()
        """,
    )
    write_hook(
        tmp_path / "durable",
        "async def audit(event):\n    pass\ndef create_hook(deps):\n    return audit\n",
    )
    registry = HookRegistry()
    folders = [
        tmp_path / name
        for name in (
            "turn-middleware",
            "agent-turn-started",
            "watchers",
            "run-listener",
            "chat",
            "reply",
            "durable",
        )
    ]
    loaded = load_hooks(folders, deps(registry, record=record), registry)
    assert {h.kind for h in loaded} == set(KINDS) - {"channel-message"}
    assert registry.names()["done"] == "agent-turn-finished"
    assert list(registry.durable) == ["durable"]

    prompts: list[str] = []

    async def agent(ctx: TurnContext) -> None:
        prompts.append(ctx.input.prompt)
        await ctx.emit(Result(text="ok"))

    ctx = make_ctx("quiet")
    await registry.compose_turn(agent)(ctx)
    assert prompts == ["QUIET"]
    assert (
        registry.middlewares()[0].order == 3 and registry.middlewares()[0].on_error == "fail-closed"
    )
    registry.lifecycle.started(ctx)
    registry.lifecycle.finished(ctx, "completed")
    await registry.drain()
    assert sorted(record) == ["agent-turn-started", "completed"]
    await registry.listeners.before_run(ctx)
    assert ctx.state["audited"] is True
    assert await registry.chat.run_chat(["m"]) == ["m", "extra"]
    assert (await registry.chat.run_reply([], "agent")).reply == "canned"


def test_the_bundled_example_hook_loads(tmp_path: Path) -> None:
    registry = HookRegistry()
    loaded = load_hooks([TEMPLATE], deps(registry), registry)
    assert [(h.kind, h.name) for h in loaded] == [("channel-message", "keyword-router")]


async def test_bundled_example_modifies_refund_messages() -> None:
    registry = HookRegistry()
    load_hooks([TEMPLATE], deps(registry), registry)
    outcome = await registry.channel_message.decide(make_msg("I want a refund"))
    assert outcome.message.text == "[billing] I want a refund" and outcome.decision is None
    assert isinstance(Modify, type)


def test_syntax_error_names_file_line_and_message(tmp_path: Path) -> None:
    folder = write_hook(tmp_path / "channel-message", "x = 1\n\ndef create_hook(deps)\n    pass\n")
    registry = HookRegistry()
    with pytest.raises(HookLoadError) as info:
        load_hooks([folder], deps(registry), registry)
    text = str(info.value)
    assert str(folder) in text and "hook.py, line 3" in text and "expected ':'" in text


def test_import_error_names_the_module_and_line(tmp_path: Path) -> None:
    folder = write_hook(tmp_path / "chat", "import json\nimport not_a_real_module_xyz\n")
    registry = HookRegistry()
    with pytest.raises(HookLoadError, match=r"hook.py line 2: ModuleNotFoundError.*not_a_real"):
        load_hooks([folder], deps(registry), registry)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("def make(deps):\n    return None\n", "does not define create_hook"),
        (
            "def create_hook(deps):\n    raise KeyError('api_key')\n",
            "create_hook raised at {folder}/hook.py line 2: KeyError: 'api_key'",
        ),
        ("def create_hook(deps):\n    return None\n", "returned None"),
        ("async def create_hook(deps):\n    return 1\n", "plain function (not async)"),
        ("def create_hook(deps):\n    return 42\n", "neither a ChannelMessageHook"),
        (
            "class Router:\n    async def on_message(self, msg):\n        return None\n"
            "def create_hook(deps):\n    return Router\n",
            "returned the class Router, not a hook: return Router(...)",
        ),
    ],
)
def test_broken_hook_modules(tmp_path: Path, code: str, words: str) -> None:
    folder = write_hook(tmp_path / "channel-message" / "broken", code)
    registry = HookRegistry()
    with pytest.raises(HookLoadError) as info:
        load_hooks([folder], deps(registry), registry)
    assert str(folder) in str(info.value) and words.format(folder=folder) in str(info.value)


def test_wrong_interface_for_middleware(tmp_path: Path) -> None:
    folder = write_hook(
        tmp_path / "turn-middleware" / "nope", "def create_hook(deps):\n    return object()\n"
    )
    registry = HookRegistry()
    with pytest.raises(HookLoadError, match=r"nope \(turn-middleware\).*handle\(ctx, next\)"):
        load_hooks([folder], deps(registry), registry)


def test_unknown_kind_names_folder_and_lists_kinds(tmp_path: Path) -> None:
    registry = HookRegistry()
    bogus = write_hook(
        tmp_path / "x", "def create_hook(deps):\n    return print\n", "kind: bogus\n"
    )
    with pytest.raises(HookLoadError) as info:
        load_hooks([bogus], deps(registry), registry)
    assert str(bogus) in str(info.value) and "'bogus'" in str(info.value)
    assert all(kind in str(info.value) for kind in KINDS)
    unnamed = write_hook(tmp_path / "misc" / "thing", "def create_hook(deps):\n    return print\n")
    with pytest.raises(HookLoadError, match=r"cannot tell its kind.*channel-message"):
        load_hooks([unnamed], deps(registry), registry)


def test_bad_yaml_keys_missing_and_empty_folders(tmp_path: Path) -> None:
    registry = HookRegistry()
    folder = write_hook(tmp_path / "chat", ROUTER, "kind: chat\nordr: 3\n")
    with pytest.raises(HookLoadError, match=r"hook.yaml: ordr: unknown key; did you mean order\?"):
        load_hooks([folder], deps(registry), registry)
    with pytest.raises(HookLoadError, match="does not exist"):
        load_hooks([tmp_path / "nowhere"], deps(registry), registry)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(HookLoadError, match=r"no hook\.py"):
        load_hooks([tmp_path / "empty"], deps(registry), registry)


def test_failure_rolls_back_hooks_loaded_by_the_same_call(tmp_path: Path) -> None:
    good = write_hook(tmp_path / "channel-message" / "good", ROUTER)
    bad = write_hook(tmp_path / "reply", "def create_hook(deps):\n    return 1\n")
    registry = HookRegistry()
    with pytest.raises(HookLoadError, match="reply"):
        load_hooks([good, bad], deps(registry, agent="x"), registry)
    assert registry.names() == {} and not registry.channel_message.has_listeners()


def test_each_hook_logs_under_its_own_name(tmp_path: Path) -> None:
    code = """
        async def keep(msg):
            return None

        def create_hook(deps):
            deps.context["loggers"].append(deps.logger.name)
            return keep
        """
    root = tmp_path / "hooks" / "channel-message"
    write_hook(root / "billing", code)
    write_hook(root / "spam-filter", code)
    registry = HookRegistry()
    loggers: list[str] = []
    load_hooks([root], deps(registry, loggers=loggers), registry)
    assert loggers == ["talkbridge.hooks.billing", "talkbridge.hooks.spam-filter"]


def test_a_durable_hook_that_is_not_async_is_a_load_error_naming_the_fix(tmp_path: Path) -> None:
    write_hook(tmp_path / "durable", "def create_hook(deps):\n    return lambda event: None\n")
    registry = HookRegistry()
    with pytest.raises(HookLoadError, match="must be an async function"):
        load_hooks([tmp_path / "durable"], deps(registry), registry)


def test_one_name_under_two_kinds_says_which_folder_has_it_and_how_to_rename(
    tmp_path: Path,
) -> None:
    """`log` under agent-turn-started and agent-turn-finished said only that a hook named
    'log' was already registered: names are unique across kinds, and the error says where
    the other one is and what to write in hook.yaml."""
    registry = HookRegistry()
    watcher = "def create_hook(deps):\n    return lambda event: None\n"
    started = write_hook(tmp_path / "hooks/agent-turn-started/log", watcher)
    finished = write_hook(tmp_path / "hooks/agent-turn-finished/log", watcher)
    with pytest.raises(HookLoadError) as err:
        load_hooks([started, finished], deps(registry), registry)
    assert str(err.value) == (
        f"hook folder {finished} (agent-turn-finished): the name 'log' is taken by hook folder "
        f"{started} (agent-turn-started); hook names are unique, whatever their kind: give "
        "this one its own in hook.yaml (name: log-agent-turn-finished)"
    )
    assert registry.names() == {}  # the first one is unregistered again

    (finished / "hook.yaml").write_text("name: log-agent-turn-finished\n")
    loaded = load_hooks([started, finished], deps(registry), registry)
    assert [(h.kind, h.name) for h in loaded] == [
        ("agent-turn-started", "log"),
        ("agent-turn-finished", "log-agent-turn-finished"),
    ]


def test_a_hook_yaml_key_the_kind_does_not_take_names_the_keys_it_does(tmp_path: Path) -> None:
    registry = HookRegistry()
    folder = write_hook(
        tmp_path / "hooks/turn-middleware/polite",
        "async def mw(ctx, next):\n    await next()\n\ndef create_hook(deps):\n    return mw\n",
        "order: 1\ntimeout: 5\n",
    )
    with pytest.raises(HookLoadError) as err:
        load_hooks([folder], deps(registry), registry)
    assert str(err.value) == (
        f"hook folder {folder}: hook.yaml: timeout: does not apply to kind turn-middleware, "
        "which takes kind, name, on_error, order (see docs/hooks.md)"
    )


async def test_a_filter_takes_numeric_thread_ids_and_refuses_an_event_type_that_never_comes(
    tmp_path: Path,
) -> None:
    """`thread_ids: [-100123]` (a Telegram group, unquoted) was refused as no string, and
    `event_types: [edit]` loaded a hook that never ran: the types are message and
    message.edited."""
    registry = HookRegistry()
    code = "def create_hook(deps):\n    return lambda msg: None\n"
    folder = write_hook(
        tmp_path / "hooks/channel-message/one", code, "filter: {event_types: edit}\n"
    )
    with pytest.raises(HookLoadError) as err:
        load_hook_folders([folder], deps(registry), registry, connection_ids=[])
    assert str(err.value) == (
        f"hook folder {folder}: hook.yaml: filter.event_types: edit matches nothing here "
        "(known: message, message.edited); the hook would never run"
    )

    registry = HookRegistry()
    (folder / "hook.yaml").write_text("filter: {thread_ids: [-100123], event_types: message}\n")
    [loaded] = load_hooks([folder], deps(registry), registry)
    assert loaded.filter is not None and loaded.filter.thread_ids == {"-100123"}
    assert loaded.filter.event_types == {"message"}


@pytest.mark.parametrize(
    ("kind", "code", "error"),
    [
        (
            "channel-message",
            "def create_hook(deps):\n    async def on_message(msg, extra, more):\n"
            "        return None\n    return on_message\n",
            "channel-message hook 'it': on_message(msg, extra, more) ({file} line 2) cannot be "
            "called as on_message(msg, ctx): missing a required argument: 'more'",
        ),
        (
            "turn-middleware",
            "def create_hook(deps):\n    async def mw(ctx):\n        pass\n    return mw\n",
            "turn-middleware hook 'it': mw(ctx) ({file} line 2) cannot be called as "
            "mw(ctx, next): too many positional arguments",
        ),
        (
            "agent-turn-finished",
            "class Watcher:\n    async def on_turn_finished(self):\n        pass\n\n"
            "def create_hook(deps):\n    return Watcher()\n",
            "agent-turn-finished hook 'it': on_turn_finished() ({file} line 2) cannot be called "
            "as on_turn_finished(event): too many positional arguments",
        ),
        (
            "run-listener",
            "class Listener:\n    async def after_run(self, ctx):\n        pass\n\n"
            "def create_hook(deps):\n    return Listener()\n",
            "run listener 'it' (after_run): after_run(ctx) ({file} line 2) cannot be called as "
            "after_run(ctx, result): too many positional arguments",
        ),
        (
            "durable",
            "def create_hook(deps):\n    async def on_event():\n        pass\n"
            "    return on_event\n",
            "durable hook 'it': on_event() ({file} line 2) cannot be called as on_event(event): "
            "too many positional arguments",
        ),
    ],
)
def test_a_hook_that_cannot_take_the_arguments_it_is_called_with_is_refused_at_load(
    tmp_path: Path, kind: str, code: str, error: str
) -> None:
    """Each loaded, then failed at every message (or turn, or event) with a TypeError."""
    registry = HookRegistry()
    folder = write_hook(tmp_path / kind / "it", code)
    with pytest.raises(HookLoadError) as err:
        load_hooks([folder], deps(registry), registry)
    file = folder / "hook.py"
    assert str(err.value) == f"hook folder {folder} ({kind}): " + error.format(file=file)
    assert registry.names() == {}


def test_a_create_hook_that_takes_no_deps_is_named_with_its_line(tmp_path: Path) -> None:
    registry = HookRegistry()
    code = "import os\n\ndef create_hook():\n    return lambda msg: None\n"
    folder = write_hook(tmp_path / "channel-message" / "it", code)
    with pytest.raises(HookLoadError) as err:
        load_hooks([folder], deps(registry), registry)
    assert str(err.value) == (
        f"hook folder {folder}: create_hook() ({folder / 'hook.py'} line 3) cannot be called as "
        "create_hook(deps): too many positional arguments"
    )


def test_a_method_of_another_kind_is_named_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel-message object that also has `on_turn_finished` was registered as a
    channel-message hook only, and that method silently never ran: the load says so, naming
    the file and line. Methods of its own kind, and `on_error` (an option too), say nothing."""
    folder = write_hook(
        tmp_path / "channel-message" / "moderator",
        """
        class Moderator:
            on_error = "fail-open"
            async def on_message(self, msg):
                return None
            async def on_turn_finished(self, event):
                pass
        def create_hook(deps):
            return Moderator()
        """,
    )
    registry = HookRegistry()
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        load_hooks([folder], deps(registry), registry)
    assert registry.names() == {"moderator": "channel-message"}
    assert [r.getMessage() for r in caplog.records] == [
        f"channel-message hook 'moderator': its on_turn_finished() ({shown_path(str(folder))}"
        "/hook.py line 6) is never called: the hook is registered as channel-message, and "
        "on_turn_finished() is what agent-turn-started or agent-turn-finished hooks call; to "
        "have it called, register it as that kind too (a hook folder of its own)"
    ]


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (  # loaded, then failed every turn: "object NoneType can't be used in 'await'"
            {
                "hook.py": "class Polite:\n    order = 0\n\n    def handle(self, ctx, next):\n"
                "        pass\n\ndef create_hook(deps):\n    return Polite()\n"
            },
            "turn-middleware hook 'mw': handle ({file} line 4) is a plain function (def): it must "
            "be async def handle(self, ctx, next), as what it returns is awaited",
        ),
        (  # was: "function has no async handle(ctx, next) method ...", with no file or line
            {
                "hook.py": "def polite(ctx, next):\n    pass\n\ndef create_hook(deps):\n"
                "    return polite\n"
            },
            "turn-middleware hook 'mw': polite ({file} line 1) is a plain function (def): it "
            "must be async def polite(ctx, next), as what it returns is awaited",
        ),
        (
            {"hook.py": "class Polite:\n    pass\n\ndef create_hook(deps):\n    return Polite()\n"},
            "turn-middleware hook 'mw': Polite ({file} line 1) has no async handle(ctx, next) "
            "method and is not an async function (ctx, next)",
        ),
    ],
    ids=["sync-handle", "sync-function", "no-handle"],
)
async def test_talkbridge_check_names_the_file_and_line_of_a_turn_middleware_that_cannot_load(
    tmp_path: Path, files: dict[str, str], error: str
) -> None:
    from tests.support.cli import finish, talkbridge

    folder = tmp_path / "hooks" / "turn-middleware" / "mw"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    (tmp_path / "talkbridge.yaml").write_text("hooks: [hooks/turn-middleware/mw]\n")
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 2 and out == ""
    assert err == (
        f"talkbridge: hook folder {folder} (turn-middleware): "
        + error.format(file="hooks/turn-middleware/mw/hook.py")
        + "\n"
    )


async def test_talkbridge_check_names_the_line_of_a_helper_module_that_fails_to_import(
    tmp_path: Path,
) -> None:
    """It named the `from .helpers import` line of hook.py, not the line that raised."""
    from tests.support.cli import finish, talkbridge

    folder = tmp_path / "hooks" / "turn-middleware" / "mw"
    folder.mkdir(parents=True)
    (folder / "hook.py").write_text(
        "from .helpers import polite\n\ndef create_hook(deps):\n    return polite\n"
    )
    (folder / "helpers.py").write_text("import os\n\nLIMIT = int(os.environ['NO_SUCH_VAR_X'])\n")
    (tmp_path / "talkbridge.yaml").write_text("hooks: [hooks/turn-middleware/mw]\n")
    code, _, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 2
    assert err == (
        f"talkbridge: hook folder {folder}: importing hook.py failed at "
        "hooks/turn-middleware/mw/helpers.py line 3: KeyError: 'NO_SUCH_VAR_X'\n"
    )
