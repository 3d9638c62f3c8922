"""Load hook folders listed in the config.

A hook folder holds `hook.py` exporting `create_hook(deps) -> Hook` and an optional `hook.yaml`:

    kind: channel-message        # else the folder's name, else its parent folder's name
    name: keyword-router         # default: the folder's name
    order: 10
    on_error: fail-closed
    timeout: 5
    needs_thread_lock: false
    filter: {channels: [telegram], connection_ids: [support-bot]}

A listed folder without `hook.py` whose subfolders have one loads each subfolder (in name order), so
both `hooks/channel-message/` (itself a hook) and `hooks/channel-message/keyword-router/` work.
Every problem raises `HookLoadError` naming the folder and what exactly is wrong.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import logging
import re
import sys
import traceback
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from talkbridge.config import format_errors, read_yaml
from talkbridge.errors import ConfigError, HookLoadError
from talkbridge.hooks.calls import check_call, shown_path
from talkbridge.hooks.channel_message import EDIT_EVENT, MESSAGE_EVENT, ChannelMessageHook
from talkbridge.hooks.engine import HookFilter
from talkbridge.hooks.registry import (
    KIND_OPTIONS,
    KINDS,
    HookDeps,
    HookRegistry,
    is_connection_hook,
)

HOOK_FILE = "hook.py"
SPEC_FILE = "hook.yaml"
_module_ids = itertools.count(1)


class HookSpec(BaseModel):
    """The keys `hook.yaml` may set; anything else is refused by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str | None = None
    name: str | None = Field(default=None, min_length=1)
    order: int | None = None
    on_error: Literal["fail-open", "fail-closed"] | None = None
    timeout: float | None = Field(default=None, gt=0)
    needs_thread_lock: bool | None = None
    observer: bool | None = None
    event: str | None = None
    """run-listener: the one event a function listener handles."""
    filter: HookFilter | None = None


@dataclass(frozen=True, slots=True)
class LoadedHook:
    kind: str
    name: str
    folder: Path
    hook: Any
    """What `create_hook` returned."""
    filter: HookFilter | None = None

    @property
    def needs_connections(self) -> bool:
        """An imperative channel-message hook: the Bridge calls `register_connection` on it."""
        return self.kind == "channel-message" and is_connection_hook(self.hook)


def load_hook_folders(
    paths: list[Path],
    deps: HookDeps,
    registry: HookRegistry,
    connection_ids: Collection[str] | None = None,
) -> list[ChannelMessageHook]:
    """Load every listed folder into `registry`; returns the imperative channel-message hooks.

    Their `register()` was called at load; the Bridge calls `register_connection(id)` on each for
    every connection. `load_hooks` returns the details of every hook loaded. With
    `connection_ids` (the bridge's), a `filter` naming another connection, or a channel that
    does not exist, is an error: such a hook would silently never run.
    """
    loaded = load_hooks(paths, deps, registry)
    if connection_ids is not None:
        for item in loaded:
            _check_filter(item, set(connection_ids))
    return [item.hook for item in loaded if item.needs_connections]


def _check_filter(item: LoadedHook, connection_ids: set[str]) -> None:
    from talkbridge.connectors import known_channels

    spec = item.filter
    if spec is None:
        return
    if spec.direction == "outbound":  # the filter exists for events that may carry either
        raise HookLoadError(
            f"hook folder {item.folder}: hook.yaml: filter.direction: outbound matches nothing: "
            "hooks see the messages that come in (to change a reply, use turn middleware); "
            "the hook would never run"
        )
    for key, given, known in (
        ("channels", spec.channels, {*known_channels(), "webchat"}),  # the bundled one too
        ("connection_ids", spec.connection_ids, connection_ids),
        ("event_types", spec.event_types, {MESSAGE_EVENT, EDIT_EVENT}),
    ):
        unknown = sorted(set(given or ()) - known)
        if unknown:
            raise HookLoadError(
                f"hook folder {item.folder}: hook.yaml: filter.{key}: {', '.join(unknown)} "
                f"matches nothing here (known: {', '.join(sorted(known))}); "
                "the hook would never run"
            )


