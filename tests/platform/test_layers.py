"""The embedded platform's channel layer (config.layers): a send from another thread's event loop
(a Celery task's after-commit broadcast) reaches a consumer waiting on the server's loop promptly."""

import asyncio
import threading
import time

from asgiref.sync import async_to_sync

from config.layers import LoopSafeInMemoryChannelLayer


def test_a_send_from_another_threads_loop_wakes_the_waiting_receiver():
    layer = LoopSafeInMemoryChannelLayer()
    received: list[tuple[dict, float]] = []
    ready = threading.Event()

    async def consumer():
        channel = await layer.new_channel()
        await layer.group_add("job-1", channel)
        ready.set()
        message = await layer.receive(channel)
        received.append((message, time.monotonic()))

    server = threading.Thread(target=lambda: asyncio.run(consumer()))  # the server's loop
    server.start()
    assert ready.wait(5)
    time.sleep(0.2)  # the consumer is parked in receive()
    sent = time.monotonic()
    async_to_sync(layer.group_send)("job-1", {"type": "push", "messages": [1]})  # a worker thread's loop
    server.join(timeout=5)
    assert not server.is_alive(), "the receiver was never woken"
    (message, at), = received
    assert message == {"type": "push", "messages": [1]}
    assert at - sent < 0.5
