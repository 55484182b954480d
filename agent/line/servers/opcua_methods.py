"""The VisionSystems' methods: what each does with the agent, and what it answers.

Every argument comes from a client and is checked here first (count, type, length);
a method the state machine does not allow in the station's state, or that the agent
refuses, answers a Bad status (BadInvalidState, BadNotFound, BadRequestNotAllowed, ...)
and its reason, in words, goes to the station's ``LastRefusal`` variable and the log.
The agent's callbacks (the lead's: trigger a station, list and select recipes, halt or
reset it) run on a small thread pool, each bounded by ``callback_timeout_s``, so the
server's event loop never waits on them.

Who may call is decided before a call reaches here: asyncua applies the server's
permission rules (:mod:`agent.line.servers.opcua_users`) to every Call request, and
anonymous sessions are refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asyncua import ua
from asyncua.common.node import Node
from asyncua.server.server import Server
from asyncua.ua.status_codes import StatusCodes as Codes

from agent.discovery.safetext import one_line
from agent.line.servers import opcua_model as model
from agent.line.servers import vision
from agent.line.servers.opcua_model import MachineVision, StationNodes
from agent.line.servers.vision import KeptResult, Recipe

log = logging.getLogger(__name__)
T = TypeVar("T")

Command = Callable[[str, str], "str | None"]
"""``on_command(station, command)``: ``halt``, ``reset``, ``stop`` or ``abort``; None
when done (the agent then sets the station's new state), else why not."""


class Refusal(Exception):
    """A method call answered with a Bad status and a reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class StationRuntime:
    """What the server knows of one station besides its nodes.

    Attributes:
        nodes: its VisionSystem.
        state: its OPC 40100 state (as the agent last set it).
        kept: its latest results, oldest first (bounded).
        pending_jobs: single jobs started and not yet answered: (JobId, MeasId, when).
    """

    nodes: StationNodes
    state: str = "Preoperational"
    kept: deque[KeptResult] = field(default_factory=deque)
    pending_jobs: deque[tuple[str, str, float]] = field(default_factory=deque)
    jobs_started: int = 0


@dataclass
class Agent:
    """The agent's side of the methods: the lead's callbacks, run off the loop."""

    on_trigger: Callable[[str, str], bool]
    recipes: Callable[[str], list[Recipe]]
    select_recipe: Callable[[str, str], str | None]
    on_command: Command | None
    executor: concurrent.futures.ThreadPoolExecutor
    timeout_s: float
    count: Callable[[str], None]

    async def run(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool, within the timeout.

        Raises:
            Refusal: BadTimeout when it took too long (it runs on, counted), or
                BadInternalError when it raised (logged, counted).
        """
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.executor, lambda: fn(*args))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except asyncio.TimeoutError:
            self.count("callback_timeouts")
            raise Refusal(
                Codes.BadTimeout,
                f"the agent did not answer {what} within {self.timeout_s:g} s",
            ) from None
        except Exception as exc:
            self.count("callback_errors")
            log.exception("OPC UA server: the agent's %s failed", what)
            raise Refusal(Codes.BadInternalError, f"{what} failed: {exc}") from None

    async def recipe_list(self, station: str) -> tuple[Recipe, ...]:
        """The station's recipes, checked: at most :data:`vision.MAX_LIST`, ids unique."""
        found = await self.run("recipes", self.recipes, station)
        recipes = tuple(found)[: vision.MAX_LIST]
        ids = [r.id for r in recipes]
        if len(set(ids)) != len(ids):
            raise Refusal(Codes.BadInternalError, "two installed recipes share an id")
        return recipes


def _refusal(code: int, reason: str) -> Refusal:
    return Refusal(code, reason)


# -- arguments -------------------------------------------------------------------------


def _check_count(args: Sequence[ua.Variant], n: int) -> None:
    if len(args) < n:
        raise _refusal(Codes.BadArgumentsMissing, f"{n} arguments expected, got {len(args)}")
    if len(args) > n:
        raise _refusal(Codes.BadTooManyArguments, f"{n} arguments expected, got {len(args)}")


def _struct_id(args: Sequence[ua.Variant], index: int, name: str, type_name: str) -> str:
    """The ``Id`` of structure argument ``index`` (a ``type_name``, or null: "")."""
    value = args[index].Value
    if isinstance(value, ua.ExtensionObject) and value.TypeId.is_null() and not value.Body:
        value = None  # a null ExtensionObject: asyncua decodes it as an empty one
    if value is None:
        return ""
    if not isinstance(value, getattr(ua, type_name)):
        raise _refusal(Codes.BadTypeMismatch, f"argument {name} is not a {type_name}")
    text = getattr(value, "Id", None) or ""
    if not isinstance(text, str) or len(text) > vision.MAX_ID:
        raise _refusal(
            Codes.BadInvalidArgument,
            f"argument {name}: an id of at most {vision.MAX_ID} characters",
        )
    return text


