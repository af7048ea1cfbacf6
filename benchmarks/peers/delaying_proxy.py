"""A TCP proxy on loopback that holds every chunk of a response for a fixed delay, as a slow link
would (the diagnosis bench's transport case runs it in a process of its own).

    python benchmarks/peers/delaying_proxy.py UPSTREAM_PORT DELAY_S

Prints the port it listens on (127.0.0.1), then serves until killed: requests pass at once, each chunk
the upstream sends is passed on DELAY_S after it was read, in order.
"""
from __future__ import annotations

import sys


def serve_proxy(upstream_port: int, delay_s: float) -> None:
    """The proxy's process: prints its port, then serves until killed."""
    import asyncio

    async def pipe(reader, writer, delay):
        loop, held = asyncio.get_running_loop(), asyncio.Queue()

        async def send():  # each chunk written `delay` after it was read, in order
            while (item := await held.get()) is not None:
                await asyncio.sleep(max(0.0, item[0] + delay - loop.time()))
                writer.write(item[1])
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                held.put_nowait((loop.time(), data))
        except (ConnectionError, OSError):
            pass
        finally:
            held.put_nowait(None)
            try:
                await sender
            except (ConnectionError, OSError):
                pass
            writer.close()

    async def handle(client_r, client_w):
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(client_r, up_w, 0.0), pipe(up_r, client_w, delay_s))

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


if __name__ == "__main__":
    serve_proxy(int(sys.argv[1]), float(sys.argv[2]))
