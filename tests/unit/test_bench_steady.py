"""The benchmark's pure parts: round ordering, medians and spreads, per-round ratios, window
counting, the headline object, and S1's summaries (bench/steady.py, bench/scenario_s1.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from bench.scenario_s1 import summarize
from bench.steady import (
    HEADLINE_KEYS,
    cpu_per_record,
    headline,
    pair_ratios,
    round_orders,
    summary,
    window_count,
)
from bench.suite import parse_args


def test_rounds_alternate_which_variant_of_every_pair_runs_first() -> None:
    variants = ["a", "b", "c", "d"]
    orders = round_orders(variants, 5)
    assert orders[0] == variants and orders[1] == variants[::-1] and orders[4] == variants
    for x, y in itertools.combinations(variants, 2):
        firsts = [o.index(x) < o.index(y) for o in orders]
        assert firsts == [True, False, True, False, True]
    assert all(sorted(o) == sorted(variants) for o in orders)


@pytest.mark.parametrize(
    ("variants", "rounds"), [(["a", "b"], 0), ([], 3), (["a", "a"], 2)], ids=str
)
def test_round_orders_refuses_bad_input(variants: list[str], rounds: int) -> None:
    with pytest.raises(ValueError, match=r"rounds|variants"):
        round_orders(variants, rounds)


def test_summary_is_median_and_spread_of_the_values_present() -> None:
    s = summary([3.0, None, 1.0, 10.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    assert s["values"] == [3.0, None, 1.0, 10.0, 2.0]
    assert summary([None, None])["median"] is None
    assert summary([1.23456], digits=2)["median"] == 1.23


def test_pair_ratios_per_round_and_none_when_a_side_is_missing() -> None:
    rounds = [{"q": 120.0, "n": 100.0}, {"q": 90.0, "n": None}, {"q": 50.0, "n": 0.0}, {"n": 1.0}]
    assert pair_ratios(rounds, "q", "n") == [1.2, None, None, None]
    # the median of ratios, not the ratio of medians
    rounds = [{"q": 1.0, "n": 1.0}, {"q": 4.0, "n": 2.0}, {"q": 9.0, "n": 3.0}]
    assert summary(pair_ratios(rounds, "q", "n"))["median"] == 2.0


def test_window_count_uses_each_process_own_reading_times() -> None:
    start = [{"done": 100, "written": 10.0}, {"done": 50, "written": 10.2}]
    end = [{"done": 1100, "written": 20.0}, {"done": 2050, "written": 20.2}]
    w = window_count(start, end)
    assert w["records"] == 3000 and w["per_process"] == [1000, 2000]
    assert w["rate"] == 300.0 and w["seconds"] == 10.0
    delivered = window_count(
        [{"delivered": 5, "written": 1.0}], [{"delivered": 25, "written": 3.0}], "delivered"
    )
    assert delivered["rate"] == 10.0


def test_window_count_without_a_usable_span_has_no_rate() -> None:
    assert (
        window_count([{"done": 1, "written": 5.0}], [{"done": 9, "written": 5.0}])["rate"] is None
    )
    assert window_count([{"done": 1}], [{"done": 9, "written": 5.0}])["rate"] is None
    with pytest.raises(ValueError, match="readings"):
        window_count([{}], [])


def test_cpu_per_record_in_microseconds() -> None:
    assert cpu_per_record({"member-0": 0.5, "leader": 0.1}, 100_000) == {
        "member-0": 5.0,
        "leader": 1.0,
    }
    assert cpu_per_record({"x": 1.0}, 0) == {"x": 1e6}


def _results() -> dict[str, Any]:
    return {
        "S1": {
            "ratios": {
                "batch_vs_native": {"median": 1.25},
                "record_vs_native": {"median": 0.9},
                "batch_vs_raw": {"median": 0.6},
            },
            "cpu": {"qf_batch": {"median": 4.5}, "qf_record": {"median": 7.5}},
        },
        "S2": {"queueflow": {"16": {"efficiency": 0.93}}},
        "S3": {"runs": {"2500": {"to_handler_ms": {"p99": 12.0}}, "10000": {"error": "boom"}}},
        "S4": {"cpu_overhead_pct": 8.1},
        "S5": {"engine": {"own_runs": {"bytes_per_record": 120.6}}},
        "S6": {
            "cpu_pct": {"leader": 1.5, "broker": 3.0, "members": {"member-0": 0.2, "member-1": 0.4}}
        },
    }


def test_headline_has_exactly_the_issue_keys_with_their_sources() -> None:
    out, why = headline(_results())
    assert list(out) == list(HEADLINE_KEYS)
    assert out == {
        "s1_batch_vs_native": 1.25,
        "s1_record_vs_native": 0.9,
        "s1_batch_vs_raw": 0.6,
        "client_cpu_us_batch": 4.5,
        "client_cpu_us_record": 7.5,
        "s3_p99_ms_2500": 12.0,
        "s3_p99_ms_10000": None,
        "s4_cpu_overhead_pct": 8.1,
        "s5_bytes_per_record": 120.6,
        "s2_efficiency_16": 0.93,
        "s6_leader_pct": 1.5,
        "s6_member_pct": 0.4,  # the busiest member
        "s6_broker_pct": 3.0,
        "perf_tool_native_rec_s": None,
        "perf_tool_queueflow_rec_s": None,
        "perf_tool_ratio": None,
    }
    assert why == {"s3_p99_ms_10000": "S3: no figure"} | {
        key: "S11 not run"
        for key in ("perf_tool_native_rec_s", "perf_tool_queueflow_rec_s", "perf_tool_ratio")
    }


def test_headline_says_why_a_figure_is_missing() -> None:
    results = _results()
    del results["S6"]
    results["S4"] = {"error": "no pair with both runs measured", "cpu_overhead_pct": None}
    out, why = headline(results)
    assert out["s6_leader_pct"] is None and why["s6_leader_pct"] == "S6 not run"
    assert why["s4_cpu_overhead_pct"] == "S4: no pair with both runs measured"


def test_s1_summary_takes_medians_of_rounds_and_skips_failed_runs() -> None:
    def run(rate: float | None, cpu: float, error: str | None = None) -> dict[str, Any]:
        return {"rate": rate, "client_cpu_us": cpu, "error": error}

    out: dict[str, Any] = {
        "runs": {
            "qf_batch": [run(120.0, 4.0), run(100.0, 5.0), run(None, 0.0, "died")],
            "native_batch": [run(100.0, 3.0), run(100.0, 3.0), run(90.0, 3.0)],
        },
        "rounds": [
            {"qf_batch": {"rate": 120.0}, "native_batch": {"rate": 100.0}},
            {"qf_batch": {"rate": 100.0}, "native_batch": {"rate": 100.0}},
            {"qf_batch": {"rate": None}, "native_batch": {"rate": 90.0}},
        ],
    }
    summarize(out)
    assert out["variants"]["qf_batch"]["rate"]["median"] == 110.0
    assert out["variants"]["qf_batch"]["errors"] == ["died"]
    assert out["cpu"]["qf_batch"]["median"] == 4.5
    ratio = out["ratios"]["batch_vs_native"]
    assert (ratio["median"], ratio["min"], ratio["max"], ratio["n"]) == (1.1, 1.0, 1.2, 2)
    assert "record_vs_native" not in out["ratios"]  # its variants did not run


def test_quick_sets_what_the_command_line_leaves_and_keeps_the_rest() -> None:
    args = parse_args(["--quick", "--pairs", "2"])
    assert args.pairs == 2 and args.window == 3.0 and "S8" not in args.scenarios
    assert args.s3_rates == [2500.0, 10000.0]
    full = parse_args([])
    assert full.pairs == 5 and full.window >= 15 and full.s6_seconds >= 20
    assert full.s1_variants[:2] == ["qf_batch", "native_batch"]


def test_headline_names_the_failed_s1_variant() -> None:
    results = _results()
    results["S1"]["ratios"]["record_vs_native"] = {"median": None}
    results["S1"]["variants"] = {
        "qf_record": {"errors": []},
        "native_record": {"errors": ["drained: 10 of 10 records finished"]},
    }
    out, why = headline(results)
    assert out["s1_record_vs_native"] is None
    assert why["s1_record_vs_native"] == "S1: native_record: drained: 10 of 10 records finished"
