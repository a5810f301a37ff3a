"""Per-app Prometheus metrics (``queueflow.metrics``)."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from queueflow.metrics import CONTENT_TYPE, Metrics, SharePartitionSample, render_all

# attribute -> (family name as parsed, type, label names)
EXPECTED = {
    "delivered": ("queueflow_records_delivered", "counter", ("group", "topic")),
    "redelivered": ("queueflow_records_redelivered", "counter", ("group", "topic")),
    "acknowledgements": ("queueflow_acknowledgements", "counter", ("group", "topic", "type")),
    "handler_errors": ("queueflow_handler_errors", "counter", ("group", "topic", "reason")),
    "acknowledgements_dropped": (
        "queueflow_acknowledgements_dropped",
        "counter",
        ("group", "topic"),
    ),
    "lock_expired_unhandled": (
        "queueflow_records_lock_expired_unhandled",
        "counter",
        ("group", "topic"),
    ),
    "share_fetch_seconds": ("queueflow_share_fetch_seconds", "histogram", ("group", "topic")),
    "drain_seconds": ("queueflow_drain_seconds", "gauge", ("group", "agent")),
    "ack_latency_seconds": (
        "queueflow_acknowledgement_latency_seconds",
        "histogram",
        ("group", "topic"),
    ),
    "acquisitions": (
        "queueflow_share_partition_acquisitions",
        "counter",
        ("group", "topic", "partition"),
    ),
    "deliveries": (
        "queueflow_share_partition_deliveries",
        "counter",
        ("group", "topic", "partition", "delivery_count"),
    ),
    "archived": (
        "queueflow_share_partition_archived_records",
        "counter",
        ("group", "topic", "partition"),
    ),
    "lock_expiries": (
        "queueflow_share_partition_lock_expiries",
        "counter",
        ("group", "topic", "partition"),
    ),
    "group_rebalances": ("queueflow_share_group_rebalances", "counter", ("group",)),
    "state_writes": ("queueflow_state_writes", "counter", ("topic",)),
    "leader_step_downs": ("queueflow_leader_step_downs", "counter", ("topic",)),
    "group_members": ("queueflow_share_group_members", "gauge", ("group",)),
    "group_epoch": ("queueflow_share_group_epoch", "gauge", ("group",)),
}


def touch_all(m: Metrics, group: str) -> None:
    """Give every metric one child so that it appears in the exposition."""
    for attr, (_, _, labels) in EXPECTED.items():
        child = getattr(m, attr).labels(*(group if name == "group" else "x" for name in labels))
        if hasattr(child, "observe"):
            child.observe(0.003)
        elif hasattr(child, "set"):
            child.set(7)
        else:
            child.inc()


def families(body: bytes) -> dict[str, prometheus_client.Metric]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_every_metric_is_an_attribute_with_its_name_type_and_labels() -> None:
    m = Metrics()
    touch_all(m, "g")
    body, _ = m.render()
    parsed = families(body)
    for attr, (name, kind, labels) in EXPECTED.items():
        metric = getattr(m, attr)
        assert metric._labelnames == labels, attr
        assert parsed[name].type == kind, attr
        assert parsed[name].documentation, attr
    assert parsed["queueflow_share_fetch_seconds"].samples  # buckets rendered
    buckets = [
        s.labels["le"]
        for s in parsed["queueflow_share_fetch_seconds"].samples
        if s.name.endswith("_bucket")
    ]
    assert buckets[0] == "0.001" and buckets[-2] == "10.0" and buckets[-1] == "+Inf"


def test_two_instances_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    assert a.registry is not b.registry
    a.delivered.labels("g", "t").inc(2)
    b.delivered.labels("g", "t").inc(5)
    assert (
        a.registry.get_sample_value(
            "queueflow_records_delivered_total", {"group": "g", "topic": "t"}
        )
        == 2
    )
    assert (
        b.registry.get_sample_value(
            "queueflow_records_delivered_total", {"group": "g", "topic": "t"}
        )
        == 5
    )


def test_nothing_on_the_default_registry() -> None:
    Metrics()
    assert (
        prometheus_client.REGISTRY.get_sample_value(
            "queueflow_records_delivered_total", {"group": "g", "topic": "t"}
        )
        is None
    )


def test_injected_registry_is_used_once() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry)
    assert m.registry is registry
    m.group_epoch.labels("g").set(3)
    assert registry.get_sample_value("queueflow_share_group_epoch", {"group": "g"}) == 3
    with pytest.raises(ValueError):
        Metrics(registry)  # duplicate timeseries


def test_render_parses_and_has_the_content_type() -> None:
    m = Metrics()
    touch_all(m, "g")
    body, content_type = m.render()
    assert content_type == CONTENT_TYPE
    assert content_type.startswith("text/plain")
    parsed = families(body)
    assert {name for name, _, _ in EXPECTED.values()} <= set(parsed)
    delivered = [
        s for s in parsed["queueflow_records_delivered"].samples if s.name.endswith("_total")
    ]
    assert [(s.labels, s.value) for s in delivered] == [({"group": "g", "topic": "x"}, 1.0)]


def test_render_all_merges_registries_into_one_valid_body() -> None:
    a, b = Metrics(), Metrics()
    touch_all(a, "ga")
    touch_all(b, "gb")
    own = CollectorRegistry()
    prometheus_client.Counter("app_requests", "The app's own metric", registry=own).inc()
    body = render_all(own, a.registry, b.registry)
    text = body.decode()
    # one HELP/TYPE header per family, even where two registries share it
    assert text.count("# TYPE queueflow_records_delivered_total counter") == 1
    parsed = families(body)
    assert "app_requests" in parsed
    groups = {
        s.labels["group"]
        for s in parsed["queueflow_records_delivered"].samples
        if s.name.endswith("_total")
    }
    assert groups == {"ga", "gb"}
    # rendering does not change the registries themselves
    assert a.render()[0].decode().count('group="gb"') == 0


def test_render_all_of_nothing_is_empty() -> None:
    assert render_all() == b""


def test_every_name_has_the_queueflow_prefix_and_a_unit_or_total() -> None:
    m = Metrics()
    touch_all(m, "g")
    m.add_partition_source(lambda: [SharePartitionSample("g", "t", 0, 5, 9, {"acquired": 4})])
    for family in families(m.render()[0]).values():
        assert family.name.startswith("queueflow_"), family.name
        if family.type == "counter" or family.name.endswith("_created"):
            continue  # the parser strips _total; the exposition has it (checked above)
        units = (
            "_seconds",
            "_records",
            "_offset",
            "_members",
            "_epoch",
            "_handlers",
            "_connections",
        )
        assert family.name.endswith(units), family.name


def test_share_partition_gauges_are_read_from_the_sources_at_each_scrape() -> None:
    m = Metrics()
    state = {"acquired": 3, "available": 1, "acknowledged": 2, "archived": 1}
    served = [SharePartitionSample("g", "t", 1, 10, 17, state, log_end_offset=30, lag=17)]
    m.add_partition_source(lambda: list(served))
    labels = {"group": "g", "topic": "t", "partition": "1"}

    def value(name: str, **extra: str) -> float | None:
        return m.registry.get_sample_value(f"queueflow_share_partition_{name}", labels | extra)

    assert value("in_flight_records") == 7
    assert value("acquired_records") == 3
    assert (value("start_offset"), value("end_offset"), value("log_end_offset")) == (10, 17, 30)
    assert value("lag_records") == 17
    assert {s: value("records", state=s) for s in state} == state
    # The state changes (e.g. a lock-expiry tick released the records): the next scrape shows it.
    served[0] = SharePartitionSample("g", "t", 1, 10, 17, {"available": 4, "acknowledged": 3})
    assert value("acquired_records") == 0 and value("records", state="available") == 4
    assert value("log_end_offset") is None and value("lag_records") is None  # unknown end
    # The partition moved to another worker: its series disappear.
    served.clear()
    assert value("in_flight_records") is None
