"""Admission control, priorities, deadlines and batching: the pool's pure core.

No clocks, sockets or processes here: every method takes ``now`` (monotonic
nanoseconds) and returns decisions, so the rules are tested directly. The pool's I/O
shell calls it under one lock.

Rules:
- Each model has a bounded queue. A request that finds it full is refused at once
  (the caller gets ``Overloaded``); nothing blocks.
- A queued request whose deadline has passed is dropped before it runs and reported
  as expired.
- Priority classes: every queued CONTROL request goes before any BACKGROUND one; within
  a class, the oldest head of any model goes first.
- Batching (per model, off by default): a worker takes up to ``max_batch`` requests of
  one model; with fewer queued it waits until the oldest has waited ``max_wait_ns``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Priority(IntEnum):
    """Lower value runs first."""

    CONTROL = 0
    BACKGROUND = 1


@dataclass(frozen=True)
class QueuePolicy:
    queue_bound: int = 8
    max_batch: int = 1
    max_wait_ns: int = 0

    def __post_init__(self) -> None:
        if self.queue_bound < 1:
            raise ValueError(f"queue_bound must be >= 1, got {self.queue_bound}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_wait_ns < 0:
            raise ValueError(f"max_wait_ns must be >= 0, got {self.max_wait_ns}")


@dataclass
class Ticket:
    """One admitted request as the scheduler sees it."""

    model: int
    priority: Priority
    enqueued_ns: int
    deadline_ns: int | None
    payload: Any = None  # the shell's request object, opaque here


@dataclass
class _ModelQueue:
    policy: QueuePolicy
    by_priority: tuple[deque[Ticket], ...] = field(default_factory=tuple)
    reserved: int = 0

    def __len__(self) -> int:
        return sum(len(q) for q in self.by_priority)


class Scheduler:
    def __init__(self, policies: list[QueuePolicy]) -> None:
        self._models = [_ModelQueue(p, tuple(deque() for _ in Priority)) for p in policies]

    # -- admission ---------------------------------------------------------------
    def reserve(self, model: int, ahead: int = 0) -> bool:
        """Hold a queue place while the caller fills its slot. False: queue full.

        ``ahead``: requests of the model already sent to busy workers but not started
        (pipelining); they wait like queued ones, so they count against the bound.
        """
        mq = self._models[model]
        if len(mq) + mq.reserved + ahead >= mq.policy.queue_bound:
            return False
        mq.reserved += 1
        return True

    def unreserve(self, model: int) -> None:
        self._models[model].reserved -= 1

    def enqueue(self, ticket: Ticket) -> None:
        """Queue a request whose place was reserved."""
        mq = self._models[ticket.model]
        mq.reserved -= 1
        mq.by_priority[ticket.priority].append(ticket)

    def queued(self, model: int) -> int:
        return len(self._models[model])

    def total_queued(self) -> int:
        return sum(len(mq) for mq in self._models)

    # -- dispatch ----------------------------------------------------------------
    def expire(self, now: int) -> list[Ticket]:
        """Remove and return every queued request whose deadline has passed."""
        gone: list[Ticket] = []
        for mq in self._models:
            for q in mq.by_priority:
                if any(t.deadline_ns is not None and t.deadline_ns <= now for t in q):
                    keep = [t for t in q if t.deadline_ns is None or t.deadline_ns > now]
                    gone.extend(t for t in q if t.deadline_ns is not None and t.deadline_ns <= now)
                    q.clear()
                    q.extend(keep)
        return gone

    def next_batch(self, now: int) -> tuple[list[Ticket], list[Ticket]]:
        """Pick the next work for one idle worker.

        Returns (batch, expired): ``batch`` is empty when nothing is ready (queues empty,
        or a batching model still waiting for more requests); ``expired`` are requests
        found past their deadline on the way, to be failed by the caller.
        """
        expired = self.expire(now)
        for prio in Priority:
            best: _ModelQueue | None = None
            for mq in self._models:
                q = mq.by_priority[prio]
                if not q or not self._ready(mq, prio, now):
                    continue
                if best is None or q[0].enqueued_ns < best.by_priority[prio][0].enqueued_ns:
                    best = mq
            if best is not None:
                q = best.by_priority[prio]
                batch = [q.popleft() for _ in range(min(best.policy.max_batch, len(q)))]
                return batch, expired
        return [], expired

    def _ready(self, mq: _ModelQueue, prio: Priority, now: int) -> bool:
        policy = mq.policy
        if policy.max_batch == 1:
            return True
        q = mq.by_priority[prio]
        return len(q) >= policy.max_batch or now - q[0].enqueued_ns >= policy.max_wait_ns

    def next_wakeup(self, now: int) -> int | None:
        """When the shell must look again even if no worker frees up: the earliest
        batching wait that runs out or the earliest deadline. ``None``: no timer needed."""
        times: list[int] = []
        for mq in self._models:
            for q in mq.by_priority:
                if not q:
                    continue
                if mq.policy.max_batch > 1 and len(q) < mq.policy.max_batch:
                    times.append(q[0].enqueued_ns + mq.policy.max_wait_ns)
                times.extend(t.deadline_ns for t in q if t.deadline_ns is not None)
        return min(times) if times else None

    def drain(self) -> list[Ticket]:
        """Remove and return everything queued (pool closing, no workers left)."""
        out: list[Ticket] = []
        for mq in self._models:
            for q in mq.by_priority:
                out.extend(q)
                q.clear()
        return out
