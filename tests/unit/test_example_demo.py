"""``make demo``'s summary: the queue counters summed from the workers' ``/metrics`` pages."""

from __future__ import annotations

from examples.demo.__main__ import QUEUE_METRICS, metric_sum

PAGE = """\
# HELP queueflow_records_lock_expired_unhandled_total Records released without calling the handler
# TYPE queueflow_records_lock_expired_unhandled_total counter
queueflow_records_lock_expired_unhandled_total{group="g",topic="a"} 3.0
queueflow_records_lock_expired_unhandled_total{group="g",topic="b"} 4.0
queueflow_records_lock_expired_unhandled_created{group="g",topic="a"} 1.7e+09
queueflow_records_given_back_unstarted_total{group="g",topic="a"} 5.0
"""


def test_metric_sum_adds_every_label_set_and_skips_other_samples() -> None:
    assert metric_sum(PAGE, QUEUE_METRICS["lock_expired_in_queue"]) == 7
    assert metric_sum(PAGE, QUEUE_METRICS["given_back_unstarted"]) == 5
    assert metric_sum(PAGE, "queueflow_no_such_metric_total") == 0
