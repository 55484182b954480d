"""A small OPC UA PLC: asyncua's server on its own event loop, on a free loopback port.

Its variables live in namespace :data:`NAMESPACE_URI` under string node ids
(``ns=2;s=Trigger``): the line's handshake (:data:`LINE_VARIABLES`: Trigger, TriggerCount,
PartId and result variables the client writes), one writable variable of each value type
(``Value_int16`` ...: :data:`TYPE_VARIABLES`) and ``ReadOnly``, which a client may read
but not write. Clients log in as users of role *User*, so the server checks each
variable's access level (an *Admin* would bypass it).

With ``secure=True`` the server offers only Basic256Sha256 (Sign, SignAndEncrypt) with a
self-signed certificate made at the first start in ``workdir`` (:attr:`OpcUaPlc.certificate`
is the file a client pins); with ``users`` it accepts only those users with their
passwords (no anonymous sessions). :func:`make_certificate` makes a client's certificate.

The test side: :meth:`OpcUaPlc.set`, :meth:`OpcUaPlc.get`, :meth:`OpcUaPlc.wait_for`,
:meth:`OpcUaPlc.stall` (stop answering for a while), :attr:`OpcUaPlc.write_calls` (what
each client Write call named), :meth:`OpcUaPlc.stop` and :meth:`OpcUaPlc.start` (same
port, same values).

Example::

    plc = OpcUaPlc(tmp_path)
    plc.start()
    plc.set("Trigger", True)
    assert plc.wait_for("ResultValid", True, timeout_s=2.0)
    plc.close()
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncua import ua
from asyncua.common.callback import CallbackType, ServerItemCallback
from asyncua.crypto import cert_gen
from asyncua.crypto.permission_rules import User, UserRole
from asyncua.server.internal_server import InternalServer
from asyncua.server.server import Server
from asyncua.server.user_managers import UserManager
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from agent.line.drivers.base import AsyncRunner
from agent.line.drivers.opcua_address import VARIANT_NAMES
from agent.line.values import VALUE_TYPES
from hil.loopback import free_port

NAMESPACE_URI = "urn:edgefleet:hil:plc"
APPLICATION_URI = "urn:edgefleet:hil:plc:server"
CALL_TIMEOUT_S = 10.0
"""The longest a call into the server's loop may take (a stall included)."""
MAX_STALL_S = 60.0


@dataclass(frozen=True)
class Variable:
    """One variable of the PLC: its name (the node id's string), value type, first value
    and whether a client may write it."""

    name: str
    vtype: str
    initial: Any
    writable: bool = True


LINE_VARIABLES: tuple[Variable, ...] = (
    Variable("Trigger", "bool", False),
    Variable("TriggerCount", "uint32", 0),
    Variable("PartId", "string", ""),
    Variable("Busy", "bool", False),
    Variable("ResultValid", "bool", False),
    Variable("OutcomeCode", "int16", 0),
    Variable("Score", "float32", 0.0),
    Variable("DecisionId", "string", ""),
    Variable("Seq", "uint32", 0),
    Variable("ReadOnly", "int32", 42, writable=False),
)
"""A station's handshake and results, and a read-only variable."""

_ZERO = {"bool": False, "string": "", "float32": 0.0, "float64": 0.0}
TYPE_VARIABLES: tuple[Variable, ...] = tuple(
    Variable(f"Value_{vtype}", vtype, _ZERO.get(vtype, 0)) for vtype in VALUE_TYPES
)
"""One writable variable of each value type (``Value_bool`` ... ``Value_string``)."""


def make_certificate(directory: Path, name: str, application_uri: str) -> tuple[Path, Path]:
    """A self-signed OPC UA application certificate (client and server use, SAN: the URI,
    ``localhost``, this host's name) and its RSA key, as ``NAME.pem`` and ``NAME.key``
    (PEM) in ``directory``; returns (certificate, key)."""
    key = cert_gen.generate_private_key()
    cert = cert_gen.generate_self_signed_app_certificate(
        key,
        name,
        {},
        [
            x509.UniformResourceIdentifier(application_uri),
            x509.DNSName("localhost"),
            x509.DNSName(socket.gethostname()),
        ],
        extended=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        days=30,
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(Encoding.PEM))
    key_path.write_bytes(cert_gen.dump_private_key_as_pem(key))
    key_path.chmod(0o600)
    return cert_path, key_path


class _Users(UserManager):
    """Accepts the named users with their passwords, as role User; nobody else."""

    def __init__(self, users: dict[str, str]) -> None:
        self._users = dict(users)

    def get_user(
        self,
        iserver: InternalServer,
        username: str | None = None,
        password: str | None = None,
        certificate: Any = None,
    ) -> User | None:
        expected = self._users.get(username or "")
        if expected is None or not hmac.compare_digest(expected, password or ""):
            return None
        return User(role=UserRole.User, name=username)


class _Anyone(UserManager):
    """Anonymous sessions, as role User (asyncua's default manager would let "admin"
    past the access levels)."""

    def get_user(
        self,
        iserver: InternalServer,
        username: str | None = None,
        password: str | None = None,
        certificate: Any = None,
    ) -> User | None:
        return User(role=UserRole.User)


