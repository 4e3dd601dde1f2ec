"""Configuration: defaults < TOML file < environment < overrides, and errors that name the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trimtab.config.loader import load_settings, parse_assignments, set_path
from trimtab.config.settings import MIN_ACQUIRE_WINDOW_S, Settings
from trimtab.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TRIMTAB_* variable of the machine running the tests may leak in."""
    for name in list(os.environ):
        if name.upper().startswith("TRIMTAB_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trimtab.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings()
    assert isinstance(s, Settings) and type(s) is Settings
    assert s.shedding.target_std == 0.25
    assert s.channel.in_flight_timeout_s == 30.0
    assert s.namespace.default_bundles == 4
    assert s.split.algorithm == "range_equally_divide"
    assert s.zk_path == "/trimtab/local"


def test_each_layer_overrides_the_one_below(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        """
[shedding]
target_std = 0.5
interval_s = 11.0

[channel]
tombstone_delay_s = 100.0

[cluster]
name = "from-file"
""",
    )
    s = load_settings(path)
    assert (s.shedding.target_std, s.shedding.interval_s, s.cluster.name) == (0.5, 11.0, "from-file")
    assert s.channel.tombstone_delay_s == 100.0
    assert s.channel.in_flight_timeout_s == 30.0  # untouched fields keep their defaults

    monkeypatch.setenv("TRIMTAB_SHEDDING__TARGET_STD", "0.3")
    monkeypatch.setenv("TRIMTAB_CHANNEL__IN_FLIGHT_TIMEOUT_S", "5")
    s = load_settings(path)
    assert s.shedding.target_std == 0.3  # env beats file
    assert s.shedding.interval_s == 11.0  # file fields of the same section survive
    assert s.channel.in_flight_timeout_s == 5.0
    assert s.channel.tombstone_delay_s == 100.0

    s = load_settings(path, {"shedding": {"target_std": 0.2}, "cluster": {"name": "from-flags"}})
    assert s.shedding.target_std == 0.2  # overrides beat env
    assert s.shedding.interval_s == 11.0
    assert s.cluster.name == "from-flags"
    assert s.channel.in_flight_timeout_s == 5.0

    s = load_settings(path, environ=False)
    assert s.shedding.target_std == 0.5
    assert s.channel.in_flight_timeout_s == 30.0


def test_env_alone_and_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMTAB_BROKER__TAGS", '{"zone": "a", "rack": "r1"}')
    monkeypatch.setenv("TRIMTAB_BROKER__CAPACITY__CPU_CORES", "8")
    monkeypatch.setenv("TRIMTAB_PLACEMENT__AWARENESS_TAGS", '["zone", "rack"]')
    monkeypatch.setenv("TRIMTAB_SHEDDING__ENABLED", "false")
    s = load_settings()
    assert s.broker.tags == {"zone": "a", "rack": "r1"}
    assert s.broker.capacity.cpu_cores == 8.0
    assert s.placement.awareness_tags == ["zone", "rack"]
    assert s.shedding.enabled is False


def test_config_path_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[cluster]\nname = "via-env-path"\n')
    monkeypatch.setenv("TRIMTAB_CONFIG", str(path))
    assert load_settings().cluster.name == "via-env-path"
    explicit = tmp_path / "explicit.toml"
    explicit.write_text('[cluster]\nname = "explicit"\n')
    assert load_settings(explicit).cluster.name == "explicit"  # an explicit path wins


def test_overrides_from_set_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "[split]\nmax_topics = 10\n")
    overrides = parse_assignments(["split.max_topics=20", "split.algorithm=topic_count_equally_divide"])
    s = load_settings(path, overrides)
    assert s.split.max_topics == 20
    assert s.split.algorithm == "topic_count_equally_divide"


# ------------------------------------------------------------------------------------------- errors


