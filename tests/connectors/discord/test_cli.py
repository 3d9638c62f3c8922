"""`talkbridge check` with Discord connections on the peer."""

from __future__ import annotations

import re
from pathlib import Path

from tests.connectors.discord.conftest import TOKEN, TOKEN_B
from tests.peers.discord import DiscordPeer
from tests.support.cli import check, write_config

TOKEN_C = "MTExMTExMTExMTExMTExMTEx.GcCcCc.third-token_abcdefghijklmnopqr"


async def test_check_reports_the_bot_name_and_guild_count_or_the_failure(
    peer: DiscordPeer, tmp_path: Path
) -> None:
    peer.revoke(TOKEN_B)
    config = write_config(
        tmp_path,
        f"""\
  - id: community
    channel: discord
    token: ${{DISCORD_TOKEN}}
    api_base: {peer.base_url}
    gateway_url: {peer.gateway_url}
  - id: old-bot
    channel: discord
    token: ${{OLD_TOKEN}}
    api_base: {peer.base_url}
    gateway_url: {peer.gateway_url}
  - id: muted-bot
    channel: discord
    token: ${{MUTED_TOKEN}}
    api_base: {peer.base_url}
    gateway_url: {peer.gateway_url}
""",
    )
    peer.add_bot(TOKEN_C, "Mutebot").app_flags = 0  # Message Content not switched on
    env = {"DISCORD_TOKEN": TOKEN, "OLD_TOKEN": TOKEN_B, "MUTED_TOKEN": TOKEN_C}
    code, lines, text = await check(config, env=env)
    assert code == 1, text  # one connection failed
    [good] = [line for line in lines if "community" in line]
    [bad] = [line for line in lines if "old-bot" in line]
    assert good.startswith("ok") and "Bridgebot" in good and "in 1 server" in good
    assert bad.startswith("FAIL") and "rejected the bot token" in bad
    [muted] = [line for line in lines if "muted-bot" in line]  # `run` would meet close 4014
    assert muted.startswith("FAIL") and "the Message Content intent is off" in muted
    assert TOKEN not in text and TOKEN_B not in text
    assert peer.identifies == []  # the gateway's HELLO was read, no session started


async def test_check_names_a_server_error_discord_py_is_retrying_and_an_answer_it_cannot_read(
    peer: DiscordPeer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        f"""\
  - id: failing
    channel: discord
    token: ${{DISCORD_TOKEN}}
    api_base: {peer.base_url}
    gateway_url: {peer.gateway_url}
  - id: proxied
    channel: discord
    token: ${{OTHER_TOKEN}}
    api_base: {peer.base_url}
    gateway_url: {peer.gateway_url}
""",
    )
    # discord.py retries a 500 five times over about 25 s: the check's time runs out first.
    peer.fail_next("GET", "/users/@me", status=500, token=TOKEN, times=5)
    peer.answer_next("GET", "/users/@me", [], token=TOKEN_B)
    env = {"DISCORD_TOKEN": TOKEN, "OTHER_TOKEN": TOKEN_B}
    code, lines, text = await check(config, "--timeout", "1.5", env=env)
    assert code == 1, text
    [failing] = [line for line in lines if "failing" in line]
    assert failing.startswith("FAIL")
    # How many 500s came in the 1.5 s depends on discord.py's backoff: one or two.
    assert re.search(
        r"Discord answered GET /users/@me with HTTP 500 Internal Server Error"
        r"( \(2 times in a row\))?: a server-side error, transient; discord.py was still "
        r"retrying it, and `run` retries until it passes \(no other answer within 1.5s\)$",
        failing,
    ), failing
    [proxied] = [line for line in lines if "proxied" in line]
    assert proxied.startswith("FAIL")
    assert proxied.endswith(
        "Discord answered GET /users/@me with JSON that is not a user object: is api_base its API?"
    )
    assert TOKEN not in text and TOKEN_B not in text
    assert "Traceback" not in text and "TypeError" not in text


async def test_check_fails_a_gateway_url_that_leads_nowhere(
    peer: DiscordPeer, tmp_path: Path, unused_tcp_port: int
) -> None:
    # REST answers, so logging in passes: only the gateway is wrong, and `run` could never
    # connect. `check` opens it and reads HELLO (without identifying: no session is used).
    config = write_config(
        tmp_path,
        f"""\
  - id: typo
    channel: discord
    token: ${{DISCORD_TOKEN}}
    api_base: {peer.base_url}
    gateway_url: ws://127.0.0.1:{unused_tcp_port}/gateway
""",
    )
    code, lines, _ = await check(config, env={"DISCORD_TOKEN": TOKEN})
    assert code == 1, lines
    [typo] = [line for line in lines if "typo" in line]
    assert typo.startswith("FAIL") and "gateway" in typo and "cannot be reached" in typo
    assert str(unused_tcp_port) in typo
