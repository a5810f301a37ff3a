"""A share-group member that acquires records, reports their offsets and then hangs until it is
SIGKILLed (used by test_share_groups). Args: bootstrap app_id group topic settings-json."""

from __future__ import annotations

import asyncio
import json
import sys

from queueflow import ShareConsumer


async def main(bootstrap: str, app_id: str, group: str, topic: str, settings: str) -> None:
    consumer = ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=json.loads(settings),
    )
    await consumer.subscribe([topic])
    while True:
        records = await consumer.poll(timeout_ms=1000)
        if records:
            print(json.dumps([r.offset for r in records]), flush=True)
            await asyncio.Event().wait()  # hold the records until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