def error_of(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    "overrides,path",
    [
        ({"shedding": {"target_std": 0}}, "shedding.target_std"),
        ({"shedding": {"target_std": "lots"}}, "shedding.target_std"),
        ({"zookeeper": {"session_timeout_s": 0.5}}, "zookeeper.session_timeout_s"),
        ({"kafka": {"channel_partitions": 0}}, "kafka.channel_partitions"),
        ({"cluster": {"name": "has spaces"}}, "cluster.name"),
        ({"split": {"algorithm": "by_magic"}}, "split.algorithm"),
        ({"http": {"port": 70000}}, "http.port"),
        ({"broker": {"capacity": {"cpu_cores": -1}}}, "broker.capacity.cpu_cores"),
        ({"logging": {"level": "loud"}}, "logging.level"),
        ({"load": {"history_weight": 1.0}}, "load.history_weight"),
    ],
)
def test_invalid_values_name_the_field(overrides: dict[str, Any], path: str) -> None:
    message = error_of(None, overrides)
    assert path in message
    assert message.startswith("invalid configuration")


def test_invalid_env_value_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMTAB_SHEDDING__TARGET_STD", "abc")
    message = error_of()
    assert "shedding.target_std" in message and "'abc'" in message


def test_invalid_file_value_names_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "[healing]\nchunk_size = 0\n")
    message = error_of(path)
    assert "healing.chunk_size" in message
    assert str(path) in message


