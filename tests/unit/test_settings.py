"""Share-group settings (``queueflow.settings``): KIP-932 defaults, names, env vars, ranges."""

from __future__ import annotations

import dataclasses
import re

import pytest

from queueflow.engine.partition import SharePartition, SharePartitionConfig
from queueflow.errors import ConfigurationError, InvalidRequestError
from queueflow.settings import (
    SETTINGS,
    AuthMode,
    Setting,
    ShareGroupSettings,
    StateDurability,
    check_declarations,
    lookup,
    show_value,
)

BY_NAME = {s.name: s for s in SETTINGS}


def load(
    overrides: dict[str, object] | None = None, env: dict[str, str] | None = None
) -> ShareGroupSettings:
    return ShareGroupSettings.load(overrides, env={} if env is None else env)


def other_valid_value(s: Setting) -> int | str:
    """A valid value different from the default."""
    if s.choices:  # (a choice of one, e.g. ssl.keystore.type=PEM: that one)
        return next((c for c in s.choices if c != show_value(s.default)), s.choices[0])
    if s.attr == "auth_secret":  # refused if weak
        return "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0"
    if s.attr == "leader_listener_ssl_endpoint_identification_algorithm":
        return ""  # Kafka's one other value: no host-name check
    if isinstance(s.default, str):  # free text: host names and listeners
        return "127.0.0.1:9100" if ":" in s.default else "leader-1.example"
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
    # queueflow.auth.mode=hmac needs a secret (a cross-setting check).
    extra = (
        {"auth_secret": "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0"}
        if setting.attr == "auth_mode"
        else {}
    )
    expected = setting.parse(value, "test")
    assert getattr(load({setting.name: value, **extra}), setting.attr) == expected
    assert getattr(load({setting.attr: value, **extra}), setting.attr) == expected


def test_unknown_setting_name() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"group.share.no.such.setting": 1})
    message = str(info.value)
    assert "'group.share.no.such.setting'" in message
    assert "docs/configuration.md" in message  # says where the known settings are


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
    extra = (
        {"QUEUEFLOW_AUTH_SECRET": "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0"}
        if setting.attr == "auth_mode"
        else {}
    )
    assert getattr(load(env={setting.env: str(value), **extra}), setting.attr) == setting.parse(
        value, "test"
    )


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
        ("group.share.min.record.lock.duration.ms", 1000),
        ("group.share.max.record.lock.duration.ms", 3600000),
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


# ------------------------------------------------------------------------------------------------
# One source: the dataclass and the engine follow SETTINGS
# ------------------------------------------------------------------------------------------------


def test_dataclass_fields_follow_the_table() -> None:
    check_declarations()  # also runs at import; explicit here so a failure names this test
    assert [f.name for f in dataclasses.fields(ShareGroupSettings)] == [s.attr for s in SETTINGS]


def _settings_class(**changes: tuple[type, object] | None) -> type:
    """A copy of ShareGroupSettings' declarations with some fields changed (None: removed)."""
    spec: list[tuple[str, type, object]] = []
    for s in SETTINGS:
        change = changes.pop(s.attr, (type(s.default), s.default))
        if change is not None:
            spec.append((s.attr, change[0], dataclasses.field(default=change[1])))
    for name, extra in changes.items():  # fields the table does not have
        assert extra is not None
        spec.append((name, extra[0], dataclasses.field(default=extra[1])))
    return dataclasses.make_dataclass("Copy", spec, frozen=True)


def test_declaration_check_accepts_an_exact_copy() -> None:
    check_declarations(_settings_class())


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"delivery_count_limit": (int, 6)}, "delivery_count_limit defaults to 6"),
        ({"delivery_count_limit": (str, 5)}, "delivery_count_limit is annotated"),
        ({"auto_offset_reset": (str, "earliest")}, "defaults to 'earliest'"),
        ({"max_size": None}, "missing ['max_size']"),
        ({"surprise_ms": (int, 1)}, "extra ['surprise_ms']"),
    ],
)
def test_declaration_check_rejects_a_disagreeing_dataclass(
    changes: dict[str, tuple[type, object] | None], expected: str
) -> None:
    with pytest.raises(TypeError) as info:
        check_declarations(_settings_class(**changes))
    assert expected in str(info.value)


def test_settings_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ShareGroupSettings(30000)  # type: ignore[call-arg]


def test_lookup_by_either_name() -> None:
    assert lookup("min_record_lock_duration_ms") is lookup(
        "group.share.min.record.lock.duration.ms"
    )
    with pytest.raises(KeyError):
        lookup("group.share.no.such.setting")


ENGINE_FIELDS = {
    "max_in_flight_records": "group.share.partition.max.record.locks",
    "delivery_count_limit": "group.share.delivery.count.limit",
    "record_lock_duration_ms": "group.share.record.lock.duration.ms",
    "max_record_lock_duration_ms": "group.share.max.record.lock.duration.ms",
    "min_record_lock_duration_ms": "group.share.min.record.lock.duration.ms",
}


