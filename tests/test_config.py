import re
from pathlib import Path

import pytest

from talkbridge.config import STORE_KEYS, AgentSpec, Secrets, load_config, parse_config
from talkbridge.errors import ConfigError


def test_no_file_is_the_embedded_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config, _ = load_config(None)
    assert config.store == "sqlite:///talkbridge.db"
    assert (config.webchat.host, config.webchat.port) == ("127.0.0.1", 8765)
    assert config.agents.default == "echo"
    assert config.connections == ()


def test_env_references_are_substituted_and_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_TOKEN", "123456:SECRET-TOKEN")
    config, secrets = parse_config(
        {"connections": [{"id": "bot", "channel": "telegram", "token": "${TG_TOKEN}"}]}
    )
    conn = config.connection("bot")
    assert conn is not None
    assert conn.token.get_secret_value() == "123456:SECRET-TOKEN"  # type: ignore[attr-defined]
    assert "SECRET" not in repr(config)
    assert secrets.redact("failed for 123456:SECRET-TOKEN!") == "failed for ***!"


def test_env_values_of_plain_keys_stay_readable_and_dollar_dollar_is_literal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHAT_HOST", "127.0.0.1")
    monkeypatch.setenv("CHAT_PORT", "18937")
    monkeypatch.setenv("IMAP_PW", "hunter2-long")
    config, secrets = parse_config(
        {
            "webchat": {"host": "${CHAT_HOST}", "port": "${CHAT_PORT}"},
            "agents": {
                "definitions": {
                    "p": {
                        "kind": "openai",
                        "base_url": "http://127.0.0.1:11434/v1",
                        "model": "llama3.2",
                        "system_prompt": "Say $${NAME} as is",
                    }
                }
            },
            "connections": [
                {
                    "id": "mail",
                    "channel": "email",
                    "address": "help@example.com",
                    "imap": {"host": "${CHAT_HOST}", "username": "help", "password": "${IMAP_PW}"},
                    "smtp": {"host": "localhost", "username": "help", "password": "${IMAP_PW}"},
                }
            ],
        }
    )
    # An error about the port can say which one; the password is still kept out.
    line = "webchat cannot listen on 127.0.0.1:18937; IMAP login hunter2-long refused"
    assert (
        secrets.redact(line) == "webchat cannot listen on 127.0.0.1:18937; IMAP login *** refused"
    )
    assert config.webchat.port == 18937
    assert config.agents.definitions["p"].system_prompt == "Say ${NAME} as is"


def test_a_secret_is_redacted_in_its_escaped_forms_too() -> None:
    # aioimaplib logs the LOGIN command as bytes: the password quoted (IMAP escapes `"` and
    # `\\`), then repr() doubles each backslash; its own masking misses that form.
    password = 'SEKRIT"imap\\pw'
    secrets = Secrets([password])
    quoted = password.replace("\\", "\\\\").replace('"', '\\"')
    login = f'LOGIN help "{quoted}"'
    for line in (
        f"Sending : {login.encode()!r}",
        f"Sending : {login!r}",
        login,
        f"password={password!r}",
        f"{password.encode()!r}",
        password,
    ):
        assert "SEKRIT" not in secrets.redact(line), line
    assert secrets.redact(f"Sending : {login.encode()!r}") == "Sending : b'LOGIN help \"***\"'"


def test_the_credentials_of_a_url_are_redacted_though_not_a_known_secret() -> None:
    # an api_base through an authenticating proxy, quoted by the HTTP client's error
    error = "NonHttpUrlClientError: htp://proxyuser:SEKRIT@127.0.0.1:18925/bot***/getMe"
    assert (
        Secrets().redact(error) == "NonHttpUrlClientError: htp://***@127.0.0.1:18925/bot***/getMe"
    )
    assert Secrets().redact("write to me@example.com") == "write to me@example.com"


def test_missing_env_var_is_named() -> None:
    with pytest.raises(ConfigError, match=r"connections\[0\]\.token: environment variable NOPE_X"):
        parse_config({"connections": [{"id": "b", "channel": "telegram", "token": "${NOPE_X}"}]})


