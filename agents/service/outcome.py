"""How every call of the agent API ends: counted, logged, and errors turned into codes.

One place, so that each call is counted once in `meridian_agent_requests_total{call,
code}` whatever way it ends: answered, refused with a Meridian error (its code, by
agents.rpc.status), aborted by a delegate (the code it set), cancelled (the client
left, or its deadline passed) or failed by a bug (INTERNAL, with the traceback in the
log and a one-sentence message to the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from agents.metrics import AgentMetrics
from agents.rpc.status import abort, code_of
from controlplane.errors import MeridianError
from controlplane.logs import get_logger

log = get_logger("meridian.agent.api")

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


class InternalError(MeridianError):
    """A bug in the agent: the call failed without a Meridian error (INTERNAL)."""


def _ended(context: Context) -> grpc.StatusCode:
    """The code of a call that was cancelled under us."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


def _aborted(context: Context) -> grpc.StatusCode:
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _code(exc: BaseException) -> grpc.StatusCode:
    return code_of(exc) if isinstance(exc, MeridianError) else grpc.StatusCode.INTERNAL


async def _refuse(call: str, context: Context, exc: BaseException) -> grpc.StatusCode:
    """Log `exc` and end the call with its code (raises grpc's AbortError)."""
    if isinstance(exc, MeridianError):
        code = code_of(exc)
        log.info("call_refused", call=call, code=code.name, error=str(exc))
        await abort(context, exc)
    log.exception("call_failed", call=call, error=f"{type(exc).__name__}: {exc}")
    await abort(context, InternalError(f"the agent failed the {call} call; its log says why"))


async def unary(
    call: str, context: Context, metrics: AgentMetrics, fn: Callable[[], Awaitable[T]]
) -> T:
    """Run a unary (or client-stream) handler body, count how it ended and time it."""
    code: grpc.StatusCode | None = grpc.StatusCode.OK
    started = time.monotonic()
    try:
        return await fn()
    except grpc.aio.AbortError:
        code = _aborted(context)
        raise
    except asyncio.CancelledError:
        code = _ended(context)
        raise
    except Exception as exc:
        # Counted and timed before the status leaves: a client that reads the metrics
        # right after its refusal must find it (counting in `finally` raced the client).
        metrics.requests.labels(call=call, code=_code(exc).name).inc()
        metrics.call_timer(call).observe(time.monotonic() - started)
        code = None
        await _refuse(call, context, exc)
        raise  # pragma: no cover - _refuse always raises
    finally:
        if code is not None:
            metrics.requests.labels(call=call, code=code.name).inc()
            metrics.call_timer(call).observe(time.monotonic() - started)


async def stream(
    call: str, context: Context, metrics: AgentMetrics, gen: AsyncIterator[T]
) -> AsyncIterator[T]:
    """Relay a server-stream handler's messages, count how the call ended and time it."""
    code: grpc.StatusCode | None = grpc.StatusCode.OK
    started = time.monotonic()
    try:
        async with contextlib.aclosing(gen):  # type: ignore[type-var]
            async for item in gen:
                yield item
    except grpc.aio.AbortError:
        code = _aborted(context)
        raise
    except (asyncio.CancelledError, GeneratorExit):
        # GeneratorExit: the client left mid-stream and grpc dropped this generator
        # unfinished (it is closed later); the call did not end well.
        code = _ended(context)
        raise
    except Exception as exc:  # noqa: BLE001 - every error ends the call with a code
        metrics.requests.labels(call=call, code=_code(exc).name).inc()  # before it leaves
        metrics.call_timer(call).observe(time.monotonic() - started)
        code = None
        await _refuse(call, context, exc)
    finally:
        if code is not None:
            metrics.requests.labels(call=call, code=code.name).inc()
            metrics.call_timer(call).observe(time.monotonic() - started)
