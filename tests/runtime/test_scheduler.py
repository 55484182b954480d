"""The scheduler's rules, tested directly: no processes, no clocks (explicit ``now``)."""

from __future__ import annotations

import pytest

from runtime.scheduler import Priority, QueuePolicy, Scheduler, Ticket

MS = 1_000_000


def admit(
    sched: Scheduler,
    model: int,
    now: int,
    *,
    priority: Priority = Priority.CONTROL,
    deadline: int | None = None,
    tag: object = None,
) -> Ticket:
    assert sched.reserve(model), f"model {model}: no place left"
    ticket = Ticket(model, priority, now, deadline, tag)
    sched.enqueue(ticket)
    return ticket


def tags(tickets: list[Ticket]) -> list[object]:
    return [t.payload for t in tickets]


def test_reserve_refuses_once_the_queue_bound_is_reached() -> None:
    sched = Scheduler([QueuePolicy(queue_bound=2)])
    assert sched.reserve(0)
    assert sched.reserve(0)
    assert not sched.reserve(0)
    assert not sched.reserve(0)  # refusing holds no place either


def test_queued_tickets_and_reservations_share_the_bound() -> None:
    sched = Scheduler([QueuePolicy(queue_bound=3)])
    admit(sched, 0, 0, tag="a")
    admit(sched, 0, 1, tag="b")
    assert sched.queued(0) == 2
    assert sched.reserve(0)  # the third place, held while the caller fills its slot
    assert not sched.reserve(0)


def test_bound_is_per_model() -> None:
    sched = Scheduler([QueuePolicy(queue_bound=1), QueuePolicy(queue_bound=1)])
    assert sched.reserve(0)
    assert not sched.reserve(0)
    assert sched.reserve(1)


def test_unreserve_frees_a_place() -> None:
    sched = Scheduler([QueuePolicy(queue_bound=1)])
    assert sched.reserve(0)
    assert not sched.reserve(0)
    sched.unreserve(0)
    assert sched.reserve(0)


def test_dispatch_frees_places_in_the_queue() -> None:
    sched = Scheduler([QueuePolicy(queue_bound=1)])
    admit(sched, 0, 0, tag="a")
    assert not sched.reserve(0)
    batch, _ = sched.next_batch(1)
    assert tags(batch) == ["a"]
    assert sched.reserve(0)


def test_control_runs_before_an_older_background_request() -> None:
    sched = Scheduler([QueuePolicy(), QueuePolicy()])
    admit(sched, 0, 0, priority=Priority.BACKGROUND, tag="bg-old")
    admit(sched, 1, 5, priority=Priority.BACKGROUND, tag="bg-other-model")
    admit(sched, 0, 10, priority=Priority.CONTROL, tag="ctl-new")
    order = [tags(sched.next_batch(20)[0]) for _ in range(3)]
    assert order == [["ctl-new"], ["bg-old"], ["bg-other-model"]]


def test_oldest_head_of_any_model_goes_first_within_a_class() -> None:
    sched = Scheduler([QueuePolicy(), QueuePolicy(), QueuePolicy()])
    admit(sched, 1, 10, tag="m1-t10")
    admit(sched, 0, 20, tag="m0-t20")
    admit(sched, 2, 5, tag="m2-t5")
    admit(sched, 1, 30, tag="m1-t30")
    admit(sched, 0, 25, tag="m0-t25")
    order = [tags(sched.next_batch(100)[0])[0] for _ in range(5)]
    assert order == ["m2-t5", "m1-t10", "m0-t20", "m0-t25", "m1-t30"]
    assert sched.next_batch(100) == ([], [])


def test_expired_tickets_come_back_as_expired_and_never_in_a_batch() -> None:
    sched = Scheduler([QueuePolicy()])
    admit(sched, 0, 0, deadline=10, tag="late")
    admit(sched, 0, 1, deadline=100, tag="in-time")
    admit(sched, 0, 2, tag="no-deadline")
    batch, expired = sched.next_batch(10)  # a deadline equal to now has passed
    assert tags(expired) == ["late"]
    assert tags(batch) == ["in-time"]
    batch, expired = sched.next_batch(10_000)
    assert tags(batch) == ["no-deadline"]
    assert expired == []
    assert sched.total_queued() == 0


def test_expire_removes_only_the_tickets_past_their_deadline() -> None:
    sched = Scheduler([QueuePolicy(), QueuePolicy()])
    admit(sched, 0, 0, deadline=5, tag="a")
    admit(sched, 0, 1, deadline=50, tag="b")
    admit(sched, 1, 2, priority=Priority.BACKGROUND, deadline=6, tag="c")
    admit(sched, 1, 3, priority=Priority.BACKGROUND, tag="d")
    assert sorted(tags(sched.expire(7))) == ["a", "c"]
    assert sched.expire(7) == []
    assert sched.queued(0) == 1
    assert sched.queued(1) == 1
    # an expired ticket gives its place back
    assert sched.reserve(0)


def test_all_expired_leaves_nothing_to_run() -> None:
    sched = Scheduler([QueuePolicy()])
    admit(sched, 0, 0, deadline=1, tag="a")
    admit(sched, 0, 0, deadline=2, tag="b")
    batch, expired = sched.next_batch(3)
    assert batch == []
    assert tags(expired) == ["a", "b"]


