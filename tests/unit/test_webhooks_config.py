"""Webhook endpoint config: what a valid file gives, and what each mistake says."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from webhooks import Endpoint, WebhookConfigError, load_endpoints

SECRET_URL = "https://hooks.example.com/services/T000/B000/XXXXSECRETPATHXXXX"
SECRET = "hmac-s3cret-value"
ENV = {"ONCALL_URL": SECRET_URL, "ONCALL_SECRET": SECRET}

_counter = itertools.count()


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Path]:
    """``write_config(text)``: a uniquely named TOML file holding ``text``."""

    def write(text: str) -> Path:
        path = tmp_path / f"webhooks-{next(_counter)}.toml"
        path.write_text(text)
        return path

    return write


def test_a_full_config_loads_with_sources_filters_and_defaults(
    write_config: Callable[[str], Path], tmp_path: Path
) -> None:
    (tmp_path / "slack-url").write_text(SECRET_URL + "/chat\n")
    path = write_config(
        """
[[endpoint]]
name = "oncall"
url_env = "ONCALL_URL"
format = "alertmanager"
rules = ["QUORUM_ZOMBIE_LEADER"]
severities = ["critical"]
clusters = ["prod-eu-1"]
rate_per_second = 2.5
burst = 4
timeout_seconds = 3
max_age_seconds = 3600
max_attempts = 5
backoff_base_seconds = 0.5
backoff_cap_seconds = 60
secret_env = "ONCALL_SECRET"
external_url = "http://alertmanager.example"

[[endpoint]]
name = "chat"
url_file = "slack-url"
format = "slack"

