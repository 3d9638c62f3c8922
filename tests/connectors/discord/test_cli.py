"""`talkbridge check` with Discord connections on the peer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.connectors.discord.conftest import TOKEN, TOKEN_B
from tests.peers.discord import DiscordPeer
from tests.support.cli import talkbridge

TOKEN_C = "MTExMTExMTExMTExMTExMTEx.GcCcCc.third-token_abcdefghijklmnopqr"


async def test_check_reports_the_bot_name_and_guild_count_or_the_failure(
    peer: DiscordPeer, tmp_path: Path
) -> None:
    peer.revoke(TOKEN_B)
    config = tmp_path / "talkbridge.yaml"
    config.write_text(
        f"""
store: sqlite:///{tmp_path}/talkbridge.db
connections:
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
        encoding="utf-8",
    )
    peer.add_bot(TOKEN_C, "Mutebot").app_flags = 0  # Message Content not switched on
    env = {"DISCORD_TOKEN": TOKEN, "OLD_TOKEN": TOKEN_B, "MUTED_TOKEN": TOKEN_C}
    process = await talkbridge("check", "--config", str(config), env=env)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1, err.decode()  # one connection failed
    lines = out.decode().splitlines()
    [good] = [line for line in lines if "community" in line]
    [bad] = [line for line in lines if "old-bot" in line]
    assert good.startswith("ok") and "Bridgebot" in good and "in 1 server" in good
    assert bad.startswith("FAIL") and "rejected the bot token" in bad
    [muted] = [line for line in lines if "muted-bot" in line]  # `run` would meet close 4014
    assert muted.startswith("FAIL") and "the Message Content intent is off" in muted
    text = out.decode() + err.decode()
    assert TOKEN not in text and TOKEN_B not in text
