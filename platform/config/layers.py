"""The embedded platform's channel layer: Channels' in-memory layer, safe to send to from any thread.

In the embedded platform the web server and the Celery worker share one process but not one event
loop: consumers wait on the server's loop, while a task's after-commit broadcast runs
``async_to_sync(group_send)`` on a loop of the worker thread. The in-memory layer's queues are
plain ``asyncio.Queue`` objects, which must only be touched from their own loop (a put from another
thread would not wake the waiting consumer). This layer runs every operation on the loop that
receives (the server's) whenever it is called from another loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer


class LoopSafeInMemoryChannelLayer(InMemoryChannelLayer):
    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._home: asyncio.AbstractEventLoop | None = None

    async def _at_home(self, method, *args: Any) -> Any:
        home, here = self._home, asyncio.get_running_loop()
        if home is None or home is here or home.is_closed():
            return await method(*args)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(method(*args), home))

    async def receive(self, channel: str) -> dict:
        self._home = asyncio.get_running_loop()  # the loop the consumers live on
        return await super().receive(channel)

    async def send(self, channel: str, message: dict) -> None:
        await self._at_home(super().send, channel, message)

    async def group_add(self, group: str, channel: str) -> None:
        await self._at_home(super().group_add, group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        await self._at_home(super().group_discard, group, channel)

    async def group_send(self, group: str, message: dict) -> None:
        await self._at_home(super().group_send, group, message)
