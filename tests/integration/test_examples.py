"""The examples, run as programs on the session broker (``python -m examples.workqueue``,
``python -m examples.enrichment`` and ``python -m examples.ledger`` with ``$QUEUEFLOW_BROKER``):
each checks itself and prints one JSON line, read here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # examples/ is not installed; the workers run with cwd=ROOT
    sys.path.insert(0, str(ROOT))

from examples.enrichment.__main__ import main as enrichment  # noqa: E402
from examples.ledger.__main__ import main as ledger  # noqa: E402
from examples.workqueue.__main__ import main as workqueue  # noqa: E402


def summary(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1]))


def test_the_work_queue_example(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """100 jobs, 3 workers on 2 partitions: every valid job that succeeds within 3 deliveries
    has exactly one result, every other job exactly one dead letter saying why."""
    monkeypatch.setenv("QUEUEFLOW_BROKER", kafka_bootstrap)
    assert workqueue(["--jobs", "100", "--timeout", "120"]) == 0
    out = summary(capsys)
    assert out["wrong"] == 0 and out["results"] == 68 and out["dead_letters"] == 32, out
    assert out["dead_letter_reasons"] == {
        "n must be an integer, got 'not a number'": 10,
        "gave up after 3 deliveries": 22,
    }


def test_the_enrichment_example_is_exactly_once_across_a_sigkill(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """300 orders through an exactly_once share agent into a Faust agent's table, the member
    worker SIGKILLed a third of the way: each order's result once, the totals exact."""
    monkeypatch.setenv("QUEUEFLOW_BROKER", kafka_bootstrap)
    assert enrichment(["--orders", "300", "--timeout", "150"]) == 0
    out = summary(capsys)
    assert out["kills"] == 1 and out["duplicates"] == 0 and out["totals_exact"], out
    assert out["enriched"] == 288 and out["dead_letters"] == 12, out


def test_the_ledger_example_posts_each_account_in_order_exactly_once(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """600 transactions of 20 accounts through a key-ordered exactly_once share agent (8 handler
    tasks on each of 2 workers) into a Faust agent's balances table, the member worker SIGKILLed
    a third of the way: each transaction posted once, each account's postings in order, the
    balances those of the transactions applied one by one."""
    monkeypatch.setenv("QUEUEFLOW_BROKER", kafka_bootstrap)
    assert ledger(["--transactions", "600", "--timeout", "150"]) == 0
    out = summary(capsys)
    assert out["kills"] == 1 and out["postings"] == 600, out
    assert out["duplicates"] == 0 and out["out_of_order"] == 0 and out["balances_exact"], out