def test_secret_from_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("99:FROM-FILE\n")
    _, secrets = parse_config(
        {"connections": [{"id": "b", "channel": "telegram", "token": {"file": str(secret)}}]}
    )
    assert "FROM-FILE" not in secrets.redact("x 99:FROM-FILE")
    with pytest.raises(ConfigError, match="cannot read secret file"):
        parse_config(
            {"connections": [{"id": "b", "channel": "telegram", "token": {"file": "/nope/x"}}]}
        )


def test_errors_name_the_key_path_and_never_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT_SECRET", "not-a-port-hunter2")
    with pytest.raises(ConfigError) as err:
        parse_config({"webchat": {"port": "${PORT_SECRET}", "colour": 1}})
    text = str(err.value)
    assert "webchat.port" in text and "webchat.colour: unknown key" in text
    assert "hunter2" not in text


def test_a_misspelt_key_is_named_with_the_key_it_is_close_to() -> None:
    """`chanel: telegram` said only `channel: required`, and an unknown key never named the one
    meant; a Telegram `trusted: [bob]` was reported at `connections[0]`, not at `trusted`."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "webchta": {},
                "router": {"send_atempts": 3},
                "agents": {"definitions": {"x": {"kind": "echo", "knd": "echo"}}},
                "connections": [
                    {"id": "a", "chanel": "telegram", "token": "1:abc"},
                    {"id": "b", "channel": "telegram", "token": "1:abc", "trusted": ["bob"]},
                    {
                        "id": "c",
                        "channel": "email",
                        "address": "help@example.com",
                        "imap": {"host": "h", "username": "u", "password": "p", "fodler": "X"},
                        "smtp": {"host": "h"},
                    },
                    {"id": "d", "channel": "telegram", "token": "1:abc", "tokne": "x"},
                ],
            }
        )
    lines = str(err.value).splitlines()[1:]
    assert lines == [
        "  connections[0].chanel: unknown key; did you mean channel?",
        "  connections[1].trusted: 'bob' would never match: it holds numeric Telegram user ids "
        "(a username can change hands)",
        "  connections[2].imap.fodler: unknown key; did you mean folder?",
        "  connections[3].tokne: unknown key; did you mean token?",
        "  agents.definitions.x.knd: unknown key; did you mean kind?",
        "  router.send_atempts: unknown key; did you mean send_attempts?",
        "  webchta: unknown key; did you mean webchat?",
    ]


def test_unknown_channel_and_duplicate_ids() -> None:
    with pytest.raises(ConfigError, match=r"connections\[0\]\.channel: unknown channel 'icq'"):
        parse_config({"connections": [{"id": "a", "channel": "icq"}]})
    with pytest.raises(ConfigError, match=r"connections\[1\]\.id: connection id 'a' is used twice"):
        parse_config(
            {
                "connections": [
                    {"id": "a", "channel": "telegram", "token": "1:x"},
                    {"id": "a", "channel": "telegram", "token": "2:y"},
                ]
            }
        )
    with pytest.raises(ConfigError, match=r"connections\[0\]\.id: connection id 'webchat' is res"):
        parse_config({"connections": [{"id": "webchat", "channel": "telegram", "token": "1:x"}]})


def test_a_missing_channel_is_required_not_unknown() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"connections": [{"id": "a", "token": "1:x"}]})
    assert "connections[0].channel: required; known channels: " in str(caught.value)
    assert "None" not in str(caught.value)


def test_bad_yaml_names_line(tmp_path: Path) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text("webchat:\n  port: [1,\n")
    with pytest.raises(ConfigError, match=r"talkbridge.yaml at line \d+"):
        load_config(path)


def test_trusted_patterns() -> None:
    config, _ = parse_config(
        {
            "connections": [
                {"id": "b", "channel": "telegram", "token": "1:x", "trusted": ["42", "9*"]}
            ]
        }
    )
    conn = config.connection("b")
    assert conn is not None
    assert conn.trusts("42") and conn.trusts("900") and not conn.trusts("420")


def test_numeric_ids_in_trusted_are_ids_as_written(tmp_path: Path) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text(
        "connections:\n  - {id: b, channel: telegram, token: '1:x', trusted: [123456789, '-100']}\n"
    )
    config, _ = load_config(path)  # YAML reads the unquoted id as a number
    conn = config.connection("b")
    assert conn is not None and conn.trusted == ("123456789", "-100")
    assert conn.trusts("123456789")
    path.write_text("connections:\n  - {id: b, channel: telegram, token: '1:x', trusted: [true]}\n")
    with pytest.raises(ConfigError, match=r"connections\[0\]\.trusted"):
        load_config(path)


def test_hook_folders_are_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text("hooks: [hooks/channel-message]\n")
    config, _ = load_config(path)
    assert config.hook_folders() == [tmp_path / "hooks" / "channel-message"]


def test_unquoted_reference_in_a_flow_mapping_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text("webchat: {host: 127.0.0.1, tokens: [${WEBCHAT_TOKEN}]}\n")
    with pytest.raises(ConfigError, match=r'must be quoted: "\$\{NAME\}"'):
        load_config(path)


def test_a_relative_sqlite_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "talkbridge.yaml"
    path.parent.mkdir()
    path.write_text("store: sqlite:///data/bridge.db\n")
    config, _ = load_config(path)
    assert config.store == f"sqlite:///{tmp_path / 'conf' / 'data' / 'bridge.db'}"
    memory, _ = parse_config({"store": "sqlite:///:memory:"}, tmp_path)
    assert memory.store == "sqlite:///:memory:"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "0.0.0.0", "::", "localhost", "chat.example"])
def test_listen_hosts_that_can_be_bound_are_accepted(host: str) -> None:
    config, _ = parse_config({"webchat": {"host": host}})
    assert config.webchat.host == host


def test_a_listen_host_typo_is_named_before_anything_binds() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "webchat": {"host": "999.1.1.1", "port": 70000},
                "connections": [
                    {"id": "s", "channel": "slack", "bot_token": "xoxb-1", "events_host": "a b"}
                ],
            }
        )
    text = str(err.value)
    assert "webchat.host: not an IP address or host name" in text
    assert "webchat.port: use 0-65535 (0 picks a free one)" in text
    assert "connections[0].events_host: not an IP address or host name" in text
    assert "Value error" not in text


def test_each_problem_is_a_line_in_words_a_yaml_author_knows() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "webchat": 5,
                "hooks": "hooks/channel-message",
                "connections": [{"id": "b", "channel": "telegram"}],
            },
            source="talkbridge.yaml",
        )
    assert str(err.value).splitlines() == [
        "invalid config (talkbridge.yaml):",
        "  connections[0].token: required",
        "  webchat: must be a mapping",
        "  hooks: must be a list",
    ]


def test_only_the_store_keys_need_their_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text(
        "store: sqlite:///${DB_FILE}\nwebchat: {colour: red}\n"
        "connections:\n  - id: b\n    channel: telegram\n    token: ${UNSET_TOKEN_X}\n"
    )
    monkeypatch.delenv("UNSET_TOKEN_X", raising=False)
    monkeypatch.setenv("DB_FILE", "bridge.db")
    config, _ = load_config(path, only=STORE_KEYS)
    assert config.store == f"sqlite:///{tmp_path / 'bridge.db'}" and config.connections == ()
    monkeypatch.delenv("DB_FILE")
    with pytest.raises(ConfigError, match="store: environment variable DB_FILE is not set"):
        load_config(path, only=STORE_KEYS)


def test_an_alias_inside_its_own_anchor_is_an_error_not_a_recursion(tmp_path: Path) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text("agents: &a {definitions: {x: *a}}\n")
    with pytest.raises(ConfigError, match=r"agents\.definitions\.x: an alias of a value"):
        load_config(path)


def test_a_key_given_twice_is_an_error_not_a_silent_replacement(tmp_path: Path) -> None:
    path = tmp_path / "talkbridge.yaml"
    path.write_text(
        "connections:\n  - {id: bot, channel: telegram, token: '1:x'}\n"
        "webchat: {}\nconnections: []\n"
    )
    with pytest.raises(ConfigError, match=r"line 4, column 1: key 'connections' appears twice"):
        load_config(path)


@pytest.mark.parametrize(
    ("webchat", "says"),
    [
        ({"tokens": [""]}, "webchat.tokens: token 1 is empty"),
        ({"tokens": ["ok-token", "  "]}, "webchat.tokens: token 2 is empty"),
        ({"port": True}, "webchat.port: must be a port number, not true or false"),
    ],
)
def test_webchat_values_that_would_fail_at_start(webchat: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config({"webchat": webchat})


def test_every_unset_variable_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "connections": [
                    {"id": "a", "channel": "telegram", "token": "${NOPE_ONE}"},
                    {"id": "b", "channel": "telegram", "token": "${NOPE_TWO}"},
                ]
            }
        )
    lines = str(err.value).splitlines()
    assert lines[1:] == [
        "  connections[0].token: environment variable NOPE_ONE is not set",
        "  connections[1].token: environment variable NOPE_TWO is not set",
    ]


def test_a_connection_id_error_says_what_an_id_may_hold() -> None:
    with pytest.raises(ConfigError, match=r"connections\[0\]\.id: use 1-64 letters, digits"):
        parse_config({"connections": [{"id": "bad id!", "channel": "telegram", "token": "1:x"}]})


def _agent_problems(**definitions: dict[str, object]) -> list[str]:
    """The lines of the config error `agents.definitions` (given as keywords) makes."""
    with pytest.raises(ConfigError) as err:
        parse_config({"agents": {"definitions": definitions}}, source="talkbridge.yaml")
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid config (talkbridge.yaml):"
    return [line.strip() for line in lines[1:]]


def test_an_agent_key_of_another_kind_is_an_error_naming_it_not_ignored() -> None:
    assert _agent_problems(
        helper={"kind": "echo", "model": "gpt-4o"},
        mine={"kind": "python", "target": "mybot:Agent", "api_key": "sk-not-shown-123"},
        model={
            "kind": "openai",
            "base_url": "http://127.0.0.1:1/v1",
            "model": "m",
            "target": "a:B",
        },
        guard={"kind": "sentinel", "system_prompt": "Be nice.", "history": 5},
        plain={"history": 20},  # no kind: echo, which keeps no history, even the default's
    ) == [
        "agents.definitions.helper.model: does not apply to kind echo (only to openai)",
        "agents.definitions.mine.api_key: does not apply to kind python (only to openai)",
        "agents.definitions.model.target: does not apply to kind openai (only to python)",
        "agents.definitions.guard.system_prompt: does not apply to kind sentinel (only to openai)",
        "agents.definitions.guard.history: does not apply to kind sentinel (only to openai)",
        "agents.definitions.plain.history: does not apply to kind echo (only to openai)",
    ]


def test_the_keys_an_agent_kind_needs_are_required_by_the_config() -> None:
    assert _agent_problems(
        bot={"kind": "openai", "model": ""},
        mine={"kind": "python"},
        odd={"kind": "python", "target": "mybot.agents"},
        typo={"kind": "openai", "base_url": "api.openai.com/v1", "model": "m"},
    ) == [
        "agents.definitions.bot.base_url: required for kind openai: the server's URL, such as "
        "https://api.openai.com/v1",
        "agents.definitions.bot.model: is empty; kind openai needs the model's name, such as "
        "gpt-4o-mini",
        "agents.definitions.mine.target: required for kind python: the agent class as "
        "'module:Class'",
        "agents.definitions.odd.target: give the agent class as 'module:Class'",
        "agents.definitions.typo.base_url: must be an http:// or https:// URL such as "
        "https://api.openai.com/v1",
    ]


def test_each_agent_key_is_checked_against_the_kinds_it_applies_to() -> None:
    config, _ = parse_config(
        {
            "agents": {
                "definitions": {
                    "e": {"kind": "echo"},
                    "s": {"kind": "sentinel", "model": None},  # null: nothing set
                    "p": {"kind": "python", "target": "mybot.agents:Support"},
                    "o": {"kind": "openai", "base_url": "http://x/v1", "model": "m", "history": 0},
                }
            }
        }
    )
    assert config.agents.definitions["e"].history == 20  # the default is kept, unchecked
    assert config.agents.definitions["o"].history == 0
    # A key added to AgentSpec is listed with its kinds, or it would be taken by every kind.
    from talkbridge.config import _AGENT_KEYS

    assert set(_AGENT_KEYS) == set(AgentSpec.model_fields) - {"kind"}


def test_an_agent_history_longer_than_the_screening_covers_is_refused() -> None:
    """Screened messages are known per thread up to the longest history an agent is given."""
    (problem,) = _agent_problems(
        bot={"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m", "history": 5000}
    )
    assert problem.startswith("agents.definitions.bot.history: ") and "1000" in problem


@pytest.mark.parametrize(
    ("ttl", "says"),
    [
        (float("inf"), "must be a finite number"),
        (float("nan"), "must be a finite number"),
        (1e11, "must be less than or equal to 31536000"),
    ],
)
def test_a_pairing_code_lifetime_a_date_cannot_hold_is_a_config_error(
    ttl: float, says: str
) -> None:
    """`code_ttl: .inf` (codes that never expire) ended `check` and `run` in a traceback, and
    `1e11` passed them, to fail every sender's first message: its expiry is past year 9999."""
    with pytest.raises(ConfigError, match=rf"pairing\.code_ttl: {says}"):
        parse_config({"pairing": {"code_ttl": ttl}})
    config, _ = parse_config({"pairing": {"code_ttl": 31_536_000}})
    assert config.pairing.code_ttl == 31_536_000


