"""S11's pure parts: parsing Kafka's share-consumer perf tool's output (bench/perf_tool.py),
the per-side summaries and pair ratios (bench/scenario_s11.py), its headline keys and its
table rows."""

from __future__ import annotations

from typing import Any

import pytest

from bench.perf_tool import PerfToolOutputError, parse_perf_tool, perf_tool_args
from bench.report import s11_rows
from bench.scenario_s11 import summarize
from bench.steady import headline
from bench.suite import parse_args

#: Kafka 4.3.1's ShareConsumerPerformance, --show-detailed-stats --reporting-interval 500, as
#: S11 ran it against the native share group (lines cut from 14 progress lines to 4).
NATIVE = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg,"
    " fetch.time.ms\n"
    "2026-11-27 21:58:37:751, 2026-11-27 21:58:45:047, 0.0010, 0.0001, 0.1371, 1, 7296 for"
    " share consumer 1\n"
    "2026-11-27 21:58:45:047, 2026-11-27 21:58:45:768, 0.4951, 0.6854, 701.8031, 507, 721"
    " for share consumer 1\n"
    "2026-11-27 21:58:50:487, 2026-11-27 21:58:51:010, 65.7217, 17.9516, 18382.4092,"
    " 67299, 523 for share consumer 1\n"
    "2026-11-27 21:58:51:526, 2026-11-27 21:58:52:053, 87.9580, 22.5036, 23043.6433,"
    " 90069, 527 for share consumer 1\n"
    "2026-11-27 21:58:35:448, 2026-11-27 21:58:52:405, 97.6563, 5.7591, 5897.2696, 100000,"
    " 16957\n"
)

TIMED_OUT = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg,"
    " fetch.time.ms\n"
    "2026-11-27 21:00:00:000, 2026-11-27 21:00:01:000, 1.0000, 1.0000, 1024.0000, 1024,"
    " 1000 for share consumer 2\n"
    "2026-11-27 21:00:00:000, 2026-11-27 21:00:01:500, 0.5000, 0.5000, 512.0000, 512, 1500"
    " for share consumer 1\n"
    "WARNING: Exiting before consuming the expected number of records: timeout (30000 ms)"
    " exceeded. You can use the --timeout option to increase the timeout.\n"
    "2026-11-27 20:59:59:000, 2026-11-27 21:00:33:000, 2.0000, 0.0588, 60.2353, 2048,"
    " 34000\n"
)


def test_the_summary_line_gives_the_tools_own_figures() -> None:
    got = parse_perf_tool(NATIVE)
    assert (got.records, got.mb, got.mb_s, got.rec_s) == (100_000, 97.6563, 5.7591, 5897.2696)
    assert got.elapsed_s == 16.957
    assert got.end - got.start == pytest.approx(16.957, abs=1e-3)
    assert not got.timed_out
    assert [r.records for r in got.progress] == [1, 507, 67299, 90069]
    assert {r.consumer for r in got.progress} == {1}
    out = got.as_dict(100_000)
    assert out["complete"] and out["rec_s"] == 5897.3 and out["progress_lines"] == 4


def test_the_rate_after_the_first_report_leaves_out_joining_the_group() -> None:
    got = parse_perf_tool(NATIVE)
    rate, seconds = got.after_first_report()
    # the first report (one record, 7.3 s after start: the join) to the summary's end
    assert seconds == pytest.approx(52.405 - 45.047, abs=1e-3)
    assert rate == pytest.approx((100_000 - 1) / (52.405 - 45.047), rel=1e-6)
    assert got.as_dict()["steady_rec_s"] == round(rate, 1)


def test_a_timeout_is_seen_and_makes_the_run_incomplete() -> None:
    got = parse_perf_tool(TIMED_OUT)
    assert got.timed_out and got.records == 2048
    assert got.as_dict(2048)["complete"] is False  # the tool gave up, whatever it counted
    # two consumers: what each had at the first report (only consumer 2 had reported)
    rate, seconds = got.after_first_report()
    assert seconds == pytest.approx(32.0, abs=1e-3)
    assert rate == pytest.approx((2048 - 1024) / 32.0)


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "Exception in thread main: org.apache.kafka.common.KafkaException: bootstrap failed\n",
        NATIVE.rsplit("\n", 2)[0],  # the summary line cut off
    ],
    ids=["empty", "an error", "progress only"],
)
def test_output_without_a_summary_is_refused(stdout: str) -> None:
    with pytest.raises(PerfToolOutputError, match="no summary line"):
        parse_perf_tool(stdout)


