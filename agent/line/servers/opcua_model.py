"""The OPC 40100 address space of the agent's OPC UA server: the MachineVision node set
loaded, and one ``VisionSystemType`` object per station under the Objects folder.

Each station's VisionSystem (BrowseName: the station's name, in the server's own
namespace; string NodeIds ``<station>.<path>``) holds what OPC 40100-1 makes mandatory,
and the optional parts an inspection station has:

- ``VisionStateMachine`` (mandatory) with ``CurrentState``, ``Halt``, ``Reset``, and its
  ``AutomaticModeStateMachine`` (``StartSingleJob``, ``StartContinuous``, ``Stop``,
  ``Abort``; the sub-states Initialized, Ready, SingleExecution, ContinuousExecution);
- ``SystemState``: the SEMI E10 state;
- ``RecipeManagement`` (``GetRecipeListFiltered``, ``PrepareRecipe``,
  ``UnprepareRecipe``) with ``Recipes``: one ``RecipeType`` object per installed bundle;
- ``ResultManagement`` (``GetResultById``, ``GetResultComponentsById``,
  ``GetResultListFiltered``) with ``Results/LatestResult``, a ``ResultType`` variable;
- ``LastRefusal`` (the server's own): why the last method call was refused, in words.

ResultReadyEventType events are emitted from the VisionSystem (and, for clients that
watch the Server object, from it too, with the VisionSystem as SourceNode).

This module builds and writes nodes; what the values mean is in
:mod:`agent.line.servers.vision`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from asyncua import ua
from asyncua.common.instantiate_util import instantiate
from asyncua.common.node import Node
from asyncua.server.event_generator import EventGenerator
from asyncua.server.server import Server
from asyncua.ua.attribute_ids import AttributeIds
from asyncua.ua.object_ids import ObjectIds
from asyncua.ua.uaerrors import UaError

from agent.kernel.errors import ConfigError
from agent.line.results import StationResult
from agent.line.servers import vision
from agent.line.servers.vision import KeptResult, Recipe

MV_URI = "http://opcfoundation.org/UA/MachineVision"
NODESET_FILE = "Opc.Ua.MachineVision.NodeSet2.xml"

# OPC 40100-1's NodeIds in the MachineVision namespace (the node set's, fixed by the
# specification); each is checked against its BrowseName when the node set loads.
MV_IDS: dict[str, int] = {
    "VisionSystemType": 1003,
    "VisionStateMachineType": 1017,
    "VisionAutomaticModeStateMachineType": 1021,
    "RecipeManagementType": 1004,
    "RecipeFolderType": 1008,
    "RecipeType": 1002,
    "ResultManagementType": 1007,
    "ResultFolderType": 1016,
    "ResultType": 2002,
    "ResultReadyEventType": 1024,
    "BinaryIdBaseDataType": 3019,
    "RecipeIdExternalDataType": 3002,
    "RecipeIdInternalDataType": 3013,
    "ConfigurationIdDataType": 3008,
    "ResultDataType": 3006,
    "ResultIdDataType": 3021,
    "JobIdDataType": 3016,
    "PartIdDataType": 3004,
    "MeasIdDataType": 3015,
    "ProductIdDataType": 3003,
    "ProcessingTimesDataType": 3005,
    "SystemStateDescriptionDataType": 3024,
    "ResultStateDataType": 3009,
}
SUBTYPES_OF_BINARY_ID = (
    "RecipeIdExternalDataType",
    "RecipeIdInternalDataType",
    "ConfigurationIdDataType",
)
"""Structures that add no field to BinaryIdBaseDataType; asyncua makes them one class
with the base's encoding, so each gets a class of its own here (a client's
RecipeIdInternalDataType argument is decoded, and ours carry their own type)."""


def nodeset_path() -> Path:
    """Where the MachineVision node set is installed (``make nodesets`` puts it there)."""
    return Path(__file__).resolve().parent / "nodesets" / NODESET_FILE


def check_nodeset(path: Path | None = None) -> Path:
    """The node set's path.

    Raises:
        ConfigError: the file is not there.
    """
    path = path or nodeset_path()
    if not path.is_file():
        raise ConfigError(
            str(path), "opcua_server", "the OPC 40100 node set is missing: run make models"
        )
    return path


def nid(identifier: int | str, ns: int) -> ua.NodeId:
    """A NodeId (asyncua's typed constructor)."""
    if isinstance(identifier, int):
        return ua.NodeId(ua.Int32(identifier), ua.Int16(ns))
    return ua.NodeId(ua.String(identifier), ua.Int16(ns))


def qname(name: str, ns: int) -> ua.QualifiedName:
    return ua.QualifiedName(ua.String(name), ua.Int16(ns))


def mk(type_name: str, **fields: Any) -> Any:
    """An instance of a structure the node set defines (asyncua makes the classes as
    the node set loads, so they are looked up by name)."""
    return getattr(ua, type_name)(**fields)


def utc(unix_s: float) -> datetime:
    return datetime.fromtimestamp(unix_s, tz=timezone.utc)


def variant(value: Any, vtype: ua.VariantType = ua.VariantType.ExtensionObject) -> ua.Variant:
    return ua.Variant(value, vtype)


@dataclass
class MachineVision:
    """The loaded node set: its namespace index, the types, the state objects."""

    ns: int
    own: int
    types: dict[str, Node]
    state_ids: dict[str, ua.NodeId]
    """Each state's StateType object in the state machine types (CurrentState.Id)."""

    def dt(self, name: str) -> ua.NodeId:
        return nid(MV_IDS[name], self.ns)


async def load(server: Server, path: Path, namespace_uri: str) -> MachineVision:
    """Import the node set, make its structure classes, and register our namespace.

    Raises:
        ConfigError: the node set is not the OPC 40100 one this code knows.
    """
    await server.import_xml(str(path))
    ns = await server.get_namespace_index(MV_URI)
    await server.load_data_type_definitions()
    types = {}
    for name, number in MV_IDS.items():
        node = server.get_node(nid(number, ns))
        try:
            browse_name = (await node.read_browse_name()).Name
        except UaError:
            browse_name = None
        if browse_name != name:
            raise ConfigError(str(path), "", f"no {name} at ns={ns};i={number}: not OPC 40100")
        types[name] = node
    for name in SUBTYPES_OF_BINARY_ID:
        await _own_class(types[name], name, getattr(ua, "BinaryIdBaseDataType"))  # noqa: B009
    state_ids = {}
    for machine, states in (
        ("VisionStateMachineType", (*vision.TOP_STATES, vision.OPERATIONAL)),
        ("VisionAutomaticModeStateMachineType", vision.AUTO_STATES),
    ):
        for state in states:
            state_ids[state] = (await types[machine].get_child(qname(state, ns))).nodeid
    own = await server.register_namespace(namespace_uri)
    return MachineVision(ns, own, types, state_ids)


async def _own_class(datatype: Node, name: str, base: type) -> None:
    encodings = await datatype.get_referenced_nodes(refs=ObjectIds.HasEncoding)
    for encoding in encodings:
        if (await encoding.read_browse_name()).Name == "Default Binary":
            cls = dataclasses.make_dataclass(name, [], bases=(base,), slots=True)
            cls.data_type = datatype.nodeid  # type: ignore[attr-defined]
            if hasattr(ua, name):  # asyncua bound the name to the base class: rebind it
                delattr(ua, name)
            ua.register_extension_object(name, encoding.nodeid, cls, datatype.nodeid)
            return
    raise ConfigError(NODESET_FILE, "", f"{name} has no binary encoding")


@dataclass
class StationNodes:
    """One station's VisionSystem and the nodes the server writes or binds."""

    name: str
    system: Node
    state: Node
    state_id: Node
    auto_state: Node
    auto_state_id: Node
    system_state: Node
    latest: Node
    latest_parts: dict[str, Node]
    recipes_folder: Node
    refusal: Node
    methods: dict[str, Node]
    events: list[EventGenerator] = field(default_factory=list)
    recipe_nodes: dict[str, Node] = field(default_factory=dict)
    recipes: tuple[Recipe, ...] = ()


METHOD_PATHS: dict[str, tuple[str, ...]] = {
    "Halt": ("VisionStateMachine", "Halt"),
    "Reset": ("VisionStateMachine", "Reset"),
    "StartSingleJob": ("VisionStateMachine", "AutomaticModeStateMachine", "StartSingleJob"),
    "StartContinuous": ("VisionStateMachine", "AutomaticModeStateMachine", "StartContinuous"),
    "Stop": ("VisionStateMachine", "AutomaticModeStateMachine", "Stop"),
    "Abort": ("VisionStateMachine", "AutomaticModeStateMachine", "Abort"),
    "GetRecipeListFiltered": ("RecipeManagement", "GetRecipeListFiltered"),
    "PrepareRecipe": ("RecipeManagement", "PrepareRecipe"),
    "UnprepareRecipe": ("RecipeManagement", "UnprepareRecipe"),
    "GetResultById": ("ResultManagement", "GetResultById"),
    "GetResultComponentsById": ("ResultManagement", "GetResultComponentsById"),
    "GetResultListFiltered": ("ResultManagement", "GetResultListFiltered"),
}
"""Every method of a VisionSystem the server answers, by its path from the system."""

LATEST_PARTS: tuple[str, ...] = ("ResultId", "IsPartial", "ResultState", "JobId")
LATEST_PARTS += ("CreationTime", "InternalRecipeId", "InternalConfigurationId")


async def add_station(server: Server, mv: MachineVision, station: str) -> StationNodes:
    """The VisionSystem of ``station`` under the Objects folder."""
    ns, own = mv.ns, mv.own
    objects = server.nodes.objects
    system = await objects.add_object(
        nid(station, own), qname(station, own), mv.types["VisionSystemType"].nodeid, False
    )
    vsm = await system.get_child(qname("VisionStateMachine", ns))
    auto = await vsm.add_object(
        nid(f"{station}.VisionStateMachine.AutomaticModeStateMachine", own),
        qname("AutomaticModeStateMachine", ns),
        mv.types["VisionAutomaticModeStateMachineType"].nodeid,
        False,
    )
    state = await vsm.get_child(qname("CurrentState", 0))
    auto_state = await auto.get_child(qname("CurrentState", 0))
    system_state = await system.add_variable(
        nid(f"{station}.SystemState", own),
        qname("SystemState", ns),
        None,
        datatype=mv.dt("SystemStateDescriptionDataType"),
    )
    recipe_mgmt = await system.add_object(
        nid(f"{station}.RecipeManagement", own),
        qname("RecipeManagement", ns),
        mv.types["RecipeManagementType"].nodeid,
        False,
    )
    recipes_folder = await recipe_mgmt.add_object(
        nid(f"{station}.RecipeManagement.Recipes", own),
        qname("Recipes", ns),
        mv.types["RecipeFolderType"].nodeid,
        False,
    )
    result_mgmt = await system.add_object(
        nid(f"{station}.ResultManagement", own),
        qname("ResultManagement", ns),
        mv.types["ResultManagementType"].nodeid,
        False,
    )
    results = await result_mgmt.add_object(
        nid(f"{station}.ResultManagement.Results", own),
        qname("Results", ns),
        mv.types["ResultFolderType"].nodeid,
        False,
    )
    with _quiet_copy():
        (latest, *_) = await instantiate(
            results,
            mv.types["ResultType"],
            nodeid=nid(f"{station}.ResultManagement.Results.LatestResult", own),
            bname=qname("LatestResult", own),
            instantiate_optional=False,
        )
    parts = {name: await latest.get_child(qname(name, ns)) for name in LATEST_PARTS}
    for name, dtype in (("PartId", "PartIdDataType"), ("MeasId", "MeasIdDataType")):
        parts[name] = await latest.add_variable(
            nid(f"{station}.ResultManagement.Results.LatestResult.{name}", own),
            qname(name, ns),
            None,
            datatype=mv.dt(dtype),
        )
    parts["ResultContent"] = await latest.add_variable(
        nid(f"{station}.ResultManagement.Results.LatestResult.ResultContent", own),
        qname("ResultContent", ns),
        ua.Variant([], ua.VariantType.ExtensionObject, is_array=True),
        datatype=ua.NodeId(ua.Int32(ObjectIds.KeyValuePair)),
    )
    await parts["ResultContent"].write_value_rank(ua.ValueRank.OneDimension)
    refusal = await system.add_variable(
        nid(f"{station}.LastRefusal", own), qname("LastRefusal", own), ""
    )
    await refusal.write_attribute(
        AttributeIds.Description,
        ua.DataValue(
            ua.Variant(
                ua.LocalizedText("Why the last method call was refused (empty: none was)."),
            )
        ),
    )
    methods = {}
    for name, path in METHOD_PATHS.items():
        methods[name] = await system.get_child([qname(p, ns) for p in path])
    nodes = StationNodes(
        name=station,
        system=system,
        state=state,
        state_id=await state.get_child(qname("Id", 0)),
        auto_state=auto_state,
        auto_state_id=await auto_state.get_child(qname("Id", 0)),
        system_state=system_state,
        latest=latest,
        latest_parts=parts,
        recipes_folder=recipes_folder,
        refusal=refusal,
        methods=methods,
    )
    etype = mv.types["ResultReadyEventType"]
    from_system = await server.get_event_generator(etype, system.nodeid)
    from_server = await server.get_event_generator(etype, ObjectIds.Server)
    for generator in (from_system, from_server):
        _typed_event_fields(generator)
        generator.event.SourceNode = system.nodeid
        generator.event.SourceName = station
    nodes.events = [from_system, from_server]
    await write_latest(nodes, mv, None)
    return nodes


class _NoTypeAttributes(logging.Filter):
    """Drops asyncua's warnings that a VariableType has no AccessLevel (and the like)
    while a variable is made from it: true of every VariableType, so noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "while copying attributes from node type" not in record.getMessage()


@contextlib.contextmanager
def _quiet_copy() -> Iterator[None]:
    logger = logging.getLogger("asyncua.common.copy_node_util")
    quiet = _NoTypeAttributes()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


EVENT_FIELDS: dict[str, ua.VariantType] = {
    "ResultId": ua.VariantType.ExtensionObject,
    "IsPartial": ua.VariantType.Boolean,
    "IsSimulated": ua.VariantType.Boolean,
    "ResultState": ua.VariantType.Int32,
    "JobId": ua.VariantType.ExtensionObject,
    "CreationTime": ua.VariantType.DateTime,
    "InternalRecipeId": ua.VariantType.ExtensionObject,
    "ExternalRecipeId": ua.VariantType.ExtensionObject,
    "InternalConfigurationId": ua.VariantType.ExtensionObject,
    "PartId": ua.VariantType.ExtensionObject,
    "MeasId": ua.VariantType.ExtensionObject,
    "ProcessingTimes": ua.VariantType.ExtensionObject,
    "ResultContent": ua.VariantType.Variant,
}
"""The ResultReadyEventType fields the server fills, with their variant types."""


def _typed_event_fields(generator: EventGenerator) -> None:
    for name, vtype in EVENT_FIELDS.items():
        generator.event.add_property(name, None, vtype)


def result_data(kept: KeptResult | None, mv: MachineVision, station: str) -> Any:
    """The ResultDataType of a kept result (None: the initial, Undefined one)."""
    if kept is None:
        return mk(
            "ResultDataType",
            ResultId=mk("ResultIdDataType", Id=""),
            IsPartial=False,
            ResultState=vision.RESULT_UNDEFINED,
            InternalRecipeId=mk("RecipeIdInternalDataType", Id=""),
            InternalConfigurationId=mk("ConfigurationIdDataType", Id=station),
            JobId=mk("JobIdDataType", Id=""),
            CreationTime=datetime.fromtimestamp(0, tz=timezone.utc),
        )
    result = kept.result
    return mk(
        "ResultDataType",
        ResultId=mk("ResultIdDataType", Id=kept.result_id),
        IsPartial=False,
        IsSimulated=False,
        ResultState=kept.result_state,
        MeasId=mk("MeasIdDataType", Id=kept.meas_id) if kept.meas_id else None,
        PartId=mk("PartIdDataType", Id=result.part_id) if result.part_id else None,
        InternalRecipeId=recipe_id_of(result),
        ExternalRecipeId=mk("RecipeIdExternalDataType", Id=result.model_name)
        if result.model_name
        else None,
        InternalConfigurationId=mk("ConfigurationIdDataType", Id=station),
        JobId=mk("JobIdDataType", Id=kept.job_id),
        CreationTime=utc(result.wall_time),
        ResultContent=[variant(kv) for kv in content(result)],
    )


def recipe_id_of(result: StationResult) -> Any:
    """The InternalRecipeId of the model that decided (empty for a fail-safe result)."""
    return mk(
        "RecipeIdInternalDataType",
        Id=result.model_name,
        Version=result.model_version or None,
    )


def content(result: StationResult) -> list[Any]:
    """The result's own values as ResultContent: KeyValuePairs (the key names the value)."""
    values: list[tuple[str, Any, ua.VariantType]] = [
        ("DecisionId", result.decision_id, ua.VariantType.String),
        ("Station", result.station, ua.VariantType.String),
        ("Outcome", result.outcome, ua.VariantType.String),
        ("OutcomeCode", result.outcome_code, ua.VariantType.Int32),
        ("Status", result.status, ua.VariantType.String),
        ("StatusCode", result.status_code, ua.VariantType.Int32),
        ("Score", result.score, ua.VariantType.Double),
        ("Label", result.label, ua.VariantType.String),
        ("ModelName", result.model_name, ua.VariantType.String),
        ("ModelVersion", result.model_version, ua.VariantType.String),
        ("Seq", result.seq, ua.VariantType.Int64),
        ("TriggerSeq", result.trigger_seq, ua.VariantType.Int64),
        ("TriggerToResultMs", result.trigger_to_result_ms, ua.VariantType.Double),
    ]
    return [
        ua.KeyValuePair(Key=ua.QualifiedName(ua.String(key)), Value=ua.Variant(value, vtype))
        for key, value, vtype in values
    ]


async def write_latest(nodes: StationNodes, mv: MachineVision, kept: KeptResult | None) -> Any:
    """Write the LatestResult variable and its components; returns the ResultDataType."""
    data = result_data(kept, mv, nodes.name)
    await nodes.latest.write_value(variant(data))
    parts = nodes.latest_parts
    for name in LATEST_PARTS:
        value = getattr(data, name)
        vtype = EVENT_FIELDS[name]
        await parts[name].write_value(ua.Variant(value, vtype))
    for name in ("PartId", "MeasId"):
        value = getattr(data, name)
        await parts[name].write_value(ua.Variant(value, ua.VariantType.ExtensionObject))
    pairs = [v.Value for v in data.ResultContent or []]
    await parts["ResultContent"].write_value(
        ua.Variant(pairs, ua.VariantType.ExtensionObject, is_array=True)
    )
    return data


async def emit_result(nodes: StationNodes, data: Any, result: StationResult) -> None:
    """One ResultReadyEventType event per result, from the VisionSystem and the Server."""
    for generator in nodes.events:
        event = generator.event
        for name in EVENT_FIELDS:
            setattr(event, name, getattr(data, name, None))
        event.Severity = 100 if result.status == "ok" else 500
        await generator.trigger(
            time_attr=utc(result.wall_time),
            message=f"{result.station}: result {data.ResultId.Id} ({result.outcome})",
        )


async def write_state(nodes: StationNodes, mv: MachineVision, state: str) -> None:
    """Show ``state`` (one of :data:`vision.STATES`) on the state machines and SystemState.

    Raises:
        ValueError: ``state`` is not one of them.
    """
    top, auto = vision.split_state(state)
    await nodes.state.write_value(ua.LocalizedText(top))
    await nodes.state_id.write_value(mv.state_ids[top])
    await nodes.auto_state.write_value(ua.LocalizedText(auto) if auto else ua.LocalizedText())
    await nodes.auto_state_id.write_value(
        mv.state_ids[auto] if auto else ua.NodeId(), ua.VariantType.NodeId
    )
    e10, text = vision.SEMI_E10[state]
    await nodes.system_state.write_value(
        variant(mk("SystemStateDescriptionDataType", State=e10, StateDescription=text))
    )


def recipe_internal_id(recipe: Recipe) -> Any:
    digest, algorithm = vision.digest_bytes(recipe.digest)
    return mk(
        "RecipeIdInternalDataType",
        Id=recipe.id,
        Version=recipe.version,
        Hash=digest,
        HashAlgorithm=algorithm or None,
        Description=ua.LocalizedText(recipe.name),
    )


def recipe_external_id(recipe: Recipe) -> Any:
    return mk("RecipeIdExternalDataType", Id=recipe.name, Version=recipe.version)


async def show_recipes(
    server: Server,
    nodes: StationNodes,
    mv: MachineVision,
    recipes: tuple[Recipe, ...],
    on_new: Callable[[str, Node], Awaitable[None]],
) -> None:
    """Make the Recipes folder show ``recipes``: a RecipeType object per recipe (its
    BrowseName the recipe's id), with InternalId, ExternalId, IsPrepared (the active
    one) and LastModified (when this server first saw it). ``on_new(recipe id, node)``
    is told of each object made (to bind its Prepare and Unprepare methods)."""
    if recipes == nodes.recipes:
        return
    wanted = {r.id: r for r in recipes}
    for rid in [r for r in nodes.recipe_nodes if r not in wanted]:
        await server.delete_nodes([nodes.recipe_nodes.pop(rid)], recursive=True)
    now = datetime.now(timezone.utc)
    for recipe in recipes:
        node = nodes.recipe_nodes.get(recipe.id)
        if node is None:
            node = await nodes.recipes_folder.add_object(
                nid(f"{nodes.name}.RecipeManagement.Recipes.{recipe.id}", mv.own),
                qname(recipe.id, mv.own),
                mv.types["RecipeType"].nodeid,
                False,
            )
            await (await node.get_child(qname("LastModified", mv.ns))).write_value(
                now, ua.VariantType.DateTime
            )
            external = await node.add_property(
                nid(f"{nodes.name}.RecipeManagement.Recipes.{recipe.id}.ExternalId", mv.own),
                qname("ExternalId", mv.ns),
                None,
                datatype=mv.dt("RecipeIdExternalDataType"),
            )
            await external.write_value(variant(recipe_external_id(recipe)))
            nodes.recipe_nodes[recipe.id] = node
            await on_new(recipe.id, node)
        await (await node.get_child(qname("InternalId", mv.ns))).write_value(
            variant(recipe_internal_id(recipe))
        )
        await (await node.get_child(qname("IsPrepared", mv.ns))).write_value(
            recipe.active, ua.VariantType.Boolean
        )
    nodes.recipes = recipes