class OpcUaPlc:
    """An OPC UA server with the variables given, on ``opc.tcp://127.0.0.1:PORT``.

    Args:
        workdir: where the server's certificate is made (``secure``).
        secure: offer only Basic256Sha256 Sign / SignAndEncrypt.
        users: user name -> password; None: anonymous sessions.
        variables: the variables (default: the line's and one of each type).
        port: a fixed port (default: a free one, kept across stop/start).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        secure: bool = False,
        users: dict[str, str] | None = None,
        variables: tuple[Variable, ...] = LINE_VARIABLES + TYPE_VARIABLES,
        port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.secure = secure
        self.users = users
        self.variables = {v.name: v for v in variables}
        self.port = port or free_port()
        self.certificate: Path | None = None
        self._key: Path | None = None
        self._values: dict[str, Any] = {v.name: v.initial for v in variables}
        self._runner: AsyncRunner | None = None
        self._server: Server | None = None
        self._ns = 0
        self._unstall = threading.Event()
        self.write_calls: deque[list[str]] = deque(maxlen=1000)
        """The variables each client Write call named, in the order the calls came (the
        last 1000 calls)."""

    @property
    def endpoint(self) -> str:
        """The URL a client connects to."""
        return f"opc.tcp://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server listens."""
        return self._server is not None

    def node_id(self, name: str) -> str:
        """The node id of variable ``name`` (``ns=2;s=Trigger``); valid once started."""
        return f"ns={self._ns};s={name}"

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Listen (again, on the same port, with the values held at the last stop).

        Raises:
            RuntimeError: it is running already.
            Exception: the server could not start (asyncua's error).
        """
        if self._server is not None:
            raise RuntimeError("the OPC UA PLC is running already")
        if self._runner is None:
            self._runner = AsyncRunner("opcua-plc")
        if self.secure and self.certificate is None:
            self.certificate, self._key = make_certificate(self.workdir, "plc", APPLICATION_URI)
        self._server = self._runner.call(self._start(), CALL_TIMEOUT_S)

    async def _start(self) -> Server:
        manager: UserManager = _Users(self.users) if self.users is not None else _Anyone()
        server = Server(user_manager=manager)
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name("edgefleet hil PLC")
        await server.set_application_uri(APPLICATION_URI)
        if self.secure:
            assert self.certificate is not None
            assert self._key is not None
            await server.load_certificate(str(self.certificate), format="pem")
            await server.load_private_key(str(self._key), format="pem")
            server.set_security_policy(
                [
                    ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
                    ua.SecurityPolicyType.Basic256Sha256_Sign,
                ]
            )
        else:
            server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        if self.users is not None:
            server.set_identity_tokens([ua.UserNameIdentityToken])
        self._ns = await server.register_namespace(NAMESPACE_URI)
        folder = await server.nodes.objects.add_folder(_node("PLC", self._ns), "PLC")
        for var in self.variables.values():
            node = await folder.add_variable(
                _node(var.name, self._ns),
                ua.QualifiedName(var.name, self._ns),
                self._values[var.name],
                varianttype=_variant_type(var.vtype),
            )
            if var.writable:
                await node.set_writable()
        server.subscribe_server_callback(CallbackType.PostWrite, self._on_write)
        await server.start()
        return server

    def _on_write(self, event: ServerItemCallback, _dispatcher: object) -> None:
        nodes = event.request_params.NodesToWrite
        self.write_calls.append([str(w.NodeId.Identifier) for w in nodes])

    def stop(self) -> None:
        """Stop listening (clients see the connection closed); the values are kept for
        the next :meth:`start`. Idempotent."""
        server, self._server = self._server, None
        if server is None or self._runner is None:
            return
        self._unstall.set()
        self._values = {name: self._read(server, name) for name in self.variables}
        self._runner.call(_stop(server), CALL_TIMEOUT_S)

    def close(self) -> None:
        """Stop and end the loop's thread."""
        self.stop()
        if self._runner is not None:
            self._runner.close()
            self._runner = None

    # -- values ------------------------------------------------------------------------

    def set(self, name: str, value: Any) -> None:
        """Set variable ``name`` as the PLC's program would (access levels don't apply);
        subscribed clients are told.

        Raises:
            KeyError: no such variable.
        """
        var = self.variables[name]
        server, runner = self._running()
        node_id = _node(name, self._ns)
        data = ua.DataValue(ua.Variant(value, _variant_type(var.vtype)))
        runner.call(server.write_attribute_value(node_id, data), CALL_TIMEOUT_S)

    def get(self, name: str) -> Any:
        """The value of variable ``name`` now.

        Raises:
            KeyError: no such variable.
        """
        self.variables[name]
        server, runner = self._running()
        return runner.call(self._get(server, name), CALL_TIMEOUT_S)

    async def _get(self, server: Server, name: str) -> Any:
        return self._read(server, name)

    def _read(self, server: Server, name: str) -> Any:
        data = server.read_attribute_value(_node(name, self._ns))
        return None if data.Value is None else data.Value.Value

    def wait_for(self, name: str, value: Any, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for variable ``name`` to equal ``value``; whether it
        did."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.get(name) == value:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def stall(self, seconds: float) -> None:
        """Stop answering for ``seconds`` (the server's loop blocks: connections stay
        open, nothing is read or sent), as a PLC whose scan hangs; returns at once.
        :meth:`resume` (or :meth:`stop`) ends it early."""
        _, runner = self._running()
        self._unstall.clear()
        runner.loop.call_soon_threadsafe(self._unstall.wait, min(seconds, MAX_STALL_S))

    def resume(self) -> None:
        """End a :meth:`stall` now."""
        self._unstall.set()

    def _running(self) -> tuple[Server, AsyncRunner]:
        if self._server is None or self._runner is None:
            raise RuntimeError("the OPC UA PLC is not running")
        return self._server, self._runner


async def _stop(server: Server) -> None:
    """Stop the server and end the tasks it leaves (session timeouts, subscriptions)."""
    await server.stop()
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=CALL_TIMEOUT_S / 2)


def _node(name: str, ns: int) -> ua.NodeId:
    return ua.NodeId(ua.String(name), ua.Int16(ns))


def _variant_type(vtype: str) -> ua.VariantType:
    return getattr(ua.VariantType, VARIANT_NAMES[vtype])  # type: ignore[no-any-return]
