"""asyncio SDK: a job queue worked by a handler with concurrency (a handler that returns acks its
job, one that raises nacks it for a retry). Run: ``python docs/examples/aio_worker.py 127.0.0.1:7001``."""

import asyncio
import sys

from broker.client.aio import AsyncClient, AsyncMessage


async def main(bootstrap: str) -> None:
    async with AsyncClient(bootstrap) as client:
        await client.create_topic("aio-jobs", 2, exist_ok=True)
        await client.publish_batch("aio-jobs", [f"job {i}" for i in range(8)])

        async def handle(message: AsyncMessage) -> None:
            await asyncio.sleep(0.01)  # the work
            print("done", message.value.decode())

        handled = await client.run("aio-jobs", group="aio-workers", handler=handle, concurrency=4, limit=8)
        lag = await client.group_lag("aio-jobs", "aio-workers")
        print("handled", handled, "lag", lag.lag)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7001"))
