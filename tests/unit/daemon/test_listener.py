"""The REST listener's socket (`mm2py.daemon.api.bind`), on a free local port, no broker."""

from __future__ import annotations

import asyncio
import socket

from mm2py.daemon.api import bind


def test_connections_accepted_by_the_listener_send_without_delay() -> None:
    """uvicorn serves on asyncio, which turns Nagle's algorithm off only on a connection
    whose socket says TCP. `socket.create_server` made the listener with protocol 0, so
    every answer's body, written after its head, waited for the client's delayed
    acknowledgement (40 ms) on a kept connection."""
    listener = bind("127.0.0.1", 0)
    port = listener.getsockname()[1]
    seen: list[int] = []

    async def served(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = writer.get_extra_info("socket")
        seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    async def connect_once() -> None:
        server = await asyncio.start_server(served, sock=listener)
        async with server:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await _reader.read()  # until the server closes
            writer.close()

    asyncio.run(connect_once())
    assert listener.proto == socket.IPPROTO_TCP
    assert seen == [1]


def test_the_listener_binds_its_port_again_while_old_connections_wait() -> None:
    """SO_REUSEADDR, as `socket.create_server` set it: a daemon restarted at once binds
    its port though the last one's closed connections are still in TIME_WAIT."""
    listener = bind("127.0.0.1", 0)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server closes first: its side waits (TIME_WAIT)
    client.close()
    listener.close()
    bind("127.0.0.1", port).close()
