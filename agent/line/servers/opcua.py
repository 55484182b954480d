"""The agent as an OPC UA server (OPC 40100, OPC UA for Machine Vision): one
VisionSystem per station, for PLCs and SCADA that read results, watch states, start a
single job or select a recipe.

:class:`VisionServer` is the shell: asyncua's ``Server`` on one asyncio event loop in a
thread of its own. The stations' side never waits on it: :meth:`VisionServer.on_result`
and :meth:`VisionServer.set_state` put an item on a bounded queue the loop drains (a full
queue drops the item and counts it). The agent's side of the methods (a trigger, the
recipes, selecting one, halt and reset) are the callbacks it is built with, run on a
small thread pool with a timeout. What the address space holds:
:mod:`agent.line.servers.opcua_model`; the methods: :mod:`agent.line.servers.opcua_methods`;
who may do what: :mod:`agent.line.servers.opcua_users`; the rules without OPC UA:
:mod:`agent.line.servers.vision`. Why and how: docs/adr/0022-opc-ua-machine-vision-server.md.

asyncua is imported when the server starts, not with this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.kernel.errors import ConfigError
from agent.kernel.secrets import read_secret
from agent.line.drivers.base import AsyncRunner
from agent.line.errors import LineError
from agent.line.results import StationResult
from agent.line.servers.config import OpcUaServerConfig
from agent.line.servers.vision import STATES, Recipe

if TYPE_CHECKING:
    from asyncua.common.node import Node
    from asyncua.server.server import Server

    from agent.line.servers.opcua_methods import Agent, Methods, StationRuntime
    from agent.line.servers.opcua_model import MachineVision
    from agent.line.servers.opcua_users import PasswordCheck, Users

__all__ = ["Recipe", "VisionServer"]

log = logging.getLogger(__name__)
LINK = "opcua_server"
"""The name LineErrors of this server carry."""
CALLBACK_THREADS = 2
PENDING_JOB_S = 60.0
"""A single job not answered within this long gives its JobId to no later result."""

COUNTERS = (
    "results_published",  # LatestResult written and ResultReady emitted
    "states_set",
    "queue_full",  # results or states dropped: the queue was full
    "unknown_station",  # a result of a station the server does not serve
    "apply_errors",  # a result or state that could not be written (logged)
    "method_calls",
    "method_refused",  # answered with a Bad status and a reason (LastRefusal)
    "method_errors",  # a method that failed unexpectedly (BadInternalError, logged)
    "callback_timeouts",  # the agent's callback did not answer in callback_timeout_s
    "callback_errors",  # the agent's callback raised (logged)
    "recipe_refreshes",
)


START_TIMEOUT_S = 30.0
"""How long the server may take to load the node set and listen: about half a second
here, but the import is CPU-bound Python and a device busy starting its pipelines (or a
loaded test machine) can take many times that."""


class VisionServer:
    """The OPC UA server of one agent's stations.

    Args:
        config: ``[opcua_server]``.
        stations: the stations' names (each gets a VisionSystem of that BrowseName).
        on_trigger: StartSingleJob: trigger ``station`` once with the job's part id (""
            when none); True when it took it.
        recipes: the installed, verified bundles ``station`` may decide with.
        select_recipe: PrepareRecipe: make ``recipe id`` active at ``station``; None when
            done, else why not (a Bad answer carries it).
        on_command: Halt, Reset, Stop, Abort: ``(station, "halt" | "reset" | "stop" |
            "abort")``; None when done, else why not. Without it those methods answer
            BadNotSupported. After one is done the agent sets the new state.

    Raises:
        ConfigError: the station names can't all be served (empty, repeated, or one is
            another's name followed by ".", which would clash in NodeIds).
    """

    def __init__(
        self,
        config: OpcUaServerConfig,
        stations: list[str],
        *,
        on_trigger: Callable[[str, str], bool],
        recipes: Callable[[str], list[Recipe]],
        select_recipe: Callable[[str, str], str | None],
        on_command: Callable[[str, str], str | None] | None = None,
    ) -> None:
        names = list(stations)
        if len(set(names)) != len(names) or any(not n for n in names):
            raise ConfigError("", "opcua_server", f"station names must be unique: {names}")
        for name in names:
            for other in names:
                if other.startswith(name + "."):
                    raise ConfigError(
                        "", "opcua_server", f"stations {name!r} and {other!r} clash in NodeIds"
                    )
        self.config = config
        self.stations = names
        self._on_trigger = on_trigger
        self._recipes = recipes
        self._select_recipe = select_recipe
        self._on_command = on_command
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._pending: deque[tuple[str, Any, Any]] = deque()
        self._runner: AsyncRunner | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._server: Server | None = None
        self._mv: MachineVision | None = None
        self._methods: Methods | None = None
        self._runtimes: dict[str, StationRuntime] = {}
        self._check: PasswordCheck | None = None
        self._users: Users | None = None
        host = f"[{config.host}]" if ":" in config.host and "[" not in config.host else config.host
        self.endpoint = f"opc.tcp://{host}:{config.port}/"
        """The endpoint URL clients connect to."""

    # -- the stations' side: returns at once ---------------------------------------------

    def on_result(self, result: StationResult) -> None:
        """Publish ``result`` (LatestResult, a ResultReady event); returns at once."""
        self._offer(("result", result, None))

    def set_state(self, station: str, state: str) -> None:
        """Show ``station``'s OPC 40100 state (one of :data:`vision.STATES`); returns at
        once.

        Raises:
            ValueError: an unknown station or state (a wiring mistake).
        """
        if station not in self.stations:
            raise ValueError(f"OPC UA server: no station {station!r}")
        if state not in STATES:
            raise ValueError(f"OPC UA server: no state {state!r}: one of {', '.join(STATES)}")
        self._offer(("state", station, state))

    def _offer(self, item: tuple[str, Any, Any]) -> None:
        with self._lock:
            if len(self._pending) >= self.config.queue_bound:
                self._counts["queue_full"] += 1
                return
            self._pending.append(item)
            wake = len(self._pending) == 1
        runner, event = self._runner, self._wake
        if wake and runner is not None and event is not None:
            # the loop may have closed meanwhile: the item then stays unsent
            with contextlib.suppress(RuntimeError):
                runner.loop.call_soon_threadsafe(event.set)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def stats(self) -> dict[str, int]:
        """Counters (see :data:`COUNTERS`), the queue's length, and sign-ins."""
        with self._lock:
            out = dict(self._counts)
            out["queued"] = len(self._pending)
        check, users = self._check, self._users
        out["logins_ok"] = check.counters.ok if check else 0
        out["logins_failed"] = check.counters.failed if check else 0
        out["logins_throttled"] = check.counters.throttled if check else 0
        out["sessions_refused_insecure"] = users.refused_insecure if users else 0
        return out

    # -- start and stop ------------------------------------------------------------------

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Load the node set, build the VisionSystems and listen.

        Raises:
            ConfigError: disabled, the node set is missing, a certificate, key or the
                users secret can't be read.
            LineError: ``refused`` (can't listen on host:port), ``timeout`` (not up
                within ``timeout_s``) or ``protocol`` (asyncua failed otherwise).
        """
        from agent.line.servers import opcua_model  # noqa: PLC0415 - asyncua loads here
        from agent.line.servers.opcua_users import PasswordCheck, Users  # noqa: PLC0415

        if not self.config.enabled:
            raise ConfigError("", "opcua_server.enabled", "the OPC UA server is not enabled")
        if self._runner is not None:
            raise LineError(LINK, "refused", "already started")
        nodeset = opcua_model.check_nodeset()
        cert, key = self._read_identity()
        self._check = PasswordCheck(self._read_users()) if self.config.users_env else None
        self._users = Users(
            self._check,
            allow_anonymous=self.config.allow_anonymous_read,
            secure_channel_required=self.config.security != "none",
        )
        self._executor = concurrent.futures.ThreadPoolExecutor(
            CALLBACK_THREADS, thread_name_prefix="opcua-server-agent"
        )
        self._runner = AsyncRunner("opcua-server")
        try:
            self._runner.call(self._serve(nodeset, cert, key), timeout_s)
        except BaseException as exc:
            self.stop(timeout_s=2.0)
            if isinstance(exc, ConfigError | LineError):
                raise
            if isinstance(exc, TimeoutError):
                raise LineError(LINK, "timeout", f"not up within {timeout_s:g} s") from exc
            if isinstance(exc, OSError):
                raise LineError(
                    LINK, "refused", f"can't listen on {self.config.host}:{self.config.port}: {exc}"
                ) from exc
            raise LineError(LINK, "protocol", f"{type(exc).__name__}: {exc}") from exc
        log.info("OPC UA server (OPC 40100) on %s: %s", self.endpoint, ", ".join(self.stations))

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop listening and the loop (bounded by ``timeout_s``); never raises."""
        runner, self._runner = self._runner, None
        if runner is not None:
            try:
                runner.call(self._unserve(), timeout_s)
            except Exception:
                log.exception("OPC UA server: stopping failed")
            runner.close(timeout_s)
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def _read_identity(self) -> tuple[bytes | None, bytes | None]:
        """The certificate and key, as DER, checked: each parses, and they belong together.

        Raises:
            ConfigError: naming the field that can't be read or does not fit.
        """
        from cryptography import x509  # noqa: PLC0415
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        cert_path, key_path = self.config.certificate, self.config.private_key
        if cert_path is None or key_path is None:
            return None, None
        raw = {}
        for name, path in (("certificate", cert_path), ("private_key", key_path)):
            try:
                raw[name] = path.read_bytes()
            except OSError as exc:
                raise ConfigError(str(path), f"opcua_server.{name}", f"can't read: {exc}") from exc
        try:
            data = raw["certificate"]
            cert = (
                x509.load_pem_x509_certificate(data)
                if b"-----BEGIN" in data
                else x509.load_der_x509_certificate(data)
            )
        except ValueError as exc:
            raise ConfigError(
                str(cert_path), "opcua_server.certificate", f"not a certificate: {exc}"
            ) from exc
        try:
            data = raw["private_key"]
            key = (
                serialization.load_pem_private_key(data, None)
                if b"-----BEGIN" in data
                else serialization.load_der_private_key(data, None)
            )
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                str(key_path), "opcua_server.private_key", f"not an unencrypted key: {exc}"
            ) from exc
        spki = serialization.PublicFormat.SubjectPublicKeyInfo
        der = serialization.Encoding.DER
        if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
            raise ConfigError(
                str(key_path), "opcua_server.private_key", "is not the certificate's key"
            )
        key_der = key.private_bytes(
            der, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(der), key_der

    def _read_users(self) -> dict[str, Any]:
        from agent.line.servers.opcua_users import UsersFileError, parse_users  # noqa: PLC0415

        name = self.config.users_env or ""
        text = read_secret(name)
        if text is None:
            raise ConfigError("", "opcua_server.users_env", f"the secret {name!r} is not set")
        try:
            users = parse_users(text)
        except UsersFileError as exc:
            raise ConfigError("", "opcua_server.users_env", f"the secret {name!r}: {exc}") from exc
        plain = sorted(n for n, c in users.items() if not c.hashed)
        if plain:
            log.warning("OPC UA users with a password in clear (use argon2 hashes): %s", plain)
        return dict(users)

    # -- on the loop ---------------------------------------------------------------------

    async def _serve(self, nodeset: Path, cert: bytes | None, key: bytes | None) -> None:
        from asyncua import ua  # noqa: PLC0415 - asyncua loads with the server
        from asyncua.server.server import Server  # noqa: PLC0415

        from agent.line.servers import opcua_model as model  # noqa: PLC0415
        from agent.line.servers.opcua_methods import Agent, Methods, StationRuntime  # noqa: PLC0415
        from agent.line.servers.opcua_users import Rules  # noqa: PLC0415

        cfg = self.config
        server = Server(user_manager=self._users)  # type: ignore[arg-type]
        self._server = server
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name("edgefleet agent (OPC 40100 Machine Vision)")
        await server.set_application_uri(cfg.application_uri)
        policies = {
            "none": [ua.SecurityPolicyType.NoSecurity],
            "sign": [
                ua.SecurityPolicyType.Basic256Sha256_Sign,
                ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
            ],
            "sign_and_encrypt": [ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt],
        }[cfg.security]
        server.set_security_policy(policies, permission_ruleset=Rules())  # type: ignore[no-untyped-call]
        tokens: list[type] = []
        if cfg.users_env:
            tokens.append(ua.UserNameIdentityToken)
        if cfg.allow_anonymous_read:
            tokens.append(ua.AnonymousIdentityToken)
        server.set_identity_tokens(tokens)
        if cert is not None and key is not None:
            await server.load_certificate(cert, format="der")
            await server.load_private_key(key, format="der")
        mv = await model.load(server, nodeset, cfg.namespace_uri)
        self._mv = mv
        if self._executor is None:
            raise RuntimeError("the server was stopped while it started")
        agent = Agent(
            on_trigger=self._on_trigger,
            recipes=self._recipes,
            select_recipe=self._select_recipe,
            on_command=self._on_command,
            executor=self._executor,
            timeout_s=cfg.callback_timeout_s,
            count=self._count,
        )
        self._methods = Methods(server, mv, agent, self._count, self._show_recipes)
        for station in self.stations:
            runtime = StationRuntime(await model.add_station(server, mv, station))
            self._methods.bind(runtime)
            await model.write_state(runtime.nodes, mv, runtime.state)
            self._runtimes[station] = runtime
        await server.start()
        wake = self._wake = asyncio.Event()
        wake.set()  # what was queued before the start
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._drain(wake, mv), name="opcua-server-drain"),
            loop.create_task(self._refresh_recipes(agent), name="opcua-server-recipes"),
        ]

    async def _unserve(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    async def _drain(self, wake: asyncio.Event, mv: MachineVision) -> None:
        """Apply what the stations queued, in order (one bad item is logged and counted)."""
        while True:
            await wake.wait()
            wake.clear()
            with self._lock:
                items = list(self._pending)
                self._pending.clear()
            for item in items:
                try:
                    await self._apply(item, mv)
                except Exception:
                    self._count("apply_errors")
                    log.exception("OPC UA server: could not publish %s", item[0])

    async def _apply(self, item: tuple[str, Any, Any], mv: MachineVision) -> None:
        from agent.line.servers import opcua_model as model  # noqa: PLC0415
        from agent.line.servers.vision import KeptResult, trigger_job_id  # noqa: PLC0415

        kind, first, second = item
        if kind == "state":
            runtime = self._runtimes[first]
            runtime.state = second
            await model.write_state(runtime.nodes, mv, second)
            self._count("states_set")
            return
        result: StationResult = first
        found = self._runtimes.get(result.station)
        if found is None:
            self._count("unknown_station")
            return
        pending = found.pending_jobs
        while pending and pending[0][2] < result.wall_time - PENDING_JOB_S:
            pending.popleft()  # a job the station never answered: not this result's
        if pending:
            job_id, meas_id, _ = pending.popleft()
            kept = KeptResult(result, job_id, meas_id)
        else:
            kept = KeptResult(result, trigger_job_id(result))
        found.kept.append(kept)
        while len(found.kept) > self.config.results_kept:
            found.kept.popleft()
        data = await model.write_latest(found.nodes, mv, kept)
        await model.emit_result(found.nodes, data, result)
        self._count("results_published")

    async def _show_recipes(self, station: str, recipes: tuple[Recipe, ...]) -> None:
        from agent.line.servers import opcua_model as model  # noqa: PLC0415

        server, mv, methods = self._server, self._mv, self._methods
        if server is None or mv is None or methods is None:
            return  # stopping
        runtime = self._runtimes[station]

        async def bind(recipe_id: str, node: Node) -> None:
            await methods.bind_recipe(runtime, recipe_id, node)

        await model.show_recipes(server, runtime.nodes, mv, recipes, bind)

    async def _refresh_recipes(self, agent: Agent) -> None:
        """Read every station's recipes now and every ``recipe_refresh_s``."""
        from agent.line.servers.opcua_methods import Refusal  # noqa: PLC0415

        while True:
            for station in self.stations:
                try:
                    await self._show_recipes(station, await agent.recipe_list(station))
                    self._count("recipe_refreshes")
                except Refusal as refusal:
                    log.warning("OPC UA server: recipes of %s: %s", station, refusal.reason)
                except Exception:
                    self._count("apply_errors")
                    log.exception("OPC UA server: recipes of %s could not be shown", station)
            await asyncio.sleep(self.config.recipe_refresh_s)
