"""Group configs (issue #14 item 3): validation against the broker-level bounds, the effective
value of each config, and their storage with the group (queueflow.engine.group_config)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueflow.engine.group import ShareGroup
from queueflow.engine.group_config import (
    GROUP_CONFIG_NAMES,
    GroupConfig,
    OffsetReset,
    describe_group_configs,
    parse_auto_offset_reset,
    parse_duration,
    validate_group_config,
    validate_group_configs,
)
from queueflow.errors import ConfigurationError
from queueflow.protocol import group_codec
from queueflow.protocol.auth import AssignmentTicket, issue_ticket, verify_ticket
from queueflow.server.group_configs import LeaderGroupConfigs
from queueflow.settings import ShareGroupSettings

SETTINGS = ShareGroupSettings()

#: group config -> (broker-level default attribute, min attribute, max attribute)
INT_CONFIGS = {
    "share.record.lock.duration.ms": (
        "record_lock_duration_ms",
        "min_record_lock_duration_ms",
        "max_record_lock_duration_ms",
    ),
    "share.delivery.count.limit": (
        "delivery_count_limit",
        "min_delivery_count_limit",
        "max_delivery_count_limit",
    ),
    "share.partition.max.record.locks": (
        "partition_max_record_locks",
        "min_partition_max_record_locks",
        "max_partition_max_record_locks",
    ),
    "share.session.timeout.ms": (
        "session_timeout_ms",
        "min_session_timeout_ms",
        "max_session_timeout_ms",
    ),
    "share.heartbeat.interval.ms": (
        "heartbeat_interval_ms",
        "min_heartbeat_interval_ms",
        "max_heartbeat_interval_ms",
    ),
}


def test_the_six_group_configs_of_the_issue() -> None:
    assert {"share.auto.offset.reset", *INT_CONFIGS} <= set(GROUP_CONFIG_NAMES)


@pytest.mark.parametrize("name", sorted(INT_CONFIGS))
def test_an_out_of_range_value_names_the_config_the_value_and_the_range(name: str) -> None:
    _, low_attr, high_attr = INT_CONFIGS[name]
    low, high = getattr(SETTINGS, low_attr), getattr(SETTINGS, high_attr)
    for bad in (low - 1, high + 1):
        with pytest.raises(ConfigurationError) as info:
            validate_group_config(name, bad, SETTINGS)
        message = str(info.value)
        assert f"{name}={bad} is out of range: allowed [{low}..{high}]" in message
        assert f"group.share.min.{name.removeprefix('share.')}" in message
    assert validate_group_config(name, low, SETTINGS) == str(low)
    assert validate_group_config(name, f" {high} ", SETTINGS) == str(high)


def test_the_bounds_come_from_the_broker_level_settings() -> None:
    narrow = ShareGroupSettings(min_delivery_count_limit=3, max_delivery_count_limit=6)
    with pytest.raises(ConfigurationError, match=r"allowed \[3\.\.6\]"):
        validate_group_config("share.delivery.count.limit", 7, narrow)
    wide = ShareGroupSettings(max_delivery_count_limit=25)
    assert validate_group_config("share.delivery.count.limit", 25, wide) == "25"


def test_bounds_whose_minimum_exceeds_their_maximum_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"group\.share\.min\.session\.timeout\.ms=70000"):
        ShareGroupSettings(min_session_timeout_ms=70000, max_session_timeout_ms=60000)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("share.delivery.count.limit", "three", "'three' is not an integer"),
        ("share.delivery.count.limit", True, "is not an integer"),
        ("share.delivery.count.limit", 2.5, "is not an integer"),
        ("share.auto.offset.reset", "newest", "choose latest, earliest or by_duration"),
        ("share.auto.offset.reset", "by_duration:1h", "cannot parse duration '1h'"),
        ("share.auto.offset.reset", "by_duration:-PT1H", "must not be negative"),
        ("share.isolation.level", "read_committed", "unknown group config 'share.isolation.level'"),
        ("group.share.delivery.count.limit", 3, "the group configs are: share.auto.offset.reset"),
    ],
)
def test_bad_values_and_unknown_names_are_refused_clearly(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_group_config(name, value, SETTINGS)
    assert message in str(info.value)


def test_auto_offset_reset_accepts_kafka_s_three_forms() -> None:
    assert parse_auto_offset_reset("latest") == OffsetReset("latest")
    assert parse_auto_offset_reset("earliest") == OffsetReset("earliest")
    assert parse_auto_offset_reset("by_duration:PT1H") == OffsetReset("by_duration", 3_600_000)
    assert parse_auto_offset_reset("by_duration:P1DT0.5S") == OffsetReset("by_duration", 86_400_500)
    assert validate_group_config("share.auto.offset.reset", "by_duration:PT30M", SETTINGS) == (
        "by_duration:PT30M"
    )


@given(
    days=st.integers(0, 400),
    hours=st.integers(0, 23),
    minutes=st.integers(0, 59),
    millis=st.integers(0, 59_999),
)
def test_durations_parse_to_their_milliseconds(
    days: int, hours: int, minutes: int, millis: int
) -> None:
    text = f"P{days}DT{hours}H{minutes}M{millis // 1000}.{millis % 1000:03d}S"
    expected = ((days * 24 + hours) * 60 + minutes) * 60_000 + millis
    assert parse_duration(text) == expected
    assert parse_auto_offset_reset(f"by_duration:{text}") == OffsetReset("by_duration", expected)


@given(name=st.sampled_from(sorted(INT_CONFIGS)), value=st.integers(-(10**9), 10**9))
def test_a_value_is_accepted_exactly_when_it_lies_within_its_bounds(name: str, value: int) -> None:
    _, low_attr, high_attr = INT_CONFIGS[name]
    low, high = getattr(SETTINGS, low_attr), getattr(SETTINGS, high_attr)
    if low <= value <= high:
        assert validate_group_config(name, value, SETTINGS) == str(value)
        assert validate_group_config(name, str(value), SETTINGS) == str(value)
    else:
        with pytest.raises(ConfigurationError, match="out of range"):
            validate_group_config(name, value, SETTINGS)


@given(
    session=st.integers(1000, 60_000),
    heartbeat=st.integers(100, 15_000),
    limit=st.integers(2, 10),
)
def test_a_set_is_valid_only_with_the_heartbeat_below_the_session_timeout(
    session: int, heartbeat: int, limit: int
) -> None:
    values = {
        "share.session.timeout.ms": session,
        "share.heartbeat.interval.ms": heartbeat,
        "share.delivery.count.limit": limit,
    }
    if heartbeat < session:
        out = validate_group_configs(values, SETTINGS)
        assert out == {k: str(v) for k, v in values.items()}
        config = GroupConfig.resolve(SETTINGS, out)
        assert (config.session_timeout_ms, config.heartbeat_interval_ms) == (session, heartbeat)
        assert config.delivery_count_limit == limit
        assert config.record_lock_duration_ms == SETTINGS.record_lock_duration_ms
    else:
        with pytest.raises(ConfigurationError, match=r"must be below share\.session\.timeout\.ms"):
            validate_group_configs(values, SETTINGS)


def test_the_cross_check_sees_the_lower_layers() -> None:
    app = {"share.session.timeout.ms": "2000"}
    with pytest.raises(ConfigurationError, match=r"heartbeat\.interval\.ms=3000 must be below"):
        validate_group_configs({"share.heartbeat.interval.ms": 3000}, SETTINGS, defaults=app)
    # Deleting the admin-set session timeout falls back to the app's: checked too.
    with pytest.raises(ConfigurationError, match=r"must be below share\.session\.timeout\.ms=2000"):
        validate_group_configs(
            {},
            SETTINGS,
            base={"share.session.timeout.ms": "9000", "share.heartbeat.interval.ms": "3000"},
            delete=["share.session.timeout.ms"],
            defaults=app,
        )


def test_delete_needs_known_names_and_not_the_same_name_set() -> None:
    base = {"share.delivery.count.limit": "3"}
    assert (
        validate_group_configs({}, SETTINGS, base=base, delete=["share.delivery.count.limit"]) == {}
    )
    with pytest.raises(ConfigurationError, match="unknown group config 'nope'"):
        validate_group_configs({}, SETTINGS, base=base, delete=["nope"])
    with pytest.raises(ConfigurationError, match="both set and deleted"):
        validate_group_configs(
            {"share.delivery.count.limit": 4}, SETTINGS, delete=["share.delivery.count.limit"]
        )


def test_later_layers_win_and_describe_names_the_source() -> None:
    app = {"share.delivery.count.limit": "4", "share.auto.offset.reset": "earliest"}
    dynamic = {"share.delivery.count.limit": "3"}
    config = GroupConfig.resolve(SETTINGS, app, dynamic)
    assert config.delivery_count_limit == 3 and config.auto_offset_reset == "earliest"
    entries = {e.name: e for e in describe_group_configs(SETTINGS, app, dynamic)}
    assert [e for e in entries] == list(GROUP_CONFIG_NAMES)
    assert (
        entries["share.delivery.count.limit"].value,
        entries["share.delivery.count.limit"].source,
    ) == (
        "3",
        "DYNAMIC_GROUP_CONFIG",
    )
    assert entries["share.auto.offset.reset"].source == "APP_GROUP_CONFIG"
    lock = entries["share.record.lock.duration.ms"]
    assert (lock.value, lock.source, lock.synonym) == (
        "30000",
        "DEFAULT_CONFIG",
        "group.share.record.lock.duration.ms",
    )


def test_configs_are_stored_with_the_group_and_old_groups_still_load() -> None:
    group = ShareGroup("g", 45_000, 200)
    group.heartbeat("m", 0, ["t"], 0, {"t": 2})
    plain = group_codec.encode_group(group)
    assert b"configs" not in plain  # a group without configs encodes as before
    group.configs = {"share.delivery.count.limit": "3"}
    group.config_version = 2
    again = group_codec.decode_group("g", group_codec.encode_group(group), 45_000, 200, 0)
    assert again.configs == {"share.delivery.count.limit": "3"} and again.config_version == 2
    old = json.dumps(
        {
            "v": 1,
            "group_epoch": 3,
            "assignment_epoch": 3,
            "dead": False,
            "partitions": {"t": 1},
            "members": [],
        }
    ).encode()
    loaded = group_codec.decode_group("g", old, 45_000, 200, 0)
    assert loaded.configs == {} and loaded.config_version == 0 and loaded.group_epoch == 3


def test_tickets_carry_the_configs_and_old_tickets_decode_without() -> None:
    key = b"k" * 32
    raw = issue_ticket(
        key,
        group="g",
        member_id="m",
        member_epoch=1,
        partitions=[("t", 0)],
        ttl_ms=1000,
        now_ms=0,
        config_version=4,
        configs=[("share.delivery.count.limit", "2")],
    )
    ticket = verify_ticket(key, raw, now_ms=1)
    assert ticket.config_version == 4
    assert ticket.configs == (("share.delivery.count.limit", "2"),)
    old = AssignmentTicket("g", "m", 1, (("t", 0),), 1000)
    assert (old.config_version, old.configs) == (0, ())


def test_a_leader_keeps_the_highest_config_version_it_sees() -> None:
    configs = LeaderGroupConfigs(SETTINGS, {"app-group": {"share.delivery.count.limit": "4"}})
    assert configs.engine("app-group").delivery_count_limit == 4  # before any ticket
    assert configs.engine("g").delivery_count_limit == SETTINGS.delivery_count_limit

    def ticket(version: int, limit: str, added: tuple[tuple[str, int], ...] = ()) -> Any:
        return AssignmentTicket(
            "g",
            "m",
            1,
            (),
            0,
            config_version=version,
            configs=(("share.delivery.count.limit", limit),),
            added_partitions=added,
        )

    changed = configs.adopt(ticket(2, "3"))
    assert changed is not None and changed.delivery_count_limit == 3
    assert configs.adopt(ticket(1, "7")) is None  # an older ticket of another member
    assert configs.engine("g").delivery_count_limit == 3
    assert configs.adopt(ticket(2, "3")) is None  # the same again
    assert configs.adopt(ticket(3, "not a number")) is None  # not valid here: ignored
    assert configs.engine("g").delivery_count_limit == 3
    assert configs.offset_reset("g", "t", 1) == OffsetReset(SETTINGS.auto_offset_reset)
    configs.adopt(ticket(3, "3", (("t", 1),)))
    assert configs.offset_reset("g", "t", 0) == OffsetReset(SETTINGS.auto_offset_reset)
    assert configs.offset_reset("g", "t", 1) == OffsetReset("earliest")  # added at runtime
