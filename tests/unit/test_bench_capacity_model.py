"""The capacity model's arithmetic (bench/capacity_model.py): sizing from measured figures."""

from __future__ import annotations

import pytest

from bench.capacity_model import Assumptions, figures_markdown, markdown, row, table

FIGURES = {
    "leader_cpu_us_per_record": 10.0,
    "member_cpu_us_per_record": 14.0,
    "broker_cpu_us_per_record": 3.0,
    "coordinator_cpu_us_per_heartbeat": 500.0,
    "changelog_bytes_per_ack": 2.5,
    "bytes_per_inflight_record": 130.0,
}


def test_row_sizes_every_resource_from_the_figures() -> None:
    r = row(FIGURES, 100_000, 1_000, Assumptions(utilisation=0.5))
    # 100,000 records/s * 10 us = 1 core of leader work; at 50 % per worker: 2 workers
    assert r.leader_workers == 2
    assert r.partitions == 2
    assert r.members == 3  # 1.4 cores at 50 %: ceil(2.8)
    assert r.memberships == 1_000  # every group needs a member
    assert r.heartbeats_per_s == 200.0  # 1,000 memberships / 5 s
    assert r.coordinator_partitions == 1  # 200 * 500 us = 0.1 core
    assert r.changelog_mb_s == 0.25
    assert r.broker_mb_s == pytest.approx((100_000 * 2048 + 250_000) / 1e6, abs=0.1)
    assert r.inflight_mb == 13.0  # 100,000 in flight (1 s) * 130 B
    assert r.cores == {"leader": 1.0, "member": 1.4, "coordinator": 0.1, "broker": 0.3}
    assert r.first == "member"
    assert "W=ceil(100,000*10/500,000)=2" in r.arithmetic


def test_many_groups_make_the_coordinator_saturate_first() -> None:
    r = row(FIGURES, 10_000, 100_000)
    # 100,000 memberships / 5 s = 20,000 heartbeats/s * 500 us = 10 cores
    assert r.heartbeats_per_s == 20_000.0
    assert r.cores["coordinator"] == 10.0
    assert r.coordinator_partitions == 15  # ceil(10 / 0.7)
    assert r.first == "coordinator"


def test_at_least_one_of_everything() -> None:
    r = row(FIGURES, 1, 1)
    assert (r.leader_workers, r.members, r.coordinator_partitions) == (1, 1, 1)


def test_table_covers_every_rate_and_group_count_rates_outermost() -> None:
    rows = table(FIGURES)
    assert [(r.rate, r.groups) for r in rows[:4]] == [
        (10_000, 10),
        (10_000, 1_000),
        (10_000, 100_000),
        (100_000, 10),
    ]
    assert len(rows) == 9
    text = markdown(rows)
    assert text.count("\n") == 10  # header, rule, 9 rows
    assert "| 1,000,000 | 100,000 |" in text


def test_missing_figure_says_what_to_run() -> None:
    partial = {k: v for k, v in FIGURES.items() if k != "changelog_bytes_per_ack"}
    with pytest.raises(ValueError, match=r"changelog_bytes_per_ack.*bench\.capacity"):
        row(partial, 10_000, 10)


@pytest.mark.parametrize("bad", [{"utilisation": 0}, {"utilisation": 1.5}, {"hold_s": -1}])
def test_bad_assumptions_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Assumptions(**bad)  # type: ignore[arg-type]


def test_nonpositive_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        row(FIGURES, 0, 10)


def test_figures_table_lists_each_figure_and_the_release_pattern() -> None:
    measured = dict(
        FIGURES, leader_records_per_core_s=100_000, release10={"leader_cpu_us_per_record": 21.5}
    )
    text = figures_markdown(measured)
    assert "| leader CPU per acknowledged record, µs | 10 | 21.5 |" in text
    assert "| records/s one leader core serves | 100,000 |  |" in text
    assert "| heartbeats/s one coordinator core serves | — |" in text  # not measured
