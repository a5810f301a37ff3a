"""The exactly-once start check (:func:`queueflow.kafka.transactions.check_transactions`): a
worker started while its broker restarts waits for it (retriable errors are retried within the
timeout) instead of exiting at once; an authorization error is refused at the first answer.

A ``make chaos-exactly-once`` run had a member exit 1 this way: started at a broker restart,
its check failed 0.3 s in on "Connection closed" saying "within 30 s"."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import errors as kafka_errors

from queueflow.errors import ConfigurationError
from queueflow.kafka import transactions
from queueflow.kafka.config import KafkaClientConfig


def _producers(monkeypatch: pytest.MonkeyPatch, failures: list[Exception]) -> list[dict[str, Any]]:
    """Replace the producer: each start raises the next of ``failures``, then succeeds."""
    made: list[dict[str, Any]] = []

    class Producer:
        def __init__(self, **kwargs: Any) -> None:
            self.record: dict[str, Any] = {"kwargs": kwargs, "stopped": False}
            made.append(self.record)

        async def start(self) -> None:
            if failures:
                raise failures.pop(0)

        async def stop(self) -> None:
            self.record["stopped"] = True

    monkeypatch.setattr(transactions, "AIOKafkaProducer", Producer)
    return made


def test_connection_errors_at_a_broker_restart_are_retried_until_the_producer_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _producers(
        monkeypatch,
        [
            kafka_errors.KafkaConnectionError("Connection at 127.0.0.1:9092 closed"),
            kafka_errors.CoordinatorNotAvailableError(),
        ],
    )
    asyncio.run(
        transactions.check_transactions(KafkaClientConfig("127.0.0.1:1"), "app", 10_000, 20)
    )
    assert len(made) == 3 and all(p["stopped"] for p in made)
    assert made[0]["kwargs"]["transactional_id"] == "app-share-txn-start-check"


def test_an_authorization_error_is_refused_at_once_naming_the_acl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _producers(monkeypatch, [kafka_errors.TransactionalIdAuthorizationFailed()])
    with pytest.raises(ConfigurationError, match="WRITE and DESCRIBE on the transactional ids"):
        asyncio.run(
            transactions.check_transactions(KafkaClientConfig("127.0.0.1:1"), "app", 10_000, 20)
        )
    assert len(made) == 1


def test_a_broker_that_stays_away_fails_within_the_timeout_naming_the_last_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures: list[Exception] = [kafka_errors.KafkaConnectionError("refused")] * 1000
    _producers(monkeypatch, failures)
    with pytest.raises(ConfigurationError, match=r"within 1\.5 s \(last error: KafkaConnection"):
        asyncio.run(
            transactions.check_transactions(KafkaClientConfig("127.0.0.1:1"), "app", 10_000, 1.5)
        )
