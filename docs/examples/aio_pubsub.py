"""asyncio SDK: publish a batch, then read it back as an async iterator; ``on_event`` observes
what the broker committed. Run: ``python docs/examples/aio_pubsub.py 127.0.0.1:7001``."""

import asyncio
import sys

from broker.client import Record
from broker.client.aio import AsyncClient


async def main(bootstrap: str) -> None:
    committed: list[str] = []
    async with AsyncClient(bootstrap, on_event=lambda kind, item: committed.append(kind)) as client:
        await client.create_topic("aio-demo", 2, exist_ok=True)
        results = await client.publish_batch("aio-demo", [{"value": f"hello {i}", "key": f"k{i}"} for i in range(4)])
        print("published", [(r.partition, r.offset) for r in results])
        async with client.subscribe("aio-demo", stop_at_end=True) as subscription:
            async for item in subscription:
                if isinstance(item, Record):
                    print("read", item.partition, item.offset, item.value.decode())
    print("observed", sorted(set(committed)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7001"))
