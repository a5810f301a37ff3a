"""``python -m bench.micro --quick`` runs every micro-benchmark and writes the JSON it promises
(its shape, not its timings: those depend on the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is not installed
    sys.path.insert(0, str(ROOT))

from bench.micro.suite import BENCHMARKS, main, selected  # noqa: E402
from bench.micro.timing import MIN_REPEATS, QUICK  # noqa: E402

#: Every benchmark the suite promises (docs/performance.md "Micro-benchmarks").
EXPECTED = {
    "engine.accept.b1",
    "engine.accept.b100",
    "engine.accept.b500",
    "engine.release10.b100",
    "engine.expire.idle",
    "engine.expire.all",
    "codec.state.delta.encode",
    "codec.state.delta.decode",
    "codec.state.snapshot.encode",
    "codec.state.snapshot.decode",
    *(
        f"codec.wire.{kind}.{fmt}.{op}"
        for kind in ("request", "response")
        for fmt in ("json", "binary")
        for op in ("encode", "decode")
    ),
    "read.records.crc",
    "read.records.nocrc",
    "read.views.crc",
    "read.views.nocrc",
    "read.parse",
    "read.crc",
    *(
        f"lazy.{touch}.{kind}"
        for touch in ("none", "value", "all")
        for kind in ("eager", "lazy", "ratio")
    ),
    "listener.answer.reencode",
    "listener.answer.forward",
    "listener.answer.ratio",
    "units.fetch",
    "units.list",
    "units.judge",
    "units.accept.fetch",
    "units.accept.list",
    "dispatch.record",
    "dispatch.record.cpu",
    "dispatch.batch",
    "dispatch.batch.cpu",
}


def run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "micro.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "bench.micro", "--quick", "--json", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_quick_run_writes_every_benchmark_with_its_figures(tmp_path: Path) -> None:
    result = run(tmp_path)
    assert result["quick"] is True
    assert result["sizes"]["repeats"] == QUICK.repeats
    machine = result["machine"]
    for key in ("git_commit", "python", "cpus"):
        assert machine.get(key), key
    assert "cpu" in machine or not Path("/proc/cpuinfo").exists()
    benchmarks = result["benchmarks"]
    assert set(benchmarks) == EXPECTED
    for name, figures in benchmarks.items():
        assert figures["repeats"] >= MIN_REPEATS, name
        assert figures["n"] >= 1, name
        assert figures["unit"] in {"record", "message", "call", "ratio"}, name
        assert 0 < figures["min_us"] <= figures["median_us"] <= figures["max_us"], name
        assert figures["what"], name


def test_only_runs_the_named_benchmarks(tmp_path: Path) -> None:
    result = run(tmp_path, "--only", "engine.accept.b1,read.parse")
    assert set(result["benchmarks"]) == {"engine.accept.b1", "read.parse"}


def test_only_selects_groups_by_prefix_and_refuses_an_unknown_name() -> None:
    assert list(selected(["codec"])) == ["codec.state", "codec.wire"]
    assert list(selected(["engine.expire.idle"])) == ["engine.expire"]
    assert selected([]) == BENCHMARKS
    assert main(["--only", "no.such.benchmark"]) == 2