[[endpoint]]
name = "plain"
url = "http://127.0.0.1:9099/hook"
"""
    )
    oncall, chat, plain = load_endpoints(path, environ=ENV)
    assert oncall == Endpoint(
        name="oncall",
        url=SECRET_URL,
        format="alertmanager",
        rules=frozenset({"QUORUM_ZOMBIE_LEADER"}),
        severities=frozenset({"critical"}),
        clusters=frozenset({"prod-eu-1"}),
        rate_per_second=2.5,
        burst=4.0,
        timeout_seconds=3.0,
        max_age_seconds=3600.0,
        max_attempts=5,
        backoff_base_seconds=0.5,
        backoff_cap_seconds=60.0,
        secret=SECRET.encode(),
        external_url="http://alertmanager.example",
    )
    assert chat.url == SECRET_URL + "/chat"  # read relative to the config file, stripped
    assert chat.format == "slack" and chat.secret is None
    assert plain.url == "http://127.0.0.1:9099/hook" and plain.format == "json"
    assert (plain.rules, plain.severities, plain.clusters) == (frozenset(), frozenset(), frozenset())
    assert (plain.rate_per_second, plain.burst, plain.timeout_seconds) == (5.0, 10.0, 5.0)
    assert (plain.max_age_seconds, plain.backoff_base_seconds, plain.backoff_cap_seconds) == (86400, 1, 300)
    assert plain.max_attempts == 12


def test_endpoint_repr_never_shows_the_url_or_the_secret(write_config: Callable[[str], Path]) -> None:
    path = write_config(
        '[[endpoint]]\nname = "oncall"\nurl_env = "ONCALL_URL"\nsecret_env = "ONCALL_SECRET"\n'
    )
    [endpoint] = load_endpoints(path, environ=ENV)
    assert endpoint.secret == SECRET.encode()
    assert SECRET_URL not in repr(endpoint) and SECRET not in repr(endpoint)
    assert "oncall" in repr(endpoint)


def test_filters_accept_only_matching_alerts() -> None:
    endpoint = Endpoint(
        "x",
        "http://h/",
        rules=frozenset({"R1"}),
        severities=frozenset({"critical"}),
        clusters=frozenset({"c1"}),
    )
    ok = {"rule": "R1", "severity": "critical", "cluster": "c1"}
    assert endpoint.accepts(ok)
    assert not endpoint.accepts({**ok, "rule": "R2"})
    assert not endpoint.accepts({**ok, "severity": "warning"})
    assert not endpoint.accepts({**ok, "cluster": "c2"})
    assert Endpoint("all", "http://h/").accepts({**ok, "rule": "R2", "cluster": "c9"})


BASE = '[[endpoint]]\nname = "oncall"\nurl = "http://127.0.0.1/hook"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + 'formt = "json"\n', r"endpoint 'oncall': unknown key 'formt'; did you mean 'format'\?"),
        (
            BASE + 'format = "xml"\n',
            r"endpoint 'oncall': format 'xml' is not one of json, alertmanager, slack",
        ),
        ('[[endpoint]]\nname = "oncall"\n', r"endpoint 'oncall': no url; set url_env .*url_file, or url"),
        (
            '[[endpoint]]\nname = "oncall"\nurl_env = "NOT_SET_ANYWHERE"\n',
            r"endpoint 'oncall': url_env names environment variable NOT_SET_ANYWHERE, which is not set or "
            r"empty; export NOT_SET_ANYWHERE",
        ),
        (
            BASE + 'secret_env = "NOT_SET_ANYWHERE"\n',
            r"endpoint 'oncall': secret_env names environment variable NOT_SET_ANYWHERE",
        ),
        (
            '[[endpoint]]\nname = "oncall"\nurl_file = "no-such-file"\n',
            r"endpoint 'oncall': url_file .*no-such-file cannot be read: No such file",
        ),
        (BASE + BASE, r"two endpoints are named 'oncall'; names must be unique"),
        (
            BASE + "rate_per_second = -1\n",
            r"endpoint 'oncall': rate_per_second must be a positive number, got -1",
        ),
        (BASE + 'timeout_seconds = "5"\n', r"endpoint 'oncall': timeout_seconds must be a positive number"),
        (BASE + "burst = true\n", r"endpoint 'oncall': burst must be a positive number, got True"),
        (BASE + "burst = 0.5\n", r"endpoint 'oncall': burst must be at least 1"),
        (BASE + "max_age_seconds = nan\n", r"endpoint 'oncall': max_age_seconds must be a positive number"),
        (
            BASE + "max_attempts = 0\n",
            r"endpoint 'oncall': max_attempts must be a whole number of at least 1",
        ),
        (BASE + "max_attempts = 2.5\n", r"endpoint 'oncall': max_attempts must be a whole number .*got 2.5"),
        (
            BASE + "max_attempts = true\n",
            r"endpoint 'oncall': max_attempts must be a whole number .*got True",
        ),
        (
            BASE + "backoff_base_seconds = 10\nbackoff_cap_seconds = 5\n",
            r"endpoint 'oncall': backoff_cap_seconds \(5.0\) is below backoff_base_seconds \(10.0\)",
        ),
        (BASE + 'severities = ["high"]\n', r"endpoint 'oncall': unknown severities \['high'\]; use critical"),
        (
            BASE + 'rules = ["QUORUM_ZOMBIE_LEADR"]\n',
            r"endpoint 'oncall': unknown rule ids \['QUORUM_ZOMBIE_LEADR'\]; did you mean "
            r"\['QUORUM_ZOMBIE_LEADER'\]",
        ),
        (BASE + 'clusters = "c1"\n', r"endpoint 'oncall': clusters must be a list of strings"),
        (BASE + 'url_env = "ONCALL_URL"\n', r"endpoint 'oncall': give only one of url, url_env"),
        (
            BASE + 'secret = "inline"\n',
            r"endpoint 'oncall': unknown key 'secret'; secrets never go in the config file; use secret_env",
        ),
        ('[[endpoint]]\nurl = "http://h/"\n', r"endpoint #1 needs a name"),
        ('title = "x"\n', r"unknown top-level key\(s\) \['title'\]"),
        ("", r"no endpoints; add at least one \[\[endpoint\]\]"),
        ("[[endpoint]\n", r"is not valid TOML"),
        (
            '[[endpoint]]\nname = "oncall"\nurl = "ftp://h/"\n',
            r"endpoint 'oncall': the url \(from key 'url'\) must start with http\(s\)://",
        ),
    ],
)
def test_config_errors_name_the_endpoint_and_key_and_the_fix(
    write_config: Callable[[str], Path], text: str, expected: str
) -> None:
    path = write_config(text)
    with pytest.raises(WebhookConfigError, match=expected) as raised:
        load_endpoints(path, environ=ENV)
    assert str(path) in str(raised.value)


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(WebhookConfigError, match=r"cannot read webhook config .*nope.toml: No such file"):
        load_endpoints(tmp_path / "nope.toml", environ={})


def test_config_errors_never_show_a_url_or_secret_from_env_or_file(
    write_config: Callable[[str], Path], tmp_path: Path
) -> None:
    # The env var holds something that is not a URL (a secret pasted in the
    # wrong variable): the error must say where it came from, not what it is.
    env = {"ONCALL_URL": "xoxb-SECRET-TOKEN-VALUE"}
    path = write_config('[[endpoint]]\nname = "oncall"\nurl_env = "ONCALL_URL"\n')
    with pytest.raises(WebhookConfigError) as raised:
        load_endpoints(path, environ=env)
    assert "env var ONCALL_URL" in str(raised.value)
    assert "SECRET-TOKEN" not in str(raised.value)

    (tmp_path / "url").write_text("not-a-url-SECRET-TOKEN-VALUE")
    path = write_config('[[endpoint]]\nname = "oncall"\nurl_file = "url"\n')
    with pytest.raises(WebhookConfigError) as raised:
        load_endpoints(path, environ={})
    assert "SECRET-TOKEN" not in str(raised.value)
