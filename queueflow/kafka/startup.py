"""Starting against a cluster that may not be there yet: wait for the broker, find the app.

Workers and members call :func:`wait_for_broker` before their first request, so a worker started
while its broker is down (or restarting) waits with back-off instead of exiting, logging
``broker_unreachable`` at each retry, up to ``queueflow.broker.wait.ms`` (docs/operations.md
"Outages at start").
A member calls :func:`wait_for_topics` for its app's internal topics: a mistyped app id fails
within ``queueflow.member.join.timeout.ms`` with an error naming the app, and creates nothing.
"""

from __future__ import annotations

import asyncio
import time

import stamina
import structlog
from aiokafka.errors import KafkaError

from queueflow.errors import BrokerError, ConfigurationError
from queueflow.kafka.admin import admin_client, existing_partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.reachability import capture_connect_errors, connection_failure

__all__ = ["wait_for_broker", "wait_for_topics"]

log = structlog.get_logger("queueflow.kafka.startup")

#: First and longest wait (s) between two attempts.
_WAIT_INITIAL_S, _WAIT_MAX_S = 0.5, 5.0


async def _probe(config: KafkaClientConfig, names: list[str]) -> dict[str, int]:
    """One bootstrap of an admin client (and the partition counts of ``names`` that exist)."""
    admin = admin_client(config)
    try:
        await admin.start()
        return await existing_partition_counts(admin, names) if names else {}
    finally:
        await admin.close()


async def wait_for_broker(config: KafkaClientConfig, limit_ms: int, who: str = "worker") -> None:
    """Return once the cluster answers; retry with exponential back-off (0.5 s up to 5 s)
    meanwhile, logging ``broker_unreachable`` (bootstrap, attempt, waited_s, limit_s, error) at
    each retry.

    Args:
        config: the cluster.
        limit_ms: how long to keep trying, in ms (``queueflow.broker.wait.ms``); 0: one try.
        who: what is waiting, for the log and the error (``worker``, ``ShareConsumer``).

    Raises:
        BrokerError: no answer within ``limit_ms``; the message names the bootstrap servers,
            the last error and what to check.
    """
    started = time.monotonic()
    last: list[BaseException] = []

    async def attempts() -> None:
        async for attempt in stamina.retry_context(
            on=(KafkaError, OSError, asyncio.TimeoutError),
            attempts=None,
            timeout=None,  # bounded by wait_for below, which also cuts a back-off short
            wait_initial=_WAIT_INITIAL_S,
            wait_max=_WAIT_MAX_S,
            wait_jitter=0.1,
        ):
            with attempt:
                if attempt.num > 1:
                    log.warning(
                        "broker_unreachable",
                        who=who,
                        bootstrap=config.bootstrap,
                        attempt=attempt.num - 1,
                        waited_s=round(time.monotonic() - started, 1),
                        limit_s=limit_ms / 1000,
                        error=repr(last[-1]) if last else None,
                        note="retrying with back-off (queueflow.broker.wait.ms)",
                    )
                try:
                    await _probe(config, [])
                except (KafkaError, OSError, asyncio.TimeoutError) as exc:
                    last.append(exc)
                    raise

    with capture_connect_errors() as tried:
        try:
            await asyncio.wait_for(attempts(), max(limit_ms / 1000, 0.001))
        except (KafkaError, OSError, asyncio.TimeoutError) as exc:
            error = last[-1] if last else exc
            protocol = str(config.extra.get("security_protocol", "PLAINTEXT"))
            why = connection_failure(
                config.bootstrap, tried, error, who, security_protocol=protocol
            )
            raise BrokerError(
                f"no Kafka broker answered at {config.bootstrap} within {limit_ms / 1000:g} s: "
                f"{why}; or raise queueflow.broker.wait.ms"
            ) from None
    if time.monotonic() - started > 1.0:
        log.info(
            "broker_reachable",
            who=who,
            bootstrap=config.bootstrap,
            waited_s=round(time.monotonic() - started, 1),
        )


async def wait_for_topics(
    config: KafkaClientConfig, names: list[str], limit_ms: int, app_id: str
) -> dict[str, int]:
    """Return the partition counts of the internal topics ``names`` once they all exist,
    retrying with back-off up to ``limit_ms`` (a worker of the app may be creating them).
    Creates nothing.

    Raises:
        ConfigurationError: some are still missing after ``limit_ms``; the message names them
            and says to start a worker of app ``app_id`` or fix the app id.
    """
    deadline = time.monotonic() + limit_ms / 1000
    wait = _WAIT_INITIAL_S
    while True:
        counts = await _probe(config, names)
        missing = sorted(set(names) - set(counts))
        if not missing:
            return counts
        if time.monotonic() + wait > deadline:
            raise ConfigurationError(
                f"no queueflow app {app_id!r} on {config.bootstrap}: its internal topic(s) "
                f"{', '.join(missing)} do not exist after {limit_ms / 1000:g} s. Start a worker "
                f"of the app with role 'all' or 'leader' (e.g. `queueflow leader --app "
                f"{app_id} --topic <topic>`), or check the app id "
                "(queueflow.member.join.timeout.ms bounds this wait)"
            )
        await asyncio.sleep(wait)
        wait = min(wait * 2, _WAIT_MAX_S)
