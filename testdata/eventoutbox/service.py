"""A service built on the Python event-outbox library (v0.4.0), as its users
write one, driven by the Go tests in wireeventoutbox_live_test.go.

It records events with EventOutbox.event_listener(session) inside a motor
transaction and runs EventOutbox.run_event_handler, which runs the library's
own relay (publisher) and consumer. Its handler writes what it handled to
the collection "py_handled" in the handler's session, so the effect commits
with the library's inbox flip, as a user's business write would.

Arguments are JSON on the command line (one object); see main(). It prints
one JSON line per fact to stdout, flushed at once, so that a test that kills
it with SIGKILL knows what was committed before the kill:

    {"ready": true}                 the relay and consumer tasks run
    {"recorded": seq}               the transaction recording event seq committed
    {"handled": {...}}              the handler ran (its transaction may still abort)
    {"done": true}                  every event asked for is recorded
"""

import asyncio
import json
import logging
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from motor.motor_asyncio import AsyncIOMotorClient

from event_outbox import Event, EventOutbox


def emit(**fact):
    sys.stdout.write(json.dumps(fact) + "\n")
    sys.stdout.flush()


async def main(cfg):
    mongo = AsyncIOMotorClient(cfg["mongo_uri"])
    db = mongo[cfg["db"]]
    consumer = AIOKafkaConsumer(
        *cfg["subscribe"],
        bootstrap_servers=cfg["brokers"],
        group_id=cfg["group"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=cfg.get("session_timeout_ms", 6000),
        heartbeat_interval_ms=cfg.get("heartbeat_interval_ms", 500),
    )
    producer = AIOKafkaProducer(bootstrap_servers=cfg["brokers"], acks="all")
    outbox = EventOutbox(
        mongo,
        producer,
        consumer,
        mongo_db=db,
        mongo_collection_outbox=cfg.get("outbox", "transactional-outbox"),
        mongo_collection_inbox=cfg.get("inbox", "transactional-inbox"),
    )
    await outbox.create_indexes()
    handled = db["py_handled"]

    async def handler(event: Event, session) -> None:
        fact = {
            "topic": event.topic,
            "content_schema": event.content_schema,
            "idempotency_key": event.idempotency_key,
            "partition_key": event.partition_key,
            "extra": event.model_extra,
        }
        await handled.insert_one(dict(fact), session=session)
        emit(handled=fact)

    await consumer.start()
    await producer.start()
    try:
        async with outbox.run_event_handler(handler):
            emit(ready=True)
            # Run until the test closes stdin (or kills the process).
            closed = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            pub = cfg.get("publish")
            if pub:
                for seq in range(pub["start"], pub["end"]):
                    if closed.done():
                        break
                    async with await mongo.start_session() as session:
                        async with session.start_transaction():
                            async with outbox.event_listener(session) as listener:
                                listener.event_occurred(
                                    Event(
                                        topic=pub["topic"],
                                        content_schema=pub["schema"],
                                        partition_key=seq % pub["keys"],
                                        run=pub["run"],
                                        seq=seq,
                                    )
                                )
                    emit(recorded=seq)
                    if pub.get("pause_ms"):
                        await asyncio.sleep(pub["pause_ms"] / 1000)
                else:
                    emit(done=True)
            await closed
    finally:
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    # The library logs at INFO what it skips ("Skipped already handled
    # event"): the tests read it on stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("event_outbox").setLevel(logging.INFO)
    asyncio.run(main(json.loads(sys.argv[1])))
