"""A ShareConsumer of group ``chaos`` (the share agents' of ``examples.chaos.app``) that ACCEPTs
every record (implicit acknowledgement, committed after each poll), one JSON ledger line per
delivery once its acknowledgement was answered (``"o"``: ``ACCEPT``, or ``ACK_FAILED`` when the
leader did not confirm it: the record may come back), run by
test_rolling_upgrade with the previous release's Python and with this checkout's. It uses the
public API only, so the same file runs on both.

Env: ``UPGRADE_APP_ID``, ``UPGRADE_BOOTSTRAP``, ``UPGRADE_TOPIC``, ``UPGRADE_LEDGER``. SIGTERM:
close (the last poll's records are acknowledged, the member leaves), then exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import queueflow


async def main() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ledger = open(os.environ["UPGRADE_LEDGER"], "a", buffering=1)  # noqa: SIM115
    consumer = queueflow.ShareConsumer(
        "chaos",
        app_id=os.environ["UPGRADE_APP_ID"],
        bootstrap_servers=os.environ["UPGRADE_BOOTSTRAP"],
        settings={"share.auto.offset.reset": "earliest"},
    )
    async with consumer:
        await consumer.subscribe([os.environ["UPGRADE_TOPIC"]])
        print("upgrade member: subscribed", flush=True)
        while not stop.is_set():
            records = await consumer.poll(200)
            if not records:
                continue
            # Implicit mode: commit_sync ACCEPTs this poll's records (close would release them).
            results = await consumer.commit_sync()
            for record in records:
                failed = results.get(queueflow.TopicPartition(record.topic, record.partition))
                line = {"id": int(record.value), "dc": record.delivery_count}
                line["o"] = "ACCEPT" if failed is None else "ACK_FAILED"  # may come back
                ledger.write(json.dumps({**line, "pid": os.getpid()}) + "\n")
    print("upgrade member: closed", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