def load_hooks(paths: list[Path], deps: HookDeps, registry: HookRegistry) -> list[LoadedHook]:
    """Load every listed folder (and hook subfolders) into `registry`, in order.

    On failure, hooks this call already registered are unregistered again before the error is
    raised (an imperative hook's `register()` cannot be undone; load fails at start anyway).
    """
    if deps.hooks is None:
        deps.hooks = registry
    loaded: list[LoadedHook] = []
    try:
        for folder in hook_folders(paths):
            loaded.append(_load_folder(folder, deps, registry, loaded))
    except BaseException:
        for item in reversed(loaded):
            registry.unregister(item.name, missing_ok=True)
        raise
    return loaded


def hook_folders(paths: list[Path]) -> list[Path]:
    """The hook folders the listed ones stand for: each, or its subfolders with a `hook.py`."""
    return [folder for path in paths for folder in _hook_folders(Path(path))]


def _hook_folders(path: Path) -> list[Path]:
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise HookLoadError(f"hook folder {path}: {what}")
    if (path / HOOK_FILE).is_file():
        return [path]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and (p / HOOK_FILE).is_file())
    if not subs:
        raise HookLoadError(
            f"hook folder {path}: has no {HOOK_FILE}, and no subfolder has one either"
        )
    return subs


def _read_spec(folder: Path) -> HookSpec:
    file = folder / SPEC_FILE
    if not file.is_file():
        return HookSpec()
    try:
        data = read_yaml(file, "cannot read")
    except ConfigError as exc:
        raise HookLoadError(f"hook folder {folder}: {exc}") from None
    if data is None:
        return HookSpec()
    if not isinstance(data, dict):
        raise HookLoadError(f"hook folder {folder}: {SPEC_FILE} must be a mapping of keys")
    try:
        return HookSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(format_errors(exc, model=HookSpec))
        raise HookLoadError(f"hook folder {folder}: {SPEC_FILE}: {problems}") from None


def _resolve_kind(folder: Path, spec: HookSpec) -> str:
    if spec.kind is not None:
        if spec.kind not in KINDS:
            raise HookLoadError(
                f"hook folder {folder}: {SPEC_FILE} names unknown kind {spec.kind!r}; "
                f"kinds: {', '.join(KINDS)}"
            )
        return spec.kind
    for candidate in (folder.name, folder.parent.name):
        if candidate in KINDS:
            return candidate
    raise HookLoadError(
        f"hook folder {folder}: cannot tell its kind: set 'kind' in {SPEC_FILE} or name the folder "
        f"(or its parent) after a kind; kinds: {', '.join(KINDS)}"
    )