@pytest.mark.parametrize("key", ["dedupe_days", "sent_days", "failed_sends_days"])
def test_a_retention_a_date_cannot_hold_is_a_config_error(key: str) -> None:
    """`dedupe_days: .inf` ("keep them for good") or `1e9` ended `check` and `run` in a
    traceback (a timedelta cannot hold them)."""
    with pytest.raises(ConfigError, match=rf"retention\.{key}: must be a finite number"):
        parse_config({"retention": {key: float("inf")}})
    with pytest.raises(
        ConfigError, match=rf"retention\.{key}: must be less than or equal to 36500"
    ):
        parse_config({"retention": {key: 1e9}})
    config, _ = parse_config({"retention": {key: 36_500}})
    assert getattr(config.retention, key) == 36_500


def test_a_tilde_in_a_path_of_the_config_is_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store: sqlite:///~/bridge.db` made a folder named `~` beside the config."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "talkbridge.yaml").write_text(
        "store: sqlite:///~/bridge.db\nhooks: [~/hooks/audit]\n"
        "webchat: {tokens: [{file: ~/token}]}\n"
    )
    (tmp_path / "home").mkdir()
    (tmp_path / "home/token").write_text("a-token-in-the-home-folder")
    config, _ = load_config(tmp_path / "talkbridge.yaml")
    assert config.store == f"sqlite:///{tmp_path}/home/bridge.db"
    assert config.hook_folders() == [tmp_path / "home/hooks/audit"]
    assert config.webchat.tokens[0].get_secret_value() == "a-token-in-the-home-folder"


