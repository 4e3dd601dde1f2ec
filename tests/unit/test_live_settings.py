"""Live settings (controller/live_settings.py): only the live keys, validated as a whole, hostile stored
values refused with a reason while the settings in force stay."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimtab.config.settings import Settings
from trimtab.controller.live_settings import LIVE_KEYS, LiveSettings, decode, effective


def test_an_override_changes_only_its_key() -> None:
    base = Settings()
    got = effective(base, {"operations.max_in_flight": 7, "operations.max_in_flight_per_namespace": None})
    ops = got.operations
    assert ops.max_in_flight == 7 and ops.max_in_flight_per_broker == base.operations.max_in_flight_per_broker
    assert got.healing == base.healing and got.model_copy(update={"operations": base.operations}) == base


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"operations.keep_finished": 3}, "not settable at run time: operations.keep_finished"),
        ({"zookeeper.hosts": "x"}, "not settable at run time"),
        ({"operations.max_in_flight": 0}, "operations.max_in_flight"),
        ({"operations.max_in_flight": "many"}, "operations.max_in_flight"),
        ({"healing.max_in_flight": 0}, "healing.max_in_flight"),
        ({"healing.grace_s": 5}, "not settable at run time: healing.grace_s"),
    ],
)
def test_what_is_not_live_or_not_valid_is_refused_naming_the_key(
    overrides: dict[str, object], why: str
) -> None:
    with pytest.raises(ValueError, match=why.replace(".", r"\.")):
        effective(Settings(), overrides)


def test_a_hostile_stored_value_leaves_the_settings_in_force() -> None:
    live = LiveSettings(Settings(), None, None)
    live._changed(b'{"overrides": {"operations.max_in_flight": 9}}', None)
    assert live.operations().max_in_flight == 9
    for value in (b"\xff", b"[]", b'{"overrides": 3}', b'{"overrides": {"operations.max_in_flight": -1}}'):
        live._changed(value, None)
        assert live.operations().max_in_flight == 9
    assert live.unreadable == 4
    live._changed(None, None)  # deleted: back to the configured values
    assert live.operations() == Settings().operations


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_no_stored_bytes_raise_anything_but_a_value_error(value: bytes) -> None:
    try:
        got = decode(value)
    except ValueError:
        return
    assert isinstance(got, dict)


def test_the_live_keys_are_real_settings() -> None:
    base = Settings()
    for key in LIVE_KEYS:
        section, field = key.split(".", 1)
        assert field in getattr(base, section).model_dump(), key


def test_healings_throttles_are_live_and_reach_its_config() -> None:
    """Healing plans are operations: their throttles change at run time as the operations' do (the healing
    job reads heal_config() at the start of every round)."""
    live = LiveSettings(Settings(), None, None)
    live._changed(
        b'{"overrides": {"healing.max_in_flight": 12, "healing.max_in_flight_per_broker": 3}}', None
    )
    cfg = live.heal_config()
    assert (cfg.max_in_flight, cfg.max_in_flight_per_broker) == (12, 3)
    assert cfg.grace_s == Settings().healing.grace_s
    assert live.view()["healing"] == {"max_in_flight": 12, "max_in_flight_per_broker": 3}
    live._changed(None, None)
    assert live.heal_config().max_in_flight == Settings().healing.max_in_flight