#: The member abuse limits (KIP-1222 RENEW cap and queueflow's per-member limits).
LIMIT_FIELDS = {
    "max_renewal_ms": "share.record.lock.max.renewal.ms",
    "member_max_in_flight_records": "share.member.max.in.flight.records",
    "member_max_acquisition_rate": "share.member.max.acquisition.rate",
    "release_abuse_records": "share.member.release.abuse.records",
    "release_abuse_ratio_percent": "share.member.release.abuse.ratio.percent",
    "release_abuse_window_ms": "share.member.release.abuse.window.ms",
}


def test_engine_defaults_come_from_the_table() -> None:
    cfg = SharePartitionConfig()
    assert {f.name for f in dataclasses.fields(cfg)} == set(ENGINE_FIELDS) | set(LIMIT_FIELDS) | {
        "renew_enabled",
        "release_by_lock_end",  # from queueflow.processing.guarantee (group_configs)
        # group configs with literal defaults (queueflow.engine.group_config)
        "redelivery_backoff_ms",
        "redelivery_backoff_multiplier",
        "redelivery_backoff_max_ms",
        "delivery_count_mode",
        "max_release_delay_ms",  # queueflow.redelivery.max.delay.ms
        "throttle_delivery",  # queueflow.delivery.throttle.enable
        "dead_letter",  # errors.deadletterqueue.topic.name is set (a group config)
    }
    assert cfg.release_by_lock_end is False
    for attr, name in {**ENGINE_FIELDS, **LIMIT_FIELDS}.items():
        assert getattr(cfg, attr) == BY_NAME[name].default, attr
    assert cfg.renew_enabled is BY_NAME["share.renew.acknowledge.enable"].default


@pytest.mark.parametrize(("attr", "name"), ENGINE_FIELDS.items())
def test_engine_ranges_come_from_the_table(attr: str, name: str) -> None:
    s = BY_NAME[name]
    assert s.minimum is not None and s.maximum is not None
    # A group config (KIP-1240) may go up to the maximum of its broker-level upper bound.
    bound = BY_NAME.get(name.replace("group.share.", "group.share.max."))
    high = s.maximum if bound is None or bound.maximum is None else bound.maximum
    allowed = f"{s.minimum}..{high}"
    for bad in (s.minimum - 1, high + 1):
        with pytest.raises(ConfigurationError) as info:
            SharePartitionConfig(**{attr: bad})
        message = str(info.value)
        assert f"{name}={bad}" in message
        if attr != "record_lock_duration_ms":  # its cross-check may fire first; same style
            assert allowed in message


def test_engine_config_from_settings_round_trips() -> None:
    s = load({"min_record_lock_duration_ms": 5000, "record_lock_duration_ms": 5000})
    cfg = SharePartitionConfig(
        max_in_flight_records=s.partition_max_record_locks,
        delivery_count_limit=s.delivery_count_limit,
        record_lock_duration_ms=s.record_lock_duration_ms,
        max_record_lock_duration_ms=s.max_record_lock_duration_ms,
        min_record_lock_duration_ms=s.min_record_lock_duration_ms,
    )
    assert cfg.min_record_lock_duration_ms == 5000


# ------------------------------------------------------------------------------------------------
# group.share.min.record.lock.duration.ms
# ------------------------------------------------------------------------------------------------


def test_min_record_lock_duration_default_keeps_queueflow_behaviour() -> None:
    s = BY_NAME["group.share.min.record.lock.duration.ms"]
    assert (s.default, s.minimum, s.maximum) == (1000, 1000, 30000)  # Kafka: 15000 in [1000..30000]
    assert s.env == "QUEUEFLOW_GROUP_SHARE_MIN_RECORD_LOCK_DURATION_MS"
    assert "15000" in s.doc  # the deviation from Kafka's default is documented
    assert load().min_record_lock_duration_ms == 1000


@pytest.mark.parametrize("value", [999, 30001])
def test_min_record_lock_duration_range(value: int) -> None:
    with pytest.raises(ConfigurationError, match=r"\[1000\.\.30000\]"):
        load({"group.share.min.record.lock.duration.ms": value})


def test_lock_duration_below_minimum_is_rejected() -> None:
    env = {"QUEUEFLOW_GROUP_SHARE_MIN_RECORD_LOCK_DURATION_MS": "20000"}
    with pytest.raises(ConfigurationError) as info:
        load({"record_lock_duration_ms": 15000}, env=env)
    message = str(info.value)
    assert "group.share.record.lock.duration.ms=15000 (from arguments)" in message
    assert (
        "group.share.min.record.lock.duration.ms=20000 "
        "(from $QUEUEFLOW_GROUP_SHARE_MIN_RECORD_LOCK_DURATION_MS)"
    ) in message
    assert "[20000..60000]" in message
    assert load(env=env).record_lock_duration_ms == 30000
    assert load({"record_lock_duration_ms": 20000}, env=env).record_lock_duration_ms == 20000


