"""Running an ``async`` predict (or an async generator) from a worker's synchronous thread.

Shared by the socket worker and the Dynamo bridge: the awaitable runs as a task on the
thread's own event loop, and the request context's cancellation cancels that task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .context import RequestContext

if TYPE_CHECKING:  # (asyncio is imported by what runs a coroutine: a worker of sync
    import asyncio  # predicts never pays its import, a third of a worker's start)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def run_async(loop: asyncio.AbstractEventLoop, awaitable: Any, ctx: RequestContext) -> Any:
    """Run ``awaitable`` to completion on ``loop``; a cancel of ``ctx`` cancels it."""
    task = loop.create_task(_await(awaitable))
    ctx.on_cancel(lambda: loop.call_soon_threadsafe(task.cancel))
    try:
        return loop.run_until_complete(task)
    finally:
        ctx.on_cancel(None)


def iterate_async(loop_of_thread: Callable[[], asyncio.AbstractEventLoop], agen: Any,
                  ctx: RequestContext) -> Iterator[Any]:
    """The items of an async generator, one ``run_async`` each; it is closed at the end."""
    try:
        while True:
            try:
                yield run_async(loop_of_thread(), agen.__anext__(), ctx)
            except StopAsyncIteration:
                return
    finally:
        loop_of_thread().run_until_complete(agen.aclose())
