"""What the HTTP API needs from the rollout service (implemented in
:mod:`fleet_server.rollout.service`), and the errors that pick its HTTP status.

The API checks that a rollout exists (404) before it calls :meth:`RolloutOps.get` or
:meth:`RolloutOps.act`. Errors from the service map to statuses: :class:`ActionRefused`
and :class:`~fleet_server.db.RolloutConflict` → 409, any other
:class:`~fleet_server.rollout.RolloutError` → 400,
:class:`~fleet_server.db.StorageError` → 503. A rollout refused because another active
rollout holds its devices (:class:`fleet_server.rollout.service.RolloutOverlap`) → 409.

A rollout is answered as a JSON object; :class:`fleet_server.api.models.RolloutOut` names
the keys the API documents and ``fleetctl rollouts status`` reads (``rollout_id``,
``bundle``, ``version``, ``release``, ``phase``, ``wave``, ``waves``, ``reason``,
``selector``, ``counts``, ``devices``, ``created_at``, ``updated_at``); other keys are passed
through. :func:`fleet_server.rollout.view.view` builds that object from a stored
rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from fleet_server.actions.store import ActionRecord
from fleet_server.rollout.errors import RolloutError

Action = Literal["pause", "resume", "approve", "cancel", "rollback"]
ACTIONS: tuple[Action, ...] = ("pause", "resume", "approve", "cancel", "rollback")


class ActionRefused(RolloutError):
    """An operator action does not apply in the rollout's phase (HTTP 409).

    Attributes:
        rollout_id: the rollout.
        action: what was asked.
    """

    def __init__(self, rollout_id: str, action: str, reason: str) -> None:
        self.rollout_id = rollout_id
        self.action = action
        super().__init__("action", f"rollout '{rollout_id}': {reason}")


class RolloutOps(Protocol):
    """Create, read and act on rollouts; every method is called from a worker thread."""

    def create(self, spec: Mapping[str, Any], *, rollout_id: str | None = None) -> str:
        """Plan and store a rollout from a spec (as :func:`fleet_server.rollout.parse_spec`
        accepts it); return its id, ``rollout_id`` when given (a form posted twice then
        makes one rollout), else a new one.

        Raises:
            RolloutError: invalid spec, unknown bundle release, no device selected.
            RolloutConflict: a rollout with ``rollout_id`` exists.
        """
        ...

    def get(self, rollout_id: str) -> dict[str, Any]:
        """The rollout as a JSON object (see the module docstring)."""
        ...

    def list(self) -> list[dict[str, Any]]:
        """Every rollout, oldest first (without per-device detail if that is costly)."""
        ...

    def act(self, rollout_id: str, action: Action, reason: str, *, by: str = "") -> dict[str, Any]:
        """Apply an operator action (``by``: who, kept with it); return the rollout after.

        Raises:
            ActionRefused: the action does not apply in the rollout's phase.
            RolloutConflict: the rollout changed while the action was applied (retry).
        """
        ...

    def resolve(
        self,
        rollout_id: str,
        device_id: str,
        how: str,
        *,
        release: int | None = None,
        reason: str = "",
        by: str = "",
    ) -> dict[str, Any]:
        """Resolve a stuck (or reverting) device of a rollout that is rolling back:
        ``retry``, ``assign`` (``release``) or ``accept``; kept with ``by``. Returns the
        rollout after it.

        Raises:
            RolloutError: it does not apply (not rolling back, device not stuck, ...).
            RolloutConflict: the rollout changed meanwhile (retry).
        """
        ...


class DeviceActions(Protocol):
    """What the API and the console need of the remote actions service
    (:class:`fleet_server.actions.service.ActionService`); called from a worker thread."""

    def request(
        self, device_id: str, action: str, params: dict[str, Any], *, expires_s: int, by: str
    ) -> ActionRecord:
        """Sign, store and publish a request (``by``: who asked, kept with it).

        Raises:
            ActionError: 400 bad action, parameter or expiry; 404 no such device; 409 a
                revoked device; 503 not signed or not sent.
        """
        ...