def test_batching_waits_until_max_batch_is_queued() -> None:
    sched = Scheduler([QueuePolicy(max_batch=3, max_wait_ns=10 * MS)])
    admit(sched, 0, 0, tag="a")
    admit(sched, 0, 1 * MS, tag="b")
    assert sched.next_batch(2 * MS) == ([], [])
    admit(sched, 0, 3 * MS, tag="c")
    batch, _ = sched.next_batch(3 * MS)  # long before max_wait: the batch is full
    assert tags(batch) == ["a", "b", "c"]


def test_batching_sends_a_partial_batch_once_the_oldest_waited_max_wait() -> None:
    sched = Scheduler([QueuePolicy(max_batch=4, max_wait_ns=10 * MS)])
    admit(sched, 0, 0, tag="a")
    admit(sched, 0, 4 * MS, tag="b")
    assert sched.next_batch(10 * MS - 1) == ([], [])
    batch, _ = sched.next_batch(10 * MS)
    assert tags(batch) == ["a", "b"]


def test_a_batch_never_holds_more_than_max_batch() -> None:
    sched = Scheduler([QueuePolicy(max_batch=2, max_wait_ns=10 * MS)])
    for i in range(5):
        admit(sched, 0, i, tag=i)
    assert tags(sched.next_batch(5)[0]) == [0, 1]
    assert tags(sched.next_batch(5)[0]) == [2, 3]
    assert sched.next_batch(5) == ([], [])  # the fifth waits for company or max_wait
    assert tags(sched.next_batch(4 + 10 * MS)[0]) == [4]


def test_a_batch_holds_one_model_only() -> None:
    sched = Scheduler([QueuePolicy(max_batch=4, max_wait_ns=0), QueuePolicy(max_batch=4)])
    admit(sched, 0, 0, tag="m0")
    admit(sched, 1, 1, tag="m1")
    assert tags(sched.next_batch(2)[0]) == ["m0"]
    assert tags(sched.next_batch(2)[0]) == ["m1"]


def test_a_batch_still_filling_does_not_hold_up_another_model() -> None:
    sched = Scheduler([QueuePolicy(max_batch=4, max_wait_ns=10 * MS), QueuePolicy()])
    admit(sched, 0, 0, tag="waits-for-batch")
    admit(sched, 1, 1 * MS, tag="ready")
    assert tags(sched.next_batch(2 * MS)[0]) == ["ready"]
    assert sched.next_batch(2 * MS) == ([], [])
    assert tags(sched.next_batch(10 * MS)[0]) == ["waits-for-batch"]


def test_next_wakeup_is_when_the_oldest_batch_wait_runs_out() -> None:
    sched = Scheduler([QueuePolicy(max_batch=4, max_wait_ns=10 * MS)])
    assert sched.next_wakeup(0) is None
    admit(sched, 0, 3 * MS, tag="a")
    admit(sched, 0, 5 * MS, tag="b")
    assert sched.next_wakeup(6 * MS) == 13 * MS


def test_next_wakeup_is_the_earliest_deadline_when_that_comes_first() -> None:
    sched = Scheduler([QueuePolicy(max_batch=4, max_wait_ns=10 * MS), QueuePolicy()])
    admit(sched, 0, 0, tag="batching")  # wait runs out at 10 ms
    admit(sched, 1, 1 * MS, deadline=7 * MS, tag="deadline")
    admit(sched, 1, 2 * MS, deadline=4 * MS, priority=Priority.BACKGROUND, tag="sooner")
    assert sched.next_wakeup(2 * MS) == 4 * MS


def test_next_wakeup_needs_no_timer_without_deadlines_or_filling_batches() -> None:
    sched = Scheduler([QueuePolicy(), QueuePolicy(max_batch=2, max_wait_ns=10 * MS)])
    admit(sched, 0, 0, tag="plain")
    assert sched.next_wakeup(1) is None
    admit(sched, 1, 0, tag="x")
    admit(sched, 1, 0, tag="y")  # a full batch waits for a worker, not a timer
    assert sched.next_wakeup(1) is None


def test_drain_returns_everything_queued_and_empties_the_queues() -> None:
    sched = Scheduler([QueuePolicy(), QueuePolicy(max_batch=4, max_wait_ns=MS)])
    admit(sched, 0, 0, tag="a")
    admit(sched, 0, 1, priority=Priority.BACKGROUND, deadline=5, tag="b")
    admit(sched, 1, 2, tag="c")
    assert sorted(tags(sched.drain())) == ["a", "b", "c"]
    assert sched.total_queued() == 0
    assert sched.drain() == []
    assert sched.next_batch(100) == ([], [])
    assert sched.next_wakeup(100) is None


@pytest.mark.parametrize(
    "kwargs",
    [{"queue_bound": 0}, {"max_batch": 0}, {"max_wait_ns": -1}],
    ids=["queue_bound", "max_batch", "max_wait_ns"],
)
def test_queue_policy_rejects_impossible_values(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        QueuePolicy(**kwargs)