def test_lock_duration_cross_checks_on_direct_construction() -> None:
    with pytest.raises(ConfigurationError, match=r"group\.share\.min\.record\.lock\.duration\.ms"):
        ShareGroupSettings(min_record_lock_duration_ms=30000, record_lock_duration_ms=29999)


def test_engine_uses_min_record_lock_duration_for_consumer_locks() -> None:
    cfg = SharePartitionConfig(min_record_lock_duration_ms=5000)
    sp = SharePartition(cfg, 0)
    with pytest.raises(InvalidRequestError) as info:
        sp.acquire("m", 1, 10, 0, lock_duration_ms=4999)
    message = str(info.value)
    assert "lock duration 4999 ms is out of range: allowed 5000..60000 ms" in message
    assert "group.share.min.record.lock.duration.ms" in message
    assert sp.end_offset == 0
    sp.acquire("m", 1, 10, 0, lock_duration_ms=5000)
    assert sp.record(0).lock_deadline_ms == 5000


def test_engine_record_lock_below_minimum_names_both_settings() -> None:
    with pytest.raises(ConfigurationError) as info:
        SharePartitionConfig(record_lock_duration_ms=10000, min_record_lock_duration_ms=20000)
    message = str(info.value)
    assert "group.share.record.lock.duration.ms=10000" in message
    assert "20000..60000" in message
    assert "group.share.min.record.lock.duration.ms" in message


def test_a_listener_that_is_not_host_port_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"queueflow.leader.listener=nohost.*host:port"):
        load({"queueflow.leader.listener": "nohost"})
    with pytest.raises(ConfigurationError, match=r"port of 'h:99999' is not in 0..65535"):
        load({"queueflow.leader.listener": "h:99999"})
    assert load({"queueflow.leader.listener": ""}).leader_listener == ""


def test_auth_hmac_needs_a_secret_and_the_secret_is_never_shown() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"queueflow.auth.mode": "hmac"})
    assert "QUEUEFLOW_AUTH_SECRET" in str(info.value)
    s = load(
        {
            "queueflow.auth.mode": "hmac",
            "queueflow.auth.secret": "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0",
        }
    )
    assert "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0" not in repr(
        s
    ) and "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0" not in str(s.as_kip_names())
    assert s.auth_secret == "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0"


# ------------------------------------------------------------------------------------------------
# Typed values: booleans and choices
# ------------------------------------------------------------------------------------------------


def test_booleans_are_bools_from_text_in_any_case() -> None:
    for text, flag in (("true", True), ("FALSE", False), (" False ", False), (True, True)):
        assert load({"share.renew.acknowledge.enable": text}).renew_acknowledge_enable is flag
    assert (
        load(env={"QUEUEFLOW_SHARE_RENEW_ACKNOWLEDGE_ENABLE": "false"}).renew_acknowledge_enable
        is False
    )


def test_a_boolean_that_is_not_true_or_false_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"share.renew.acknowledge.enable": "yes"})
    assert "share.renew.acknowledge.enable='yes'" in str(info.value)
    assert "true | false" in str(info.value)


def test_choices_are_enum_members_equal_to_their_config_text() -> None:
    settings = load({"queueflow.leader.state.durability": "buffered"})
    assert settings.state_durability is StateDurability.BUFFERED
    assert settings.state_durability == "buffered" and f"{settings.state_durability}" == "buffered"
    assert (
        load({"auth_secret": "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0"}).control_auth_mode
        is AuthMode.HMAC
    )
    assert load().control_auth_mode is AuthMode.NONE


def test_an_unknown_choice_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigurationError) as info:
        load({"queueflow.auth.mode": "HMAC"})
    assert "queueflow.auth.mode='HMAC'" in str(info.value)
    assert "auto | hmac | none" in str(info.value)


def test_kip_names_show_config_text() -> None:
    names = load({"share.renew.acknowledge.enable": False}).as_kip_names()
    assert names["share.renew.acknowledge.enable"] == "false"
    assert names["queueflow.leader.state.durability"] == "acked"
    assert names["group.share.delivery.count.limit"] == 5
    assert show_value(True) == "true"


@pytest.mark.parametrize(("attr", "name"), LIMIT_FIELDS.items())
def test_limit_ranges_come_from_the_table(attr: str, name: str) -> None:
    s = BY_NAME[name]
    assert s.minimum is not None
    bad = [s.minimum - 1] + ([] if s.maximum is None else [s.maximum + 1])
    for value in bad:
        with pytest.raises(ConfigurationError) as info:
            SharePartitionConfig(**{attr: value})
        assert f"{name}={value}" in str(info.value)