def test_reasons_are_in_the_words_of_the_yaml_not_of_pydantic() -> None:
    """`String should match pattern '^/'`, `String should have at least 1 character` and
    `must be a valid boolean, unable to interpret input` spoke pydantic, not YAML."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "connections": [
                    {
                        "id": "a",
                        "channel": "telegram",
                        "token": "1:abc",
                        "webhook_path": "hook",
                        "enabled": "maybe",
                    },
                    {
                        "id": "b",
                        "channel": "email",
                        "address": "help@example.com",
                        "imap": {"host": "", "username": "u", "password": "p"},
                        "smtp": {"host": "h"},
                    },
                ]
            }
        )
    assert str(err.value).splitlines()[1:] == [
        "  connections[0].enabled: must be true or false",
        "  connections[0].webhook_path: must be a path starting with / (such as /hooks/in)",
        "  connections[1].imap.host: must not be empty",
    ]


@pytest.mark.parametrize("value", [True, "", 2024, ["Sent"]])
def test_a_sent_folder_that_is_none_is_one_line_saying_what_it_takes(value: object) -> None:
    """`sent_folder: true` was two lines naming pydantic's union branches
    (`sent_folder.str: …`, `sent_folder.literal[False]: must be False`)."""
    imap = {"host": "127.0.0.1", "username": "u", "password": "p", "sent_folder": value}
    mail = {"id": "m", "channel": "email", "address": "help@example.com", "imap": imap}
    with pytest.raises(ConfigError) as err:
        parse_config({"connections": [{**mail, "smtp": {"host": "127.0.0.1"}}]})
    assert str(err.value).splitlines()[1:] == [
        "  connections[0].imap.sent_folder: names the folder replies are saved to: "
        "auto, a folder's name, or false"
    ]