def _import(folder: Path) -> ModuleType:
    file = folder / HOOK_FILE
    slug = re.sub(r"\W", "_", folder.name)
    module_name = f"talkbridge_hook_{next(_module_ids)}_{slug}"
    # A package of its own: `from .helpers import x` finds `helpers.py` beside `hook.py`, and
    # two folders' `helpers.py` never mix.
    spec = importlib.util.spec_from_file_location(
        module_name, file, submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise HookLoadError(f"hook folder {folder}: cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        where = f"{exc.filename or file}, line {exc.lineno}"
        raise HookLoadError(f"hook folder {folder}: syntax error in {where}: {exc.msg}") from None
    except Exception as exc:
        del sys.modules[module_name]
        raise HookLoadError(
            f"hook folder {folder}: importing {HOOK_FILE} failed{_where(exc, file)}: "
            f"{type(exc).__name__}: {exc}{_beside(exc, folder)}"
        ) from exc
    return module


def _beside(exc: Exception, folder: Path) -> str:
    """The hint for `import helpers` of a module that sits beside `hook.py`."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if name and (folder / f"{name}.py").is_file():
        return f" (a module beside {HOOK_FILE} is imported relatively: from .{name} import ...)"
    return ""


def _where(exc: BaseException, file: Path) -> str:
    """` at FILE line N`: the innermost frame of the hook's own code (`hook.py`, or a module
    beside it that it imports), when there is one."""
    folder = file.parent
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if Path(f.filename).parent == folder and Path(f.filename).suffix == ".py"
    ]
    return f" at {shown_path(frames[-1].filename)} line {frames[-1].lineno}" if frames else ""


def _check_options(folder: Path, kind: str, spec: HookSpec) -> None:
    """A hook.yaml key the kind does not take (`timeout:` for turn middleware) is named with
    what the kind does take, before the module is imported."""
    given = spec.model_dump(exclude_none=True, exclude={"kind", "name"})
    wrong = sorted(set(given) - KIND_OPTIONS[kind])
    if wrong:
        takes = ", ".join(["kind", "name", *sorted(KIND_OPTIONS[kind] - {"scope"})])
        raise HookLoadError(
            f"hook folder {folder}: {SPEC_FILE}: {', '.join(wrong)}: does not apply to kind "
            f"{kind}, which takes {takes} (see docs/hooks.md)"
        )


def _check_name_free(
    folder: Path, kind: str, name: str, registry: HookRegistry, loaded: list[LoadedHook]
) -> None:
    """Hook names are unique across kinds (`unregister(name)` and the log name one hook), so
    `agent-turn-started/log` beside `agent-turn-finished/log` needs a `name:`: say so, naming
    the folder that has the name, before this one's module is imported."""
    owner = registry.kind_of(name)
    if owner is None:
        return
    holder = next((item for item in loaded if item.name == name), None)
    where = f"hook folder {holder.folder}" if holder else "a hook the app registered"
    suggestion = f"{name}-{folder.parent.name}" if folder.parent.name != name else f"{name}-2"
    raise HookLoadError(
        f"hook folder {folder} ({kind}): the name {name!r} is taken by {where} ({owner}); "
        f"hook names are unique, whatever their kind: give this one its own in {SPEC_FILE} "
        f"(name: {suggestion})"
    )


def _load_folder(
    folder: Path, deps: HookDeps, registry: HookRegistry, loaded: list[LoadedHook]
) -> LoadedHook:
    spec = _read_spec(folder)
    kind = _resolve_kind(folder, spec)
    _check_options(folder, kind, spec)
    _check_name_free(folder, kind, spec.name or folder.name, registry, loaded)
    module = _import(folder)
    create = getattr(module, "create_hook", None)
    file = folder / HOOK_FILE
    if create is None:
        raise HookLoadError(f"hook folder {folder}: {HOOK_FILE} does not define create_hook(deps)")
    if not callable(create):
        raise HookLoadError(f"hook folder {folder}: create_hook in {HOOK_FILE} is not a function")
    if inspect.iscoroutinefunction(create):
        raise HookLoadError(
            f"hook folder {folder}: create_hook must be a plain function (not async); "
            "start async work in the hook itself"
        )
    try:
        check_call(create, ("deps",), "")
    except TypeError as exc:
        raise HookLoadError(f"hook folder {folder}: {exc}") from None
    name = spec.name or folder.name
    # Each hook logs under its own name (`talkbridge.hooks.<name>`), so a line says which.
    own = replace(deps, logger=logging.getLogger(f"talkbridge.hooks.{name}"))
    try:
        hook = create(own)
    except Exception as exc:
        raise HookLoadError(
            f"hook folder {folder}: create_hook raised{_where(exc, file)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if hook is None:
        raise HookLoadError(f"hook folder {folder}: create_hook returned None instead of a hook")
    if inspect.isclass(hook):
        raise HookLoadError(
            f"hook folder {folder}: create_hook returned the class {hook.__name__}, not a hook: "
            f"return {hook.__name__}(...) (an instance)"
        )
    options = spec.model_dump(exclude_none=True, exclude={"kind", "name"})
    if "filter" in options:
        options["filter"] = spec.filter
    try:
        registry.register(kind, hook, name=name, **options)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise HookLoadError(f"hook folder {folder} ({kind}): {exc}") from exc
    except Exception as exc:
        raise HookLoadError(
            f"hook folder {folder} ({kind}): registering failed: {type(exc).__name__}: {exc}"
        ) from exc
    return LoadedHook(kind, name, folder, hook, spec.filter)
