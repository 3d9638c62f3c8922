"""`talkbridge check` and `talkbridge run --config` with a Telegram connection on the peer."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

from tests.connectors.telegram.conftest import TOKEN
from tests.peers.telegram import TelegramBotAPIPeer, album, private_text
from tests.support.cli import talkbridge

ENV = {"TELEGRAM_TOKEN": TOKEN}


def write_config(tmp_path: Path, peer: TelegramBotAPIPeer) -> Path:
    path = tmp_path / "talkbridge.yaml"
    path.write_text(
        f"""
store: sqlite:///{tmp_path}/talkbridge.db
connections:
  - id: support-bot
    channel: telegram
    token: ${{TELEGRAM_TOKEN}}
    api_base: {peer.base_url}
    poll_timeout: 5
    trusted: ["777"]
""",
        encoding="utf-8",
    )
    return path


async def test_check_reports_the_bot_username_or_the_failure(
    peer: TelegramBotAPIPeer, tmp_path: Path
) -> None:
    revoked = "999999:REVOKED-token"
    peer.add_bot(revoked)
    peer.revoke(revoked)
    config = write_config(tmp_path, peer)
    with config.open("a", encoding="utf-8") as file:
        file.write(
            f"  - id: old-bot\n    channel: telegram\n    token: {revoked}\n"
            f"    api_base: {peer.base_url}\n"
        )
    process = await talkbridge("check", "--config", str(config), env=ENV)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1  # one connection failed
    lines = out.decode().splitlines()
    [good] = [line for line in lines if "support-bot" in line]
    [bad] = [line for line in lines if "old-bot" in line]
    assert good.startswith("ok") and "@talkbridge_test_bot" in good
    assert bad.startswith("FAIL") and "revoked" in bad
    text = out.decode() + err.decode()
    for token in (TOKEN, revoked):
        assert token not in text and token.split(":")[1] not in text


async def test_check_says_when_the_bot_api_cannot_be_reached(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:  # a port nobody listens on after
        port = probe.getsockname()[1]
    config = tmp_path / "talkbridge.yaml"
    config.write_text(
        "connections:\n  - id: bot\n    channel: telegram\n    token: ${TELEGRAM_TOKEN}\n"
        f"    api_base: http://127.0.0.1:{port}\n",
        encoding="utf-8",
    )
    process = await talkbridge("check", "--config", str(config), env=ENV)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    [line] = [line for line in out.decode().splitlines() if " bot " in line]
    assert line.startswith("FAIL") and "cannot reach the Telegram Bot API" in line, line
    assert f"127.0.0.1:{port}" in line and TOKEN.split(":")[1] not in out.decode() + err.decode()


async def test_run_answers_a_telegram_message_end_to_end(
    peer: TelegramBotAPIPeer, tmp_path: Path
) -> None:
    config = write_config(tmp_path, peer)
    process = await talkbridge("run", "--config", str(config), "--port", "0", env=ENV)
    try:
        assert process.stdout is not None
        while b"Press Ctrl-C" not in await asyncio.wait_for(process.stdout.readline(), 60):
            pass
        await peer.wait_for(lambda: bool(peer.calls_of("getUpdates", answered=None)), 30)
        peer.push_update(private_text(777, "hello bridge", message_id=5))
        await peer.wait_for(lambda: len(peer.sent_messages) == 1, 30)
        [reply] = peer.sent_messages
        assert reply["text"] == "hello bridge" and reply["chat_id"] == 777
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert TOKEN not in err.decode()


_LONG_AGENT = '''
from talkbridge.agents import Result


class Long:
    """Answers with four paragraphs of 3,000 characters: four Telegram messages."""

    name = "long"

    async def stream(self, ctx):
        yield Result(text="\\n\\n".join(f"Part {i}. " + "word " * 600 for i in range(4)))
'''


async def test_a_long_reply_cut_off_by_a_crash_is_finished_after_the_restart_not_repeated(
    peer: TelegramBotAPIPeer, tmp_path: Path
) -> None:
    config = write_config(tmp_path, peer)
    with config.open("a", encoding="utf-8") as file:
        file.write("agents:\n  default: long\n  definitions:\n")
        file.write('    long: {kind: python, target: "longbot:Long"}\n')
    (tmp_path / "longbot.py").write_text(_LONG_AGENT, encoding="utf-8")

    async def run() -> asyncio.subprocess.Process:
        process = await talkbridge("run", "--config", str(config), "--port", "0", env=ENV)
        assert process.stdout is not None
        while b"Press Ctrl-C" not in await asyncio.wait_for(process.stdout.readline(), 60):
            pass
        return process

    process = await run()
    try:
        # Parts 1 and 2 go out; part 3 is told to wait 60 s, and the bridge dies meanwhile.
        peer.fail_next("sendMessage", status=429, retry_after=60, after=2)
        peer.push_update(private_text(777, "tell me everything", message_id=5))
        await peer.wait_for(lambda: bool(peer.calls_of("sendMessage", answered=429)), 30)
        process.kill()
        await process.wait()
        assert [m["text"][:6] for m in peer.sent_messages] == ["Part 0", "Part 1"]
        process = await run()  # the message is still pending: it is answered again
        await peer.wait_for(lambda: len(peer.sent_messages) >= 4, 30)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert [m["text"][:6] for m in peer.sent_messages] == ["Part 0", "Part 1", "Part 2", "Part 3"]
    first, *rest = peer.calls_of("sendMessage")
    assert first.params["reply_parameters"]["message_id"] == 5  # only the first part replies
    assert all("reply_parameters" not in call.params for call in rest)


async def test_an_album_cut_by_a_crash_is_answered_once_whole_after_the_restart(
    peer: TelegramBotAPIPeer, tmp_path: Path
) -> None:
    config = write_config(tmp_path, peer)
    with config.open("a", encoding="utf-8") as file:
        file.write("    album_wait: 60\n")

    async def run() -> asyncio.subprocess.Process:
        process = await talkbridge("run", "--config", str(config), "--port", "0", env=ENV)
        assert process.stdout is not None
        while b"Press Ctrl-C" not in await asyncio.wait_for(process.stdout.readline(), 60):
            pass
        return process

    photos = [peer.add_file(b"jpeg", file_path=f"photos/{i}.jpg") for i in range(3)]
    first, second, third = album(777, photos, first_message_id=20, caption="Holiday")
    process = await run()
    try:
        peer.push_update(first)
        last = peer.push_update(second)
        # Telegram was told both are done (an offset past them): it will not offer them again.
        await peer.wait_for(
            lambda: any(
                (c.params.get("offset") or 0) > last
                for c in peer.calls_of("getUpdates", answered=None)
            ),
            30,
        )
        process.kill()  # kill -9 before the album's last item came
        await process.wait()
        assert peer.sent_messages == []
        process = await run()
        peer.push_update(third)  # sent while the bridge was down
        peer.push_update(private_text(777, "and on", message_id=23))
        await peer.wait_for(lambda: len(peer.sent_messages) >= 2, 30)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert [m["text"] for m in peer.sent_messages] == [
        "Holiday\n\n(received: image, image, image)",  # the echo agent: one answer, all three
        "and on",
    ]
    assert peer.sent_messages[0]["reply_parameters"]["message_id"] == 20
