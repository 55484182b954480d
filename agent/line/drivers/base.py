"""What every PLC driver is: a key, a config model, ``open/read/write/close``, and a reason
word for every failure (:class:`agent.line.errors.LineError`).

A driver is used from one thread only, its link's (:mod:`agent.line.link`): the link
opens it, polls the inputs stations read, and hands it the writes stations queue, every
call with a timeout. A driver over an asyncio library (asyncua, pymodbus) runs that
library on one event loop in a thread of its own (:class:`AsyncRunner`) and crosses into
it with ``run_coroutine_threadsafe``; it never starts a loop per call.

A driver module declares ``KEY``, a module-level ``parse_point(address, vtype) -> Point``
that needs no protocol library (check-config uses it), and its class; its config model
(``driver: Literal[KEY]`` plus its own fields, on top of :class:`LinkConfig`) is in
:mod:`agent.line.drivers.configs`; it imports its protocol library
only inside :meth:`Driver.open` (or at most at module level behind the registry's lazy
import), so a device without the library still loads every configuration and reports
the driver unavailable with the reason.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import importlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from pydantic import Field

from agent.kernel.configbase import MAX_QUEUE, Section
from agent.line.errors import LineError
from agent.line.values import ValueType

T = TypeVar("T")

MAX_LINK_TIMEOUT_MS = 60_000.0


class LinkConfig(Section):
    """What every PLC connection has, whatever its protocol (``[[plc]]``)."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="The connection's name, used by stations and in stats and metrics.",
    )
    timeout_ms: float = Field(
        500.0,
        gt=0,
        le=MAX_LINK_TIMEOUT_MS,
        description="The longest any one call to the PLC (connect, read, write) may take.",
    )
    queue_bound: int = Field(
        64,
        ge=1,
        le=MAX_QUEUE,
        description="Writes queued for the PLC at most; a write beyond is refused with "
        "`queue_full` and counted, never waited for.",
    )
    reconnect_max_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Reconnect with exponential backoff from 0.1 s up to this.",
    )


@dataclass(frozen=True)
class Point:
    """One address on a PLC, parsed by its driver.

    Attributes:
        address: as the configuration spells it (a node id, a register, a tag, a DB).
        vtype: the value's type (:data:`agent.line.values.ValueType`).
        parsed: the driver's own form of the address.
    """

    address: str
    vtype: ValueType
    parsed: Any = None


class Driver(abc.ABC):
    """One connection to one PLC, used from one thread.

    Every method raises :class:`LineError` with a reason word; nothing else escapes
    (a library's own exception is wrapped, as python-tuf's fetchers do).
    """

    KEY: ClassVar[str]
    LIBRARY: ClassVar[str] = ""
    """The protocol library's import name (checked by :meth:`check_library`)."""

    def __init__(self, config: LinkConfig) -> None:
        self.config = config
        self.timeout_s = config.timeout_ms / 1000.0

    @classmethod
    def check_library(cls) -> None:
        """Import the protocol library.

        Raises:
            Exception: it can't be imported here (the registry reports why).
        """
        if cls.LIBRARY:
            importlib.import_module(cls.LIBRARY)

    @abc.abstractmethod
    def open(self) -> None:
        """Connect (within the timeout).

        Raises:
            LineError: ``refused``, ``timeout``, ``denied``, ``unavailable`` ...
        """

    @abc.abstractmethod
    def read(self, points: Sequence[Point]) -> list[Any]:
        """The values of ``points``, each as a Python value of its type.

        Raises:
            LineError: ``timeout``, ``bad_node``, ``type_mismatch``, ``disconnected`` ...
        """

    @abc.abstractmethod
    def write(self, writes: Sequence[tuple[Point, Any]]) -> None:
        """Write each value (already :func:`agent.line.values.coerce`-d) in the order
        given; a station lists its result-valid flag last, so a PLC that sees it set reads
        the rest of the result already written.

        Raises:
            LineError: ``timeout``, ``bad_node``, ``type_mismatch``, ``denied`` ...
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect; never raises."""

    def watch(
        self,
        points: Sequence[Point],
        on_change: Callable[[int, Any], None],
        *,
        period_s: float = 0.01,
    ) -> bool:
        """Ask the PLC to report changes of ``points`` (``on_change(index, value)``, on
        any thread), sampled every ``period_s``; False when the protocol has no such thing
        and the link polls instead (the default). OPC UA subscriptions do this.

        Raises:
            LineError: the PLC refused the subscription.
        """
        return False


class AsyncRunner:
    """One asyncio event loop in a daemon thread, for a driver over an asyncio library.

    :meth:`call` runs a coroutine on it and waits for it up to a timeout, from any other
    thread; on a timeout the coroutine is cancelled.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"line-{name}-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """The coroutine's result.

        Raises:
            TimeoutError: it took longer than ``timeout_s`` (it was cancelled).
            Exception: whatever the coroutine raised.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout_s:g} s") from None

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the loop and join its thread (bounded)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


def wrap(link: str, exc: BaseException) -> LineError:
    """A library's exception as a :class:`LineError` with the nearest reason word (a
    driver maps its library's own errors first and calls this for the rest)."""
    if isinstance(exc, LineError):
        return exc
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return LineError(link, "timeout", str(exc) or "no answer in time")
    if isinstance(exc, ConnectionRefusedError | ConnectionResetError | BrokenPipeError):
        return LineError(link, "refused", str(exc) or type(exc).__name__)
    if isinstance(exc, ConnectionError | OSError | EOFError):
        return LineError(link, "disconnected", f"{type(exc).__name__}: {exc}")
    return LineError(link, "protocol", f"{type(exc).__name__}: {exc}")
