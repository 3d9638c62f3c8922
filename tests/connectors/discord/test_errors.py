"""What discord.py does not say by itself, said at the boundary: a server error it is retrying,
an answer of the wrong shape, a gateway event its parser fails on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.connectors.discord.transport import DiscordConnector
from talkbridge.errors import TransientError
from tests.connectors.discord.conftest import TOKEN
from tests.peers.discord import GENERAL, DiscordPeer
from tests.support.running import Status


@pytest.mark.parametrize(
    ("route", "body", "what"),
    [
        ("/users/@me", [], "JSON that is not a user object"),
        ("/users/@me", "a string", "JSON that is not a user object"),
        ("/users/@me", None, "JSON that is not a user object"),
        ("/users/@me", {"foo": 1}, "JSON that is not a user object (it has no 'username')"),
        ("/oauth2/applications/@me", [], "JSON that is not an application object"),
        ("/users/@me/guilds", {"foo": 1}, "JSON that is not a list of servers"),
    ],
)
async def test_check_names_an_answer_of_the_wrong_shape(
    peer: DiscordPeer,
    make_connector: Callable[..., DiscordConnector],
    route: str,
    body: Any,
    what: str,
) -> None:
    peer.answer_next("GET", route, body)
    with pytest.raises(TransientError) as caught:
        await make_connector().check()
    message = str(caught.value)
    assert message.startswith(f"Discord answered GET {route} with {what}")
    assert "api_base" in message and TOKEN not in message


async def test_logging_in_to_run_names_an_answer_of_the_wrong_shape(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    peer.answer_next("GET", "/users/@me", [])
    with pytest.raises(TransientError, match="GET /users/@me with JSON that is not a user"):
        await start()  # transient: `run` tries again, in case a proxy in between recovers
    assert peer.identifies == []


async def test_a_server_error_discord_py_gives_up_on_names_the_request(
    peer: DiscordPeer, make_connector: Callable[..., DiscordConnector]
) -> None:
    peer.fail_next("GET", "/oauth2/applications/@me", status=503)  # discord.py retries no 503
    with pytest.raises(TransientError) as caught:
        await make_connector().check()
    message = str(caught.value)
    assert message.startswith(
        "Discord answered GET /oauth2/applications/@me with HTTP 503 Service Unavailable: "
        "a server-side error, transient"
    )
    assert TOKEN not in message


async def test_a_server_error_to_logging_in_is_reported_while_discord_py_retries_it(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    peer.fail_next("GET", "/users/@me", status=500, times=5)
    running = await start(wait=False)
    status: Status = running.status
    await status.wait(lambda: status.count("degraded") >= 1)
    [(kind, reason)] = status.reports  # not up, and said why while discord.py waits to retry
    assert kind == "degraded"
    assert reason == (
        "Discord answered GET /users/@me with HTTP 500 Internal Server Error: a server-side "
        "error, transient; retrying"
    )


@pytest.mark.parametrize("bad", [{"channel_id": GENERAL}, "garbage"], ids=["no-id", "a-string"])
async def test_an_event_discord_py_cannot_read_ends_the_session_with_a_transient_error(
    peer: DiscordPeer, start: Callable[..., Any], bad: Any
) -> None:
    # discord.py's `connect` does not survive its parser failing: the session ends, and the
    # next run (the registry restarts it) identifies afresh.
    running = await start()
    alice = peer.person("Alice")
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "before", guild=False))
    await running.inbox.wait_count(1)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", bad)
    with pytest.raises(TransientError) as caught:
        await running.task
    message = str(caught.value)
    assert message.startswith("discord.py could not read an event from the Discord gateway")
    assert "gateway_url" in message and TOKEN not in message
    status = Status()
    running.task = asyncio.create_task(running.connector.run(status))  # as the registry does
    await status.wait_up()
    assert len(peer.identifies) == 2 and peer.resumes == []
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "after", guild=False))
    await running.inbox.wait_count(2)
    assert running.inbox.texts == ["before", "after"]
