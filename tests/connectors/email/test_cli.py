"""`talkbridge check` with email connections: logs in to IMAP and SMTP and reports each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.connectors.email.conftest import SMTP_USERS, USERS, mail
from tests.peers.email import DovecotPeer, SmtpPeer
from tests.support.cli import talkbridge


def entry(dovecot: DovecotPeer, smtp: SmtpPeer, cid: str, user: str, smtp_password: str) -> str:
    return f"""
  - id: {cid}
    channel: email
    address: {user}@example.com
    imap: {{host: 127.0.0.1, port: {dovecot.port}, security: none, username: {user},
            password: "${{IMAP_PASSWORD}}", folder: INBOX}}
    smtp: {{host: 127.0.0.1, port: {smtp.port}, security: none, username: {user},
            password: {smtp_password}}}
    trusted: ["*@example.org"]
"""


async def test_check_reports_imap_and_smtp_for_each_mailbox(
    dovecot: DovecotPeer, smtp: SmtpPeer, tmp_path: Path
) -> None:
    config = tmp_path / "talkbridge.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/talkbridge.db\nconnections:"
        + entry(dovecot, smtp, "helpdesk", "help", SMTP_USERS["help"])
        + entry(dovecot, smtp, "stale", "help", "wrong-smtp-secret")
        + entry(dovecot, smtp, "nologin", "help", "x").replace(
            ", username: help,\n            password: x}", "}"
        ),
        encoding="utf-8",
    )
    env = {"IMAP_PASSWORD": USERS["help"]}
    process = await talkbridge("check", "--config", str(config), env=env)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1, out.decode() + err.decode()
    lines = out.decode().splitlines()
    [good] = [line for line in lines if "helpdesk" in line]
    [bad] = [line for line in lines if "stale" in line]
    assert good.startswith("ok") and "IMAP ok" in good and "SMTP ok" in good
    assert "From not verified" in good and "authenticated_by" in good  # no `authenticated_by`
    assert bad.startswith("FAIL") and "IMAP ok" in bad and "SMTP failed" in bad
    assert "refused the login" in bad
    # No SMTP login configured for a server that wants one: sending would fail at MAIL FROM.
    [nologin] = [line for line in lines if "nologin" in line]
    assert nologin.startswith("FAIL") and "SMTP failed" in nologin and "530" in nologin
    text = out.decode() + err.decode()
    for secret in (USERS["help"], SMTP_USERS["help"], "wrong-smtp-secret"):
        assert secret not in text


async def test_an_imap_password_with_quotes_and_backslashes_stays_out_of_the_debug_log(
    dovecot: DovecotPeer, smtp: SmtpPeer, tmp_path: Path
) -> None:
    password = 'SEKRIT"imap\\pw'  # aioimaplib logs LOGIN with it quoted, then as bytes repr
    dovecot.set_password("help", password)
    config = tmp_path / "talkbridge.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/talkbridge.db\nwebchat: {{port: 0}}\nconnections:"
        + entry(dovecot, smtp, "helpdesk", "help", SMTP_USERS["help"]),
        encoding="utf-8",
    )
    process = await talkbridge(
        "run", "--config", str(config), "--log-level", "debug", env={"IMAP_PASSWORD": password}
    )
    assert process.stderr is not None
    seen: list[str] = []
    try:
        while not any("Sending" in line and " LOGIN " in line for line in seen):  # aioimaplib's
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "talkbridge run ended before logging in:\n" + "".join(seen)
            seen.append(line)
    finally:
        process.terminate()
        out, err = await asyncio.wait_for(process.communicate(), 60)
    text = "".join(seen) + out.decode() + err.decode()
    assert "SEKRIT" not in text


async def test_a_server_that_never_answers_is_named_and_the_others_verdict_still_given(
    dovecot: DovecotPeer, smtp: SmtpPeer, tmp_path: Path
) -> None:
    # An IMAP port that takes the connection and never greets (a firewall's tarpit, a hung
    # server): the check's timeout runs out on it, and SMTP has answered by then.
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    config = tmp_path / "talkbridge.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/talkbridge.db\nconnections:"
        + entry(dovecot, smtp, "helpdesk", "help", SMTP_USERS["help"]).replace(
            f"port: {dovecot.port}", f"port: {port}"
        ),
        encoding="utf-8",
    )
    async with listener:
        process = await talkbridge(
            "check", "--config", str(config), "--timeout", "2", env={"IMAP_PASSWORD": "x"}
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1, out.decode() + err.decode()
    [line] = [line for line in out.decode().splitlines() if "helpdesk" in line]
    assert line.startswith("FAIL"), line
    assert f"IMAP server 127.0.0.1:{port} has not answered" in line
    assert f"SMTP ok (127.0.0.1:{smtp.port})" in line


@pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)
async def test_check_shows_the_unread_backlog_where_replies_go_and_a_missing_folder(
    dovecot: DovecotPeer, smtp: SmtpPeer, tmp_path: Path
) -> None:
    for n in range(2):
        dovecot.deliver("help", mail(body=f"waiting {n}"))
    config = tmp_path / "talkbridge.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/talkbridge.db\nconnections:"
        + entry(dovecot, smtp, "helpdesk", "help", SMTP_USERS["help"])
        + entry(dovecot, smtp, "renamed", "help", SMTP_USERS["help"]).replace(
            "folder: INBOX", "folder: Support"
        ),
        encoding="utf-8",
    )
    process = await talkbridge(
        "check", "--config", str(config), env={"IMAP_PASSWORD": USERS["help"]}
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1, out.decode() + err.decode()
    lines = out.decode().splitlines()
    [good] = [line for line in lines if "helpdesk" in line]
    assert "INBOX: 2 messages, 2 unread; replies saved to Sent (marked \\Sent))" in good, good
    [gone] = [line for line in lines if "renamed" in line]
    assert gone.startswith("FAIL") and "IMAP folder 'Support' cannot be opened" in gone, gone
