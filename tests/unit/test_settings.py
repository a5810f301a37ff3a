"""Share-group settings (``queueflow.settings``): KIP-932 defaults, names, env vars, ranges."""

from __future__ import annotations

import re

import pytest

from queueflow.errors import ConfigurationError
from queueflow.settings import SETTINGS, Setting, ShareGroupSettings

BY_NAME = {s.name: s for s in SETTINGS}


def load(overrides: dict[str, object] | None = None, env: dict[str, str] | None = None):
    return ShareGroupSettings.load(overrides, env={} if env is None else env)


def other_valid_value(s: Setting) -> int | str:
    """A valid value different from the default."""
    if s.choices:
        return next(c for c in s.choices if c != s.default)
    assert isinstance(s.default, int)
    if s.maximum is None or s.default + 1 <= s.maximum:
        return s.default + 1
    return s.default - 1


# ------------------------------------------------------------------------------------------------
# Defaults
# ------------------------------------------------------------------------------------------------


def test_defaults_match_kip_932() -> None:
    s = load()
    assert s.record_lock_duration_ms == 30000
    assert s.delivery_count_limit == 5
    assert s.partition_max_record_locks == 2000
    assert s.session_timeout_ms == 45000
    assert s.heartbeat_interval_ms == 5000
    assert s.max_record_lock_duration_ms == 60000
    assert s.max_size == 200
    assert s.auto_offset_reset == "latest"


def test_load_defaults_equal_constructor_defaults() -> None:
    assert load() == ShareGroupSettings()


def test_declared_defaults_match_dataclass_defaults() -> None:
    plain = ShareGroupSettings()
    for s in SETTINGS:
        assert getattr(plain, s.attr) == s.default, s.attr


def test_as_kip_names() -> None:
    names = load().as_kip_names()
    assert names["group.share.record.lock.duration.ms"] == 30000
    assert names["group.share.delivery.count.limit"] == 5
    assert names["group.share.partition.max.record.locks"] == 2000
    assert names["group.share.session.timeout.ms"] == 45000
    assert names["group.share.heartbeat.interval.ms"] == 5000
    assert set(names) == {s.name for s in SETTINGS}


# ------------------------------------------------------------------------------------------------
# Names
# ------------------------------------------------------------------------------------------------


def test_kip_names_and_attribute_names_are_both_accepted() -> None:
    s = load(
        {
            "group.share.delivery.count.limit": 3,
            "record_lock_duration_ms": 15000,
            "share.auto.offset.reset": "earliest",
            "max_poll_records": "250",
        }
    )
    assert s.delivery_count_limit == 3
    assert s.record_lock_duration_ms == 15000
    assert s.auto_offset_reset == "earliest"
    assert s.max_poll_records == 250


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.attr)
def test_every_setting_by_either_name(setting: Setting) -> None:
    value = other_valid_value(setting)
    assert getattr(load({setting.name: value}), setting.attr) == value
    assert getattr(load({setting.attr: value}), setting.attr) == value


def test_unknown_setting_name() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"group.share.no.such.setting": 1})
    message = str(info.value)
    assert "'group.share.no.such.setting'" in message
    assert "group.share.delivery.count.limit" in message  # lists the known settings


# ------------------------------------------------------------------------------------------------
# Environment
# ------------------------------------------------------------------------------------------------


def test_env_variable_names() -> None:
    assert (
        BY_NAME["group.share.record.lock.duration.ms"].env
        == "QUEUEFLOW_GROUP_SHARE_RECORD_LOCK_DURATION_MS"
    )
    assert BY_NAME["queueflow.request.timeout.ms"].env == "QUEUEFLOW_REQUEST_TIMEOUT_MS"
    for s in SETTINGS:
        assert re.fullmatch(r"QUEUEFLOW_[A-Z0-9_]+", s.env), s.env


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.attr)
def test_every_setting_from_env(setting: Setting) -> None:
    value = other_valid_value(setting)
    assert getattr(load(env={setting.env: str(value)}), setting.attr) == value


def test_arguments_override_env() -> None:
    env = {"QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMIT": "7"}
    assert load(env=env).delivery_count_limit == 7
    assert load({"delivery_count_limit": 4}, env=env).delivery_count_limit == 4
    assert load({"group.share.delivery.count.limit": 4}, env=env).delivery_count_limit == 4