def _number(args: Sequence[ua.Variant], index: int, name: str, low: int, high: int) -> int:
    value = args[index].Value
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        why = f"argument {name} must be a number in {low}..{high}"
        raise _refusal(Codes.BadInvalidArgument, why)
    return value


def _text(args: Sequence[ua.Variant], index: int, name: str) -> str:
    value = args[index].Value
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 4096:
        raise _refusal(Codes.BadInvalidArgument, f"argument {name} must be text (at most 4096)")
    return value


def _int32(value: int) -> ua.Variant:
    return ua.Variant(value, ua.VariantType.Int32)


def _uint32(value: int) -> ua.Variant:
    return ua.Variant(value, ua.VariantType.UInt32)


def _ext(value: Any) -> ua.Variant:
    return ua.Variant(value, ua.VariantType.ExtensionObject)


OK = _int32(0)
"""OPC 40100's Error output for success."""


# -- the methods -----------------------------------------------------------------------


Args = Sequence[ua.Variant]
Out = list[ua.Variant]
Handler = Callable[[StationRuntime, Args], Awaitable[Out]]


class Methods:
    """Binds each VisionSystem's methods and answers them.

    Attributes:
        calls: method calls answered, refused: Bad answers (both by method name).
    """

    def __init__(
        self,
        server: Server,
        mv: MachineVision,
        agent: Agent,
        count: Callable[[str], None],
        refresh: Callable[[str, tuple[Recipe, ...]], Awaitable[None]],
    ) -> None:
        self.server = server
        self.mv = mv
        self.agent = agent
        self.count = count
        self.refresh = refresh

    def bind(self, runtime: StationRuntime) -> None:
        """Link every method of ``runtime``'s VisionSystem to its handler."""
        handlers: dict[str, Handler] = {
            "Halt": self._command("halt"),
            "Reset": self._command("reset"),
            "Stop": self._command("stop"),
            "Abort": self._command("abort"),
            "StartSingleJob": self.start_single_job,
            "StartContinuous": self.start_continuous,
            "GetRecipeListFiltered": self.get_recipe_list,
            "PrepareRecipe": self.prepare_recipe,
            "UnprepareRecipe": self.unprepare_recipe,
            "GetResultById": self.get_result_by_id,
            "GetResultComponentsById": self.get_result_components,
            "GetResultListFiltered": self.get_result_list,
        }
        for name, handler in handlers.items():
            self._link(runtime, name, runtime.nodes.methods[name], handler)

    async def bind_recipe(self, runtime: StationRuntime, recipe_id: str, node: Node) -> None:
        """Link a RecipeType object's Prepare and Unprepare (made as recipes appear)."""

        async def prepare(rt: StationRuntime, args: Args) -> Out:
            _check_count(args, 0)
            await self._prepare(rt, recipe_id, "")
            return [ua.Variant(True, ua.VariantType.Boolean), OK]

        async def unprepare(rt: StationRuntime, args: Args) -> Out:
            _check_count(args, 0)
            await self._unprepare(rt, recipe_id, "")
            return [OK]

        for name, handler in (("Prepare", prepare), ("Unprepare", unprepare)):
            method = await node.get_child(model.qname(name, self.mv.ns))
            self._link(runtime, f"Recipe {recipe_id}: {name}", method, handler)

    def _link(self, runtime: StationRuntime, name: str, node: Node, handler: Handler) -> None:
        async def call(parent: ua.NodeId, *args: ua.Variant) -> ua.CallMethodResult:
            self.count("method_calls")
            result = ua.CallMethodResult()
            try:
                result.OutputArguments = await handler(runtime, args)
            except Refusal as refusal:
                result.StatusCode = ua.StatusCode(ua.UInt32(refusal.code))
                await self._refused(runtime, name, refusal.reason)
            except Exception:
                log.exception("OPC UA server: %s of %s failed", name, runtime.nodes.name)
                self.count("method_errors")
                result.StatusCode = ua.StatusCode(ua.UInt32(Codes.BadInternalError))
            return result

        self.server.link_method(node, call)

    async def _refused(self, runtime: StationRuntime, method: str, reason: str) -> None:
        self.count("method_refused")
        text = one_line(f"{method}: {reason}", 1024)  # may quote a client's id
        log.info("OPC UA server: %s refused at %s", text, runtime.nodes.name)
        await runtime.nodes.refusal.write_value(text, ua.VariantType.String)

    def _gate(self, runtime: StationRuntime, method: str) -> None:
        why = vision.state_refusal(method, runtime.state)
        if why:
            raise _refusal(Codes.BadInvalidState, why)

    # state machine

    def _command(self, command: str) -> Handler:
        method = command.capitalize()

        async def handle(runtime: StationRuntime, args: Args) -> Out:
            _check_count(args, 2)
            _number(args, 0, "Cause", -(2**31), 2**31 - 1)
            _text(args, 1, "CauseDescription")
            self._gate(runtime, method)
            if self.agent.on_command is None:
                raise _refusal(Codes.BadNotSupported, f"the agent takes no {method} over OPC UA")
            why = await self.agent.run(command, self.agent.on_command, runtime.nodes.name, command)
            if why:
                raise _refusal(Codes.BadRequestNotAllowed, str(why)[:512])
            return [OK]

        return handle

    async def start_single_job(self, runtime: StationRuntime, args: Args) -> Out:
        _check_count(args, 5)
        meas_id = _struct_id(args, 0, "MeasId", "MeasIdDataType")
        part_id = _struct_id(args, 1, "PartId", "PartIdDataType")
        recipe_id = _struct_id(args, 2, "RecipeId", "RecipeIdExternalDataType")
        _struct_id(args, 3, "ProductId", "ProductIdDataType")
        self._gate(runtime, "StartSingleJob")
        if recipe_id:
            active = [r for r in runtime.nodes.recipes if r.active]
            if not any(recipe_id in (r.name, r.id) for r in active):
                raise _refusal(
                    Codes.BadInvalidState,
                    f"recipe {recipe_id!r} is not the prepared one: call PrepareRecipe first",
                )
        station = runtime.nodes.name
        if not await self.agent.run("trigger", self.agent.on_trigger, station, part_id):
            raise _refusal(
                Codes.BadInvalidState,
                "the station did not take the trigger (busy, or not running)",
            )
        runtime.jobs_started += 1
        job_id = f"{station}/job/{runtime.jobs_started}"
        runtime.pending_jobs.append((job_id, meas_id, time.time()))
        while len(runtime.pending_jobs) > vision.MAX_LIST:
            runtime.pending_jobs.popleft()
        return [_ext(model.mk("JobIdDataType", Id=job_id)), OK]

    async def start_continuous(self, runtime: StationRuntime, args: Args) -> Out:
        raise _refusal(
            Codes.BadNotSupported, "the station inspects on triggers: use StartSingleJob"
        )

    # recipes

    async def _recipes(self, runtime: StationRuntime) -> tuple[Recipe, ...]:
        recipes = await self.agent.recipe_list(runtime.nodes.name)
        await self.refresh(runtime.nodes.name, recipes)
        return recipes

    async def _prepare(self, runtime: StationRuntime, internal_id: str, external_id: str) -> Recipe:
        self._gate(runtime, "PrepareRecipe")
        recipes = await self._recipes(runtime)
        recipe, why = vision.find_recipe(recipes, internal_id, external_id)
        if recipe is None:
            raise _refusal(Codes.BadNotFound, why)
        if recipe.active:
            return recipe
        refused = await self.agent.run(
            "select recipe", self.agent.select_recipe, runtime.nodes.name, recipe.id
        )
        if refused:
            raise _refusal(Codes.BadRequestNotAllowed, str(refused)[:512])
        await self._recipes(runtime)
        return recipe

    async def _unprepare(
        self, runtime: StationRuntime, internal_id: str, external_id: str
    ) -> Recipe:
        recipes = await self._recipes(runtime)
        recipe, why = vision.find_recipe(recipes, internal_id, external_id)
        if recipe is None:
            raise _refusal(Codes.BadNotFound, why)
        if not recipe.active:
            raise _refusal(Codes.BadInvalidState, f"recipe {recipe.id!r} is not prepared")
        raise _refusal(
            Codes.BadNotSupported,
            "the station always decides with one prepared recipe: prepare another instead",
        )

    async def prepare_recipe(self, runtime: StationRuntime, args: Args) -> Out:
        _check_count(args, 2)
        external_id = _struct_id(args, 0, "ExternalId", "RecipeIdExternalDataType")
        internal_id = _struct_id(args, 1, "InternalIdIn", "RecipeIdInternalDataType")
        recipe = await self._prepare(runtime, internal_id, external_id)
        return [
            _ext(model.recipe_internal_id(recipe)),
            ua.Variant(True, ua.VariantType.Boolean),
            OK,
        ]

    async def unprepare_recipe(self, runtime: StationRuntime, args: Args) -> Out:
        _check_count(args, 2)
        external_id = _struct_id(args, 0, "ExternalId", "RecipeIdExternalDataType")
        internal_id = _struct_id(args, 1, "InternalIdIn", "RecipeIdInternalDataType")
        await self._unprepare(runtime, internal_id, external_id)
        return [OK]

    async def get_recipe_list(self, runtime: StationRuntime, args: Args) -> Out:
        _check_count(args, 6)
        external_id = _struct_id(args, 0, "ExternalId", "RecipeIdExternalDataType")
        product_id = _struct_id(args, 1, "ProductId", "ProductIdDataType")
        is_prepared = _number(args, 2, "IsPrepared", 0, 2)
        max_results = _number(args, 3, "MaxResults", 0, 2**32 - 1)
        start = _number(args, 4, "StartIndex", 0, 2**32 - 1)
        _number(args, 5, "Timeout", -(2**31), 2**31 - 1)
        recipes = await self._recipes(runtime)
        selected = [] if product_id else vision.filter_recipes(recipes, external_id, is_prepared)
        chunk, complete = vision.page(selected, start, max_results)
        found = [model.recipe_internal_id(r) for r in chunk if isinstance(r, Recipe)]
        return [
            ua.Variant(complete, ua.VariantType.Boolean),
            _uint32(len(selected)),
            _uint32(0),
            ua.Variant(found, ua.VariantType.ExtensionObject, is_array=True),
            OK,
        ]

    # results

    def _kept(self, runtime: StationRuntime, args: Sequence[ua.Variant]) -> KeptResult:
        _check_count(args, 2)
        wanted = _struct_id(args, 0, "ResultId", "ResultIdDataType")
        _number(args, 1, "Timeout", -(2**31), 2**31 - 1)
        for kept in reversed(runtime.kept):
            if kept.result_id == wanted:
                return kept
        raise _refusal(Codes.BadNotFound, f"no kept result has the id {wanted!r}")

    async def get_result_by_id(self, runtime: StationRuntime, args: Args) -> Out:
        kept = self._kept(runtime, args)
        return [_uint32(0), _ext(model.result_data(kept, self.mv, runtime.nodes.name)), OK]

    async def get_result_components(self, runtime: StationRuntime, args: Args) -> Out:
        data = model.result_data(self._kept(runtime, args), self.mv, runtime.nodes.name)
        boolean, ext = ua.VariantType.Boolean, ua.VariantType.ExtensionObject
        return [
            ua.Variant(False, boolean),  # HasTransferableDataOnFile
            _uint32(0),  # ResultHandle
            ua.Variant(data.IsPartial, boolean),
            ua.Variant(data.IsSimulated, boolean),
            _int32(data.ResultState),
            ua.Variant(data.MeasId, ext),
            ua.Variant(data.PartId, ext),
            ua.Variant(data.ExternalRecipeId, ext),
            ua.Variant(data.InternalRecipeId, ext),
            ua.Variant(None, ext),  # ProductId
            ua.Variant(None, ext),  # ExternalConfigurationId
            ua.Variant(data.InternalConfigurationId, ext),
            ua.Variant(data.JobId, ext),
            ua.Variant(data.CreationTime, ua.VariantType.DateTime),
            ua.Variant(None, ext),  # ProcessingTimes
            ua.Variant(data.ResultContent, ua.VariantType.Variant, is_array=True),
            OK,
        ]

    async def get_result_list(self, runtime: StationRuntime, args: Args) -> Out:
        _check_count(args, 12)
        state = _number(args, 0, "ResultState", -(2**31), 2**31 - 1)
        query = vision.ResultQuery(
            result_state=state or None,
            meas_id=_struct_id(args, 1, "MeasId", "MeasIdDataType"),
            part_id=_struct_id(args, 2, "PartId", "PartIdDataType"),
            external_recipe_id=_struct_id(args, 3, "ExternalRecipeId", "RecipeIdExternalDataType"),
            recipe_id=_struct_id(args, 4, "InternalRecipeId", "RecipeIdInternalDataType"),
            job_id=_struct_id(args, 8, "JobId", "JobIdDataType"),
        )
        _struct_id(args, 5, "ExternalConfigurationId", "ConfigurationIdDataType")
        _struct_id(args, 6, "InternalConfigurationId", "ConfigurationIdDataType")
        product_id = _struct_id(args, 7, "ProductId", "ProductIdDataType")
        max_results = _number(args, 9, "MaxResults", 0, 2**32 - 1)
        start = _number(args, 10, "StartIndex", 0, 2**32 - 1)
        _number(args, 11, "Timeout", -(2**31), 2**31 - 1)
        selected = (
            [] if product_id else [k for k in reversed(runtime.kept) if vision.matches(k, query)]
        )
        chunk, complete = vision.page(selected, start, max_results)
        found = [
            model.result_data(k, self.mv, runtime.nodes.name)
            for k in chunk
            if isinstance(k, KeptResult)
        ]
        return [
            ua.Variant(complete, ua.VariantType.Boolean),
            _uint32(len(selected)),
            _uint32(0),
            ua.Variant(found, ua.VariantType.ExtensionObject, is_array=True),
            OK,
        ]
