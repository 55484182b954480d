"""The errors of decision review: all under :class:`ReviewError`, itself a
:class:`fleet_server.errors.FleetError`. The HTTP layer (:mod:`fleet_server.api.decisions`)
answers :class:`BadQuery` and :class:`BadReview` with 400, :class:`UnknownDecision` and
:class:`NoImage` and :class:`NoShadow` with 404."""

from __future__ import annotations

from fleet_server.errors import FleetError


class ReviewError(FleetError):
    """Decisions can't be listed, reviewed or exported as asked.

    Attributes:
        what: the parameter, decision or field concerned.
        reason: what is wrong.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


class BadQuery(ReviewError):
    """A filter, cursor, limit or grouping that can't be used.

    Attributes:
        param: the query parameter at fault (``cursor``, ``since``, ``group`` ...).
    """

    def __init__(self, param: str, reason: str) -> None:
        self.param = param
        super().__init__(param, reason)


class UnknownDecision(ReviewError):
    """No decision with that id is stored.

    Attributes:
        decision_id: the id asked for.
    """

    def __init__(self, decision_id: str) -> None:
        self.decision_id = decision_id
        super().__init__(f"decision {decision_id!r}", "no such decision")


class NoImage(ReviewError):
    """The decision is stored but no image of it is: its device kept no thumbnail
    (``[decision_log] thumbnails``), did not upload it, or it has not arrived yet.

    Attributes:
        decision_id: the id asked for.
    """

    def __init__(self, decision_id: str) -> None:
        self.decision_id = decision_id
        super().__init__(f"decision {decision_id!r}", "no image uploaded")


class NoShadow(ReviewError):
    """The decision is stored but no shadow record of it is: its frame was not sampled
    for a candidate in the device's shadow slot, or the record has not arrived yet.

    Attributes:
        decision_id: the id asked for.
    """

    def __init__(self, decision_id: str) -> None:
        self.decision_id = decision_id
        super().__init__(f"decision {decision_id!r}", "no shadow comparison of it stored")


class BadReview(ReviewError):
    """A review that can't be stored (wrong verdict, missing or needless outcome, note
    too long).

    Attributes:
        field: the field of the review at fault.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        super().__init__(field, reason)