def test_without_progress_lines_there_is_no_rate_after_the_first_report() -> None:
    got = parse_perf_tool(NATIVE.splitlines()[0] + "\n" + NATIVE.splitlines()[-1])
    assert got.after_first_report() == (None, None)
    assert got.as_dict()["steady_rec_s"] is None


def test_the_command_line() -> None:
    args = perf_tool_args("127.0.0.1:9192", "t", "g", 1000, threads=2, timeout_ms=5000)
    assert args[args.index("--num-records") + 1] == "1000"
    assert args[args.index("--threads") + 1] == "2"
    assert args[args.index("--timeout") + 1] == "5000"
    assert "--show-detailed-stats" in args
    with pytest.raises(ValueError, match="records and threads"):
        perf_tool_args("b", "t", "g", 0)


def _run(side: str, rec_s: float, steady: float, error: str | None = None) -> dict[str, Any]:
    return {
        "side": side,
        "rec_s": rec_s,
        "mb_s": rec_s / 1024,
        "elapsed_s": 100_000 / rec_s,
        "steady_rec_s": steady,
        "wall_s": 100_000 / rec_s + 2,
        "cpu_us_per_record": {"broker": 30.0, "tool": 60.0}
        | ({"leader": 50.0} if side == "queueflow" else {}),
        "error": error,
    }


def test_summaries_per_side_and_the_median_of_pair_ratios() -> None:
    pairs = [
        {"native": _run("native", 6000, 14000), "queueflow": _run("queueflow", 4800, 7000)},
        {"queueflow": _run("queueflow", 6000, 7000), "native": _run("native", 5000, 14000)},
        {"native": _run("native", 6000, 14000), "queueflow": _run("queueflow", 1, 1, "died")},
    ]
    runs = [r for p in pairs for r in p.values()]
    out = summarize(runs, pairs)
    assert out["native"]["rec_s"]["median"] == 6000 and out["native"]["rec_s"]["n"] == 3
    assert out["queueflow"]["rec_s"]["n"] == 2  # the failed run is left out
    assert out["queueflow"]["errors"] == ["died"]
    assert out["queueflow"]["leader_cpu_us"]["median"] == 50.0
    assert "leader_cpu_us" not in out["native"]
    # per pair 0.8 and 1.2 (the third has a failed run): median 1.0
    assert (out["ratio"]["median"], out["ratio"]["n"]) == (1.0, 2)
    assert out["steady_ratio"]["median"] == 0.5
    rows = s11_rows({"records": 100_000, "threads": 1, **out})
    assert any(r[0].startswith("S11 perf tool, queueflow") and "1 failed" in r[2] for r in rows)
    assert any(r[0] == "S11 queueflow / native, tool's rec/s" for r in rows)


def test_the_headline_carries_the_perf_tool_figures_or_why_not() -> None:
    results = {
        "S11": {
            "native": {"rec_s": {"median": 6000.0}, "errors": []},
            "queueflow": {"rec_s": {"median": None}, "errors": ["3 of 10 records"]},
            "ratio": {"median": None},
        }
    }
    out, why = headline(results)
    assert out["perf_tool_native_rec_s"] == 6000.0
    assert out["perf_tool_queueflow_rec_s"] is None and out["perf_tool_ratio"] is None
    assert why["perf_tool_queueflow_rec_s"] == "S11: queueflow: 3 of 10 records"
    assert why["perf_tool_ratio"] == "S11: queueflow: 3 of 10 records"
    assert "perf_tool_native_rec_s" not in why


def test_s11_runs_in_make_bench_and_alone() -> None:
    assert "S11" in parse_args([]).scenarios
    alone = parse_args(["--scenarios", "S11"])
    assert alone.scenarios == ["S11"] and alone.s11_pairs >= 5
    quick = parse_args(["--quick"])
    assert "S11" in quick.scenarios and quick.s11_records < alone.s11_records
    with pytest.raises(SystemExit):
        parse_args(["--s11-pairs", "0"])
