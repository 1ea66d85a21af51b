"""The peers keylane is compared with, on the same broker, machine and input topic.

* ``aiokafka``: a raw consume -> produce loop that forwards each record (key, value)
  unchanged: what the bus itself costs here;
* ``faust``: a plain Faust app (the same app settings keylane's worker uses) with one agent
  that writes ``table[key] = value`` for each event and sends the value on: what Faust
  itself costs, one table write per event like keylane's one state write per activation.

Run one until SIGTERM::

    python -m bench.peers aiokafka|faust --bootstrap HOST:PORT --input T --output T --group G

Each consumes ``--input`` from the earliest offset with its own consumer group ``--group``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

PARTITIONS = 6
READY = "bench peer ready"

_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


async def aiokafka_loop(bootstrap: str, source: str, sink: str, group: str) -> None:
    """Forward every record of ``source`` to ``sink`` until SIGTERM or SIGINT."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(
        source, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await producer.start()
    await consumer.start()
    print(READY, flush=True)

    async def forward() -> None:
        async for message in consumer:
            await producer.send(sink, key=message.key, value=message.value)

    forwarding = asyncio.create_task(forward())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([forwarding, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        forwarding.cancel()
        stopping.cancel()
        outcome, _ = await asyncio.gather(forwarding, stopping, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
    if isinstance(outcome, Exception):
        raise outcome


def faust_table(bootstrap: str, source: str, sink: str, group: str, data_dir: str) -> int:
    """Run the plain Faust peer until SIGTERM; returns the exit code."""
    import faust

    app = faust.App(
        group,
        broker=";".join(f"kafka://{server}" for server in bootstrap.split(",")),
        store="rocksdb://",
        datadir=data_dir,
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        broker_session_timeout=6.0,
        broker_heartbeat_interval=2.0,
        web_enabled=False,
        autodiscover=False,
    )
    table = app.Table("peer-table", default=None, partitions=PARTITIONS, key_type=bytes, value_type=bytes)
    output = app.topic(sink, **_RAW)

    async def peer(stream: Any) -> None:
        async for key, value in stream.items():
            table[key] = value
            await output.send(key=key, value=value)

    app.agent(app.topic(source, **_RAW), name="bench.peer")(peer)
    worker = faust.Worker(app, loglevel="INFO", redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=("aiokafka", "faust"))
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT[,...]")
    parser.add_argument("--input", required=True, metavar="TOPIC")
    parser.add_argument("--output", required=True, metavar="TOPIC")
    parser.add_argument("--group", required=True, help="consumer group (the Faust app id for 'faust')")
    parser.add_argument("--data-dir", help="RocksDB directory of the Faust peer (default: a fresh temp dir)")
    args = parser.parse_args(argv)
    if args.peer == "aiokafka":
        logging.basicConfig(level=logging.WARNING)
        asyncio.run(aiokafka_loop(args.bootstrap, args.input, args.output, args.group))
        return 0
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="bench-faust-peer-")
    return faust_table(args.bootstrap, args.input, args.output, args.group, data_dir)


if __name__ == "__main__":
    sys.exit(main())
