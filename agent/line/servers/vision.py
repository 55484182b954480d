"""What the OPC UA server decides, without OPC UA: the OPC 40100 states a station may be
in, which method each state allows, the SEMI E10 state each maps to, how a station's
result reads as an OPC 40100 result, and which recipes (installed bundles) a client's
filter or id selects.

The server (:mod:`agent.line.servers.opcua`) is the I/O shell around these functions;
they take and return plain values, so they are tested without sockets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.line.results import StationResult

TOP_STATES = ("Preoperational", "Halted", "Error")
"""The VisionStateMachine's states other than Operational."""
AUTO_STATES = ("Initialized", "Ready", "SingleExecution", "ContinuousExecution")
"""The VisionAutomaticModeStateMachine's states: Operational's sub-states."""
STATES = TOP_STATES + AUTO_STATES
"""Every state :meth:`VisionServer.set_state` takes."""
OPERATIONAL = "Operational"

EXECUTING = ("SingleExecution", "ContinuousExecution")

# SEMI E10 (OPC 40100's SystemStateDataType): productive, standby, engineering,
# scheduled downtime, unscheduled downtime, non-scheduled time.
PRD, SBY, ENG, SDT, UDT, NST = 1, 2, 3, 4, 5, 6
SEMI_E10: dict[str, tuple[int, str]] = {
    "Preoperational": (SDT, "starting: not yet ready for parts"),
    "Halted": (NST, "halted: not scheduled for parts"),
    "Error": (UDT, "error: down until reset"),
    "Initialized": (SBY, "initialized: no recipe prepared"),
    "Ready": (SBY, "ready: waiting for a trigger"),
    "SingleExecution": (PRD, "inspecting a part"),
    "ContinuousExecution": (PRD, "inspecting continuously"),
}
"""Each state's SEMI E10 state (SystemStateDataType value) and its description."""

METHOD_STATES: dict[str, tuple[str, ...]] = {
    "StartSingleJob": ("Ready",),
    "Stop": EXECUTING,
    "Abort": EXECUTING,
    "Halt": ("Preoperational", "Error", *AUTO_STATES),
    "Reset": ("Halted", "Error", "Initialized", "Ready"),
    "PrepareRecipe": ("Preoperational", "Initialized", "Ready"),
}
"""The states in which each state-bound method may be called (OPC 40100-1 8.2, 8.3:
a single job starts from Ready; Stop and Abort end an execution; Halt comes from
anywhere but Halted; Reset returns an idle, halted or failed system to Preoperational;
a recipe is prepared between jobs)."""

# OPC 40100's ResultStateDataType (an Int32, not an enumeration).
RESULT_UNDEFINED, RESULT_COMPLETED, RESULT_PROCESSING, RESULT_ABORTED, RESULT_FAILED = 0, 1, 2, 3, 4
RESULT_STATES: dict[str, int] = {
    "ok": RESULT_COMPLETED,  # decided within the deadline
    "deadline_missed": RESULT_ABORTED,  # not decided in time: the fail-safe result
    "overrun": RESULT_ABORTED,  # a trigger while busy: the fail-safe result, not decided
    "error": RESULT_FAILED,  # the decision failed: the fail-safe result
}
"""The ResultState of each :data:`agent.line.results.STATUS_CODES` status."""

MAX_ID = 255
"""Characters of an id a client sends (recipe, part, measurement, result, job) at most."""
MAX_LIST = 1000
"""Entries one list answer (recipes, results) holds at most."""


@dataclass(frozen=True)
class Recipe:
    """An installed, verified model bundle, as OPC 40100 sees a recipe.

    Attributes:
        id: what selects it (the recipe's InternalId.Id), unique per station.
        name: the bundle's name (the recipe's ExternalId.Id: what a PLC asks for).
        version: the bundle's version.
        digest: the bundle's digest (``sha256:<hex>`` or bare hex).
        active: it is the bundle the station decides with now (IsPrepared).
    """

    id: str
    name: str
    version: str
    digest: str
    active: bool


def state_refusal(method: str, state: str) -> str | None:
    """Why ``method`` can't be called in ``state``; None when it can."""
    allowed = METHOD_STATES.get(method)
    if allowed is None or state in allowed:
        return None
    return f"{method} is not allowed in state {state} (only in {', '.join(allowed)})"


def split_state(state: str) -> tuple[str, str | None]:
    """The VisionStateMachine's state and the automatic mode's (None outside
    Operational) for one of :data:`STATES`.

    Raises:
        ValueError: ``state`` is none of them.
    """
    if state in TOP_STATES:
        return state, None
    if state in AUTO_STATES:
        return OPERATIONAL, state
    raise ValueError(f"unknown OPC 40100 state {state!r}: one of {', '.join(STATES)}")