@pytest.mark.parametrize(
    "text,field",
    [
        ("[channel]\nbogus = 1\n", "channel.bogus"),
        ("bogus = 1\n", "bogus"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[broker.capacity]\ncpus = 4\n", "broker.capacity.cpus"),
    ],
)
def test_unknown_keys_in_the_file_are_rejected(tmp_path: Path, text: str, field: str) -> None:
    message = error_of(write(tmp_path, text))
    assert field in message
    assert "xtra" in message  # pydantic: "Extra inputs are not permitted"


def test_missing_or_broken_file(tmp_path: Path) -> None:
    assert "does not exist" in error_of(tmp_path / "nope.toml")
    assert "not valid TOML" in error_of(write(tmp_path, "[channel\n"))


@pytest.mark.parametrize(
    "overrides,fields",
    [
        (
            {"channel": {"tombstone_delay_s": 40, "in_flight_timeout_s": 50}},
            ("channel.tombstone_delay_s", "channel.in_flight_timeout_s"),
        ),
        (
            {"load": {"report_interval_s": 100, "report_max_interval_s": 50, "ttl_s": 2000}},
            ("load.report_interval_s", "load.report_max_interval_s"),
        ),
        (
            {"load": {"ttl_s": 100, "report_max_interval_s": 200}},
            ("load.ttl_s", "load.report_max_interval_s"),
        ),
        (
            {"healing": {"max_in_flight": 10, "max_in_flight_per_broker": 11}},
            ("healing.max_in_flight_per_broker", "healing.max_in_flight"),
        ),
        (
            {"channel": {"in_flight_timeout_s": 2.9}},  # the default 2-s lease margin leaves 0.9 s to acquire
            ("channel.in_flight_timeout_s", "broker.adapter.lease_margin_s"),
        ),
        (
            {"channel": {"in_flight_timeout_s": 1.0}, "broker": {"adapter": {"lease_margin_s": 0.5}}},
            ("channel.in_flight_timeout_s", "broker.adapter.lease_margin_s"),
        ),
        ({"broker": {"adapter": {"kind": "webhook"}}}, ("broker.adapter.url",)),
        ({"broker": {"adapter": {"kind": "command"}}}, ("broker.adapter.command",)),
    ],
)
def test_cross_field_rules(overrides: dict[str, Any], fields: tuple[str, ...]) -> None:
    message = error_of(None, overrides)
    for f in fields:
        assert f in message


def test_cross_field_rules_accept_the_boundary() -> None:
    s = load_settings(None, {"channel": {"tombstone_delay_s": 50, "in_flight_timeout_s": 50}})
    assert s.channel.tombstone_delay_s == s.channel.in_flight_timeout_s == 50
    s = load_settings(None, {"broker": {"adapter": {"kind": "webhook", "url": "http://127.0.0.1:1"}}})
    assert s.broker.adapter.url == "http://127.0.0.1:1"
    # In-flight records leave a broker exactly the least window to take the bundle under a lease.
    s = load_settings(None, {"channel": {"in_flight_timeout_s": 3.0}})
    assert s.channel.in_flight_timeout_s - s.broker.adapter.lease_margin_s == MIN_ACQUIRE_WINDOW_S


def test_cross_field_rules_see_all_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A combination that is only wrong once the layers are merged is still caught."""
    path = write(tmp_path, "[channel]\ntombstone_delay_s = 40.0\n")
    assert load_settings(path).channel.tombstone_delay_s == 40.0
    monkeypatch.setenv("TRIMTAB_CHANNEL__IN_FLIGHT_TIMEOUT_S", "45")
    assert "channel.tombstone_delay_s" in error_of(path)


def test_all_errors_are_reported_at_once() -> None:
    message = error_of(None, {"shedding": {"target_std": 0}, "http": {"port": -1}})
    assert "shedding.target_std" in message and "http.port" in message


# --------------------------------------------------------------------------------------- --set parsing


def test_parse_assignments() -> None:
    assert parse_assignments(["a.b=1"]) == {"a": {"b": 1}}
    assert parse_assignments(["a.b=1.5", "a.c=true", "x.y=hello"]) == {
        "a": {"b": 1.5, "c": True},
        "x": {"y": "hello"},
    }
    assert parse_assignments(['a.b="quoted"', 'a.c=["x", "y"]']) == {"a": {"b": "quoted", "c": ["x", "y"]}}
    assert parse_assignments(["a.b.c = 2"]) == {"a": {"b": {"c": 2}}}
    assert parse_assignments(["a.b=x=y"]) == {"a": {"b": "x=y"}}
    assert parse_assignments(["a.b="]) == {"a": {"b": ""}}
    assert parse_assignments([]) == {}


def test_parse_assignments_errors() -> None:
    with pytest.raises(ConfigError, match=r"expected section\.field=value"):
        parse_assignments(["a.b"])
    with pytest.raises(ConfigError, match="not a section"):
        parse_assignments(["a=1", "a.b=2"])


def test_set_path() -> None:
    tree: dict[str, Any] = {"a": {"x": 1}}
    set_path(tree, "a.b.c", 3)
    set_path(tree, "d", 4)
    assert tree == {"a": {"x": 1, "b": {"c": 3}}, "d": 4}


def test_an_agent_needs_an_explicit_adapter_kind() -> None:
    """No default adapter: an agent beside a real broker must never silently manage a simulated one."""
    from trimtab.agent.adapters import build_adapter
    from trimtab.errors import ConfigError

    s = Settings()
    assert s.broker.adapter.kind is None
    with pytest.raises(ConfigError, match=r"broker\.adapter\.kind is not set"):
        build_adapter(s, "b1:1")
    sim, handle = build_adapter(
        Settings.model_validate({"broker": {"adapter": {"kind": "simulated"}}}), "b1:1"
    )
    assert handle is sim


def test_security_settings_are_checked_without_echoing_a_secret() -> None:
    """Token, ZooKeeper credentials and TLS pairs are validated at load; no message repeats a secret."""
    for overrides, needle in (
        ({"security": {"admin_token": "too-short"}}, "security.admin_token must be at least 16 characters"),
        ({"security": {"read_token": "has inner whitespace!"}}, "security.read_token must be"),
        (
            {"zookeeper": {"auth_digest": "no-colon-here"}},
            "zookeeper.auth_digest must look like user:password",
        ),
        (
            {"zookeeper": {"auth_digest": "u:p", "auth_digest_file": "/etc/zk.digest"}},
            "zookeeper.auth_digest or zookeeper.auth_digest_file, not both",
        ),
        (
            {"http": {"tls_cert_file": "/etc/cert.pem"}},
            "http.tls_cert_file and http.tls_key_file go together",
        ),
    ):
        message = error_of(None, overrides)
        assert needle in message, message
        for secret in ("too-short", "has inner whitespace!", "no-colon-here", "u:p"):
            assert secret not in message, message
    s = load_settings(
        None, {"security": {"admin_token": "a" * 16}, "zookeeper": {"auth_digest": "trimtab:pw"}}
    )
    assert s.security.auth == "required"
    assert "a" * 16 not in repr(s) and "trimtab:pw" not in repr(s)
    assert s.model_dump(mode="json")["security"]["admin_token"] == "**********"
    assert s.http_url(8443) == "http://127.0.0.1:8443"
    tls = {"http": {"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem", "advertised_host": "node-1"}}
    assert load_settings(None, tls).http_url(8443) == "https://node-1:8443"
