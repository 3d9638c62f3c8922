"""`talkbridge check` with Slack connections on the peer, as a real subprocess."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.peers.slack import SlackPeer, Workspace
from tests.support.cli import check, finish, talkbridge, write_config

GOOD = Workspace("xoxb-good-bot", app_token="xapp-good-app", team="Acme", team_id="T0ACME001")
BAD = Workspace("xoxb-bad-bot", app_token="xapp-bad-app", team="Initech", team_id="T0INITECH")


async def test_check_reports_team_and_bot_user_or_the_failure(tmp_path: Path) -> None:
    async with SlackPeer(GOOD, BAD) as peer:
        peer.revoke(BAD.bot_token)
        config = write_config(
            tmp_path,
            f"""\
  - id: team
    channel: slack
    bot_token: ${{SLACK_BOT_TOKEN}}
    app_token: ${{SLACK_APP_TOKEN}}
    api_base: {peer.api_base}
  - id: old-team
    channel: slack
    bot_token: {BAD.bot_token}
    app_token: {BAD.app_token}
    api_base: {peer.base_url}/api
""",
        )
        env = {"SLACK_BOT_TOKEN": GOOD.bot_token, "SLACK_APP_TOKEN": str(GOOD.app_token)}
        code, lines, text = await check(config, env=env)
    assert code == 1, text  # one connection failed
    [good] = [line for line in lines if " team" in line and "old-team" not in line]
    [bad] = [line for line in lines if "old-team" in line]
    assert good.startswith("ok") and "@talkbridge" in good and "Acme" in good
    assert bad.startswith("FAIL") and "token_revoked" in bad
    assert "Unclosed" not in text  # every HTTP session was closed
    for secret in (GOOD.bot_token, GOOD.app_token, BAD.bot_token, BAD.app_token):
        assert secret is not None and secret not in text
    # api_base without its trailing slash still reached the peer's /api/ (auth.test was called)
    assert [c.token for c in peer.calls_of("auth.test", ok=None)].count(BAD.bot_token) == 1


async def test_run_never_logs_the_socket_mode_ticket_not_even_in_a_traceback(
    tmp_path: Path,
) -> None:
    async with SlackPeer(GOOD) as peer:
        peer.refuse_handshakes(1)  # slack-sdk logs the refusal with its traceback, URL included
        config = write_config(
            tmp_path,
            f"""\
  - id: team
    channel: slack
    bot_token: {GOOD.bot_token}
    app_token: {GOOD.app_token}
    api_base: {peer.api_base}
    ping_interval: 0.2
""",
        )
        process = await talkbridge("run", "--config", str(config), "--port", "0")
        await peer.wait_for(lambda: bool(peer.open_sockets), timeout=60)
        process.send_signal(signal.SIGINT)
        code, _, err = await finish(process)
    assert code == 0, err
    assert "Failed to connect" in err and "ticket=***" in err  # the refusal is logged, masked
    for ticket in peer.tickets_issued:
        assert ticket not in err


async def test_check_names_the_scope_a_token_lacks_and_where_to_add_it(tmp_path: Path) -> None:
    # An app-level token made without `connections:write`: Slack names it in `needed`.
    scopeless = Workspace("xoxb-good-bot", app_token="xapp-no-scope", app_scopes=())
    async with SlackPeer(scopeless) as peer:
        config = write_config(
            tmp_path,
            f"""\
  - id: team
    channel: slack
    bot_token: {scopeless.bot_token}
    app_token: {scopeless.app_token}
    api_base: {peer.api_base}
""",
        )
        code, lines, text = await check(config)
    assert code == 1, text
    [line] = [line for line in lines if "team" in line]
    assert line.startswith("FAIL") and "missing_scope" in line
    assert "the app token lacks the scope connections:write" in line
    assert "Basic Information > App-Level Tokens" in line
