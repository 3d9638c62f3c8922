"""What every platform connector says when `api_base` answers something that is not the API."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from talkbridge.connectors.boundary import scrub
from tests.support.cli import finish, talkbridge


@pytest.fixture
async def not_an_api() -> AsyncIterator[str]:
    """An HTTP server that answers 200 with bytes that are not UTF-8, whatever is asked."""

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=b'\xff\xfe{"ok": true}', content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_an_answer_that_is_not_utf8_is_named_not_a_decode_error(
    tmp_path: Path, not_an_api: str
) -> None:
    for extra in ("telegram", "slack", "discord"):
        pytest.importorskip(
            {"telegram": "aiogram", "slack": "slack_sdk", "discord": "discord"}[extra]
        )
    (tmp_path / "talkbridge.yaml").write_text(
        "connections:\n"
        f'  - {{id: tg, channel: telegram, token: "123:abc", api_base: "{not_an_api}"}}\n'
        "  - {id: sl, channel: slack, bot_token: xoxb-1, app_token: xapp-1,"
        f' api_base: "{not_an_api}/api/"}}\n'
        f'  - {{id: dc, channel: discord, token: a.b.c, api_base: "{not_an_api}"}}\n',
        encoding="utf-8",
    )
    code, out, err = await finish(
        await talkbridge("check", "--config", "talkbridge.yaml", cwd=tmp_path)
    )
    assert code == 1, err
    assert "UnicodeDecodeError" not in out + err
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("FAIL")}
    assert set(lines) == {"tg", "sl", "dc"}, out
    for line in lines.values():  # Discord's names the request too
        assert re.search(
            r"answered (GET /\S+ )?with a body that is not UTF-8 text: is api_base its API\?$", line
        ), line


def test_an_sdk_message_is_scrubbed_of_a_secret_in_every_form_a_log_line_is() -> None:
    secret = 'pa"ss\\word'
    quoted = 'LOGIN bot "pa\\"ss\\\\word"'  # how an IMAP or JSON library quotes it
    said = f"{quoted}; {secret!r}; GET http://bot:hunter22@proxy.test/api failed"
    assert scrub(said, secret, None) == (
        """LOGIN bot "***"; '***'; GET http://***@proxy.test/api failed"""
    )