def test_explicit_env_replaces_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMIT", "8")
    assert ShareGroupSettings.load(env={}).delivery_count_limit == 5
    assert ShareGroupSettings.load().delivery_count_limit == 8


def test_env_out_of_range_names_the_variable() -> None:
    with pytest.raises(ConfigurationError) as info:
        load(env={"QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMIT": "11"})
    message = str(info.value)
    assert "group.share.delivery.count.limit" in message
    assert "$QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMIT" in message
    assert "[2..10]" in message


def test_env_not_an_integer() -> None:
    with pytest.raises(ConfigurationError) as info:
        load(env={"QUEUEFLOW_GROUP_SHARE_SESSION_TIMEOUT_MS": "soon"})
    message = str(info.value)
    assert "group.share.session.timeout.ms" in message
    assert "'soon'" in message
    assert "not an integer" in message


# ------------------------------------------------------------------------------------------------
# Ranges
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("group.share.delivery.count.limit", 1, "[2..10]"),
        ("group.share.delivery.count.limit", 11, "[2..10]"),
        ("group.share.record.lock.duration.ms", 999, "[1000..3600000]"),
        ("group.share.partition.max.record.locks", 99, "[100..10000]"),
        ("group.share.partition.max.record.locks", 10001, "[100..10000]"),
        ("group.share.max.size", 0, "[1..1000]"),
        ("share.coordinator.snapshot.update.records.per.snapshot", 501, "[0..500]"),
        ("group.share.session.timeout.ms", 999, "[1000..]"),
    ],
)
def test_out_of_range_names_setting_and_range(name: str, value: int, allowed: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load({name: value})
    message = str(info.value)
    assert f"{name}={value}" in message
    assert allowed in message
    assert "out of range" in message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("group.share.delivery.count.limit", 2),
        ("group.share.delivery.count.limit", 10),
        ("group.share.record.lock.duration.ms", 1000),
        ("group.share.partition.max.record.locks", 100),
        ("group.share.partition.max.record.locks", 10000),
        ("share.coordinator.snapshot.update.records.per.snapshot", 0),
    ],
)
def test_range_bounds_are_inclusive(name: str, value: int) -> None:
    assert load({name: value}).as_kip_names()[name] == value


def test_attribute_name_error_still_names_kip_setting() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"delivery_count_limit": 1})
    assert "group.share.delivery.count.limit" in str(info.value)


def test_bad_choice() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"share.auto.offset.reset": "none"})
    message = str(info.value)
    assert "share.auto.offset.reset" in message
    assert "latest | earliest" in message


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        load({"delivery_count_limit": "many"})


@pytest.mark.parametrize(("heartbeat", "session"), [(45000, 45000), (50000, 45000), (1000, 1000)])
def test_heartbeat_not_below_session_timeout_is_rejected(heartbeat: int, session: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"heartbeat_interval_ms": heartbeat, "session_timeout_ms": session})
    message = str(info.value)
    assert "group.share.heartbeat.interval.ms" in message
    assert "group.share.session.timeout.ms" in message


def test_heartbeat_just_below_session_timeout_is_accepted() -> None:
    s = load({"heartbeat_interval_ms": 44999})
    assert (s.heartbeat_interval_ms, s.session_timeout_ms) == (44999, 45000)


def test_lock_duration_above_maximum_is_rejected() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"group.share.record.lock.duration.ms": 70000})
    assert "group.share.max.record.lock.duration.ms" in str(info.value)
    s = load({"record_lock_duration_ms": 70000, "max_record_lock_duration_ms": 70000})
    assert s.record_lock_duration_ms == 70000


def test_constructor_validates_too() -> None:
    with pytest.raises(ConfigurationError) as info:
        ShareGroupSettings(delivery_count_limit=11)
    assert "group.share.delivery.count.limit" in str(info.value)


def test_constructor_converts_numeric_strings_and_refuses_junk() -> None:
    settings = ShareGroupSettings(record_lock_duration_ms="30000")  # type: ignore[arg-type]
    assert settings.record_lock_duration_ms == 30000
    with pytest.raises(ConfigurationError, match=r"group\.share\.record\.lock\.duration\.ms"):
        ShareGroupSettings(record_lock_duration_ms="thirty seconds")  # type: ignore[arg-type]