def digest_bytes(digest: str) -> tuple[bytes, str]:
    """A bundle digest as the recipe's Hash and HashAlgorithm: ``sha256:<hex>`` or 64 hex
    digits -> (the 32 bytes, ``SHA-256``); anything else -> (its UTF-8, "")."""
    text = digest.removeprefix("sha256:")
    if len(text) == 64:
        try:
            return bytes.fromhex(text), "SHA-256"
        except ValueError:
            pass
    return digest.encode(), ""


def result_id(result: StationResult) -> str:
    """The result's ResultId: its decision id, or ``<station>/<seq>`` for a fail-safe
    result that has none."""
    return result.decision_id or f"{result.station}/{result.seq}"


def trigger_job_id(result: StationResult) -> str:
    """The JobId of a result the PLC triggered: ``<station>/trigger/<trigger_seq>``."""
    return f"{result.station}/trigger/{result.trigger_seq}"


def find_recipe(
    recipes: Sequence[Recipe], internal_id: str, external_id: str
) -> tuple[Recipe | None, str]:
    """The recipe a PrepareRecipe call names: by InternalId (precedence, OPC 40100-1
    7.5.2.2), else by ExternalId (the bundle's name; refused when several versions have
    it). Returns (the recipe, "") or (None, why not)."""
    if internal_id:
        for recipe in recipes:
            if recipe.id == internal_id:
                return recipe, ""
        return None, f"no installed recipe has the id {internal_id!r}"
    if not external_id:
        return None, "give the recipe's InternalId or ExternalId"
    named = [r for r in recipes if r.name == external_id]
    if not named:
        return None, f"no installed recipe is named {external_id!r}"
    if len(named) > 1:
        ids = ", ".join(r.id for r in named)
        return None, f"{len(named)} recipes are named {external_id!r} ({ids}): give the InternalId"
    return named[0], ""


TRI_FALSE, TRI_TRUE, TRI_DONTCARE = 0, 1, 2


def filter_recipes(recipes: Iterable[Recipe], external_id: str, is_prepared: int) -> list[Recipe]:
    """GetRecipeListFiltered's selection: the recipes named ``external_id`` (all when
    empty) that are (TRUE) or are not (FALSE) prepared, or either (DONTCARE)."""
    out = []
    for recipe in recipes:
        if external_id and recipe.name != external_id:
            continue
        if is_prepared == TRI_TRUE and not recipe.active:
            continue
        if is_prepared == TRI_FALSE and recipe.active:
            continue
        out.append(recipe)
    return out


def page(items: Sequence[object], start: int, max_results: int) -> tuple[list[object], bool]:
    """Items from ``start``, at most ``max_results`` (0: as many as :data:`MAX_LIST`
    allows), and whether that reached the end (IsComplete)."""
    limit = MAX_LIST if max_results <= 0 else min(max_results, MAX_LIST)
    chunk = list(items[start : start + limit])
    return chunk, start + len(chunk) >= len(items)


@dataclass(frozen=True)
class ResultQuery:
    """GetResultListFiltered's criteria (an empty string or None matches anything).

    Attributes:
        result_state: the ResultState wanted, or None for any (OPC 40100 sends 0).
        part_id, meas_id, job_id: the ids wanted.
        recipe_id: the InternalRecipeId.Id wanted (the model's name).
        external_recipe_id: the ExternalRecipeId.Id wanted (the model's name too).
    """

    result_state: int | None = None
    part_id: str = ""
    meas_id: str = ""
    job_id: str = ""
    recipe_id: str = ""
    external_recipe_id: str = ""


@dataclass(frozen=True)
class KeptResult:
    """A result as the server keeps it for the result-management methods.

    Attributes:
        result: the station's result.
        job_id: its JobId (a single job's, or :func:`trigger_job_id`).
        meas_id: the MeasId the single job was started with ("" when the PLC triggered).
    """

    result: StationResult
    job_id: str
    meas_id: str = ""

    @property
    def result_id(self) -> str:
        return result_id(self.result)

    @property
    def result_state(self) -> int:
        return RESULT_STATES.get(self.result.status, RESULT_UNDEFINED)


def matches(kept: KeptResult, query: ResultQuery) -> bool:
    """Whether ``kept`` meets every criterion of ``query``."""
    result = kept.result
    checks = (
        (query.result_state, kept.result_state),
        (query.part_id, result.part_id),
        (query.meas_id, kept.meas_id),
        (query.job_id, kept.job_id),
        (query.recipe_id, result.model_name),
        (query.external_recipe_id, result.model_name),
    )
    return all(want in (None, "") or want == have for want, have in checks)
