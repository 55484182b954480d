"""OPC UA driver: asyncua's client on one event loop of its own (:class:`AsyncRunner`).

Addresses are OPC UA node ids in their string form (``ns=2;s=Station1.Trigger``,
``ns=2;i=5``, ``i=85``, ``nsu=urn:acme:plc;s=Trigger``, ``ns=1;g=<guid>``,
``ns=1;b=<base64>``); :func:`parse_point` (:mod:`agent.line.drivers.opcua_address`)
checks the syntax by hand (no asyncua on a device that only checks its configuration),
asyncua parses them again when used, and an ``nsu=`` id is resolved against the
server's namespace array read at connect. The certificate files are read by
:mod:`agent.line.drivers.opcua_certs`.

- Security: policy Basic256Sha256 with mode Sign or SignAndEncrypt, the agent's
  application certificate and key from the configured files, the server's certificate
  pinned when one is configured (else the one its endpoint offers); a user name with the
  password from the secret ``password_env`` names (never from the file).
- read: one Read service call for all points (``read_attributes``, not ``read_values``:
  the status code of each value is kept, so a missing node is ``bad_node``, not None),
  each value checked against the point's type: a Double where int16 is configured is
  ``type_mismatch``.
- write: Variants of the point's type (no timestamps: some PLCs refuse a write that
  carries one). OPC UA leaves the order of the operations of one Write call to the
  server (Part 4, 5.11.4), so every value but the last goes in one call and the last
  (a station's result-valid flag) in a second: a PLC that sees the flag set reads the
  rest of the result already written.
- watch: a subscription whose data-change notifications call ``on_change(index, value)``
  on the loop's thread, each call caught and counted.
- keep-alive: asyncua's connection supervisor reads the server's state every
  ``keepalive_s``; a session it finds dead (or a subscription the server ends) makes the
  next call fail with ``disconnected``, so the link reconnects (asyncua's own reconnect
  is off: the link owns reconnects and their backoff).

Status codes map to reason words by :data:`STATUS_REASONS` (BadUserAccessDenied and
BadNotWritable: ``denied``, BadNodeIdUnknown: ``bad_node``, BadTypeMismatch:
``type_mismatch`` ...); the rest are ``protocol``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import hashes, serialization

from agent.kernel.secrets import read_secret
from agent.line.drivers import opcua_certs as certs
from agent.line.drivers.base import AsyncRunner, Driver, Point, wrap
from agent.line.drivers.configs import OpcUaLinkConfig
from agent.line.drivers.opcua_address import VARIANT_NAMES, parse_point
from agent.line.errors import LineError
from agent.line.values import MAX_STRING_BYTES, ValueMismatch, coerce

if TYPE_CHECKING:
    from asyncua import ua
    from asyncua.client.client import Client
    from asyncua.common.subscription import DataChangeNotif

__all__ = ["KEY", "STATUS_REASONS", "VARIANT_NAMES", "OpcUaDriver", "parse_point", "value_of"]

log = logging.getLogger(__name__)

KEY = "opcua"
CLOSE_TIMEOUT_S = 2.0
MIN_SESSION_TIMEOUT_S = 30.0

STATUS_REASONS: dict[str, str] = {
    "BadUserAccessDenied": "denied",
    "BadNotWritable": "denied",
    "BadNotReadable": "denied",
    "BadIdentityTokenInvalid": "denied",
    "BadIdentityTokenRejected": "denied",
    "BadSecurityChecksFailed": "denied",
    "BadSecurityPolicyRejected": "denied",
    "BadSecurityModeRejected": "denied",
    "BadCertificateInvalid": "denied",
    "BadCertificateUntrusted": "denied",
    "BadCertificateTimeInvalid": "denied",
    "BadCertificateRevoked": "denied",
    "BadCertificateUseNotAllowed": "denied",
    "BadCertificateUriInvalid": "denied",
    "BadCertificateHostNameInvalid": "denied",
    "BadNodeIdUnknown": "bad_node",
    "BadNodeIdInvalid": "bad_node",
    "BadAttributeIdInvalid": "bad_node",
    "BadTypeMismatch": "type_mismatch",
    "BadOutOfRange": "type_mismatch",
    "BadDataEncodingInvalid": "type_mismatch",
    "BadTimeout": "timeout",
    "BadRequestTimeout": "timeout",
    "BadSessionIdInvalid": "disconnected",
    "BadSessionClosed": "disconnected",
    "BadSessionNotActivated": "disconnected",
    "BadSecureChannelClosed": "disconnected",
    "BadConnectionClosed": "disconnected",
    "BadShutdown": "disconnected",
    "BadServerHalted": "disconnected",
    "BadTooManySessions": "refused",
    "BadMaxConnectionsReached": "refused",
}
"""Reason word of each status code a PLC may answer (the rest: ``protocol``)."""


class OpcUaDriver(Driver):
    """One session with one OPC UA server (see the module docstring).

    Attributes:
        counts: ``watch_changes`` (notifications handed on), ``watch_errors`` (a
            notification whose value did not fit its point, or whose ``on_change``
            raised).
    """

    KEY = KEY
    LIBRARY = "asyncua"

    def __init__(self, config: OpcUaLinkConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.counts = {"watch_changes": 0, "watch_errors": 0}
        self._runner: AsyncRunner | None = None
        self._client: Client | None = None
        self._namespaces: list[str] = []
        self._node_ids: dict[str, ua.NodeId] = {}
        self._lost = ""

    @property
    def connected(self) -> bool:
        """Whether the session is up (as far as the keep-alive knows)."""
        client = self._client
        return client is not None and not self._lost and client.state.value == "connected"

    # -- life cycle --------------------------------------------------------------------

    def open(self) -> None:
        """Open a secure channel and an activated session (within the timeout).

        Raises:
            LineError: ``refused`` (nothing listens), ``timeout``, ``denied`` (user,
                password, certificate or security mode refused; a secret or a
                certificate file missing), ``protocol``.
        """
        self.close()
        password = self._password()
        files = self._security_files()
        runner = self._runner = AsyncRunner(self.settings.name)
        try:
            self._client, self._namespaces = runner.call(
                self._connect(password, files), self.timeout_s
            )
        except Exception as exc:
            self.close()
            raise self._error(exc, "connect") from exc
        self._lost = ""

    def close(self) -> None:
        """Close the session and the channel (bounded), and end the loop's thread."""
        runner, client = self._runner, self._client
        self._runner = self._client = None
        self._node_ids.clear()
        if runner is None:
            return
        try:
            runner.call(self._shutdown(client), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - close never raises: the loop goes anyway
            log.debug("plc %s: close: %s", self.settings.name, exc)
        runner.close()

    async def _connect(
        self, password: str | None, files: tuple[bytes, bytes, bytes | None] | None
    ) -> tuple[Client, list[str]]:
        from asyncua.client.client import Client  # noqa: PLC0415 - loads with the driver

        c = self.settings
        client = Client(c.endpoint, timeout=self.timeout_s, watchdog_intervall=c.keepalive_s)
        client.name = client.description = f"edgefleet agent ({c.name})"
        client.session_timeout = int(max(MIN_SESSION_TIMEOUT_S, 4 * c.keepalive_s) * 1000)
        client.connection_lost_callback = self._on_connection_lost
        if c.username:
            client.set_user(c.username)
            if password is not None:
                client.set_password(password)
        try:
            if files is not None:
                await self._secure(client, *files)
            await client.connect()
            namespaces = await client.get_namespace_array()
        except BaseException:  # a cancel (the timeout) too: the socket must not stay open
            await _abandon(client)
            raise
        return client, list(namespaces)

    async def _secure(
        self, client: Client, cert: bytes, key: bytes, server_cert: bytes | None
    ) -> None:
        """Basic256Sha256 in the configured mode; with a pinned server certificate, the
        one the endpoint offers must be it (a server that can't decrypt what was
        encrypted for another key would not answer at all: a timeout, not ``denied``)."""
        from asyncua import ua  # noqa: PLC0415 - loads with the driver
        from asyncua.client.client import Client  # noqa: PLC0415
        from asyncua.crypto.security_policies import (  # noqa: PLC0415
            SecurityPolicyBasic256Sha256,
        )
        from asyncua.crypto.uacrypto import CertProperties  # noqa: PLC0415

        mode = (
            ua.MessageSecurityMode.SignAndEncrypt
            if self.settings.security == "sign_and_encrypt"
            else ua.MessageSecurityMode.Sign
        )
        client.application_uri = certs.application_uri(cert) or client.application_uri
        pinned = None
        if server_cert is not None:
            want = certs.load_certificate(server_cert, self.settings.name)
            endpoints = await client.connect_and_get_server_endpoints()
            endpoint = Client.find_endpoint(endpoints, mode, SecurityPolicyBasic256Sha256.URI)
            offered = certs.first_certificate(endpoint.ServerCertificate)
            if offered is None or offered.fingerprint(hashes.SHA256()) != want.fingerprint(
                hashes.SHA256()
            ):
                raise LineError(
                    self.settings.name,
                    "denied",
                    "the server's certificate is not the pinned one "
                    f"(offered {certs.fingerprint(offered)}, pinned {certs.fingerprint(want)})",
                )
            pinned = CertProperties(want.public_bytes(serialization.Encoding.DER), "der")
        await client.set_security(
            SecurityPolicyBasic256Sha256,
            CertProperties(cert, certs.pem_or_der(cert)),
            CertProperties(key, certs.pem_or_der(key)),
            server_certificate=pinned,
            mode=mode,
        )

    async def _shutdown(self, client: Client | None) -> None:
        if client is not None and not self._lost and client.state.value == "connected":
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), self.timeout_s)
        await _abandon(client)

    def _password(self) -> str | None:
        name = self.settings.password_env
        if not name:
            return None
        password = read_secret(name)
        if password is None:
            raise LineError(
                self.settings.name,
                "denied",
                f"the password secret {name!r} is not set (a file in $CREDENTIALS_DIRECTORY "
                "or the environment)",
            )
        return password

    def _security_files(self) -> tuple[bytes, bytes, bytes | None] | None:
        c = self.settings
        if c.security == "none":
            return None
        if c.certificate is None or c.private_key is None:
            raise LineError(
                c.name, "denied", f"security {c.security} needs `certificate` and `private_key`"
            )
        server = (
            None if c.server_certificate is None else certs.read_file(c.server_certificate, c.name)
        )
        return (
            certs.read_file(c.certificate, c.name),
            certs.read_file(c.private_key, c.name),
            server,
        )

    # -- reading and writing -----------------------------------------------------------

    def read(self, points: Sequence[Point]) -> list[Any]:
        """The values of ``points``, read in one Read call, each checked against its type.

        Raises:
            LineError: ``bad_node`` (no such node), ``type_mismatch`` (another type),
                ``denied``, ``timeout``, ``disconnected``, ``protocol``.
        """
        if not points:
            return []
        from asyncua.ua.attribute_ids import AttributeIds  # noqa: PLC0415 - loads with the driver

        client, runner = self._live()
        ids = [self._node_id(p) for p in points]
        try:
            data = runner.call(
                client.uaclient.read_attributes(ids, AttributeIds.Value), self.timeout_s
            )
        except Exception as exc:
            raise self._error(exc, "read") from exc
        if len(data) != len(points):
            raise LineError(
                self.settings.name, "protocol", f"{len(data)} values for {len(points)} nodes"
            )
        return [self._value(p, d) for p, d in zip(points, data, strict=True)]

    def write(self, writes: Sequence[tuple[Point, Any]]) -> None:
        """Write each value as a Variant of its point's type: all but the last in one
        Write call, then the last (see the module docstring); the whole within the
        timeout.

        Raises:
            LineError: ``denied`` (not writable for this user), ``bad_node``,
                ``type_mismatch`` (the node holds another type, or the value does not
                fit), ``timeout``, ``disconnected``, ``protocol``.
        """
        if not writes:
            return
        from asyncua.ua.attribute_ids import AttributeIds  # noqa: PLC0415 - loads with the driver

        client, runner = self._live()
        items = [(p, self._node_id(p), self._data_value(p, v)) for p, v in writes]
        batches = [b for b in (items[:-1], items[-1:]) if b]

        async def write_all() -> list[list[ua.StatusCode]]:
            results = []
            for batch in batches:
                statuses = await client.uaclient.write_attributes(
                    [i[1] for i in batch], [i[2] for i in batch], AttributeIds.Value
                )
                results.append(statuses)
                if any(not s.is_good() for s in statuses):
                    break  # the flag is not set over a result that was not written
            return results

        try:
            results = runner.call(write_all(), self.timeout_s)
        except Exception as exc:
            raise self._error(exc, "write") from exc
        for batch, statuses in zip(batches, results, strict=False):
            for (point, _, _), status in zip(batch, statuses, strict=False):
                if not status.is_good():
                    raise self._status_error(status, f"write {point.address}")

    def watch(
        self,
        points: Sequence[Point],
        on_change: Callable[[int, Any], None],
        *,
        period_s: float = 0.01,
    ) -> bool:
        """Subscribe to ``points`` with a publishing interval of ``period_s`` (the server
        may revise it); each change calls ``on_change(index, value)`` on the loop's
        thread, the current values first. A value that does not fit its point, or an
        ``on_change`` that raises, is counted (``watch_errors``) and skipped.

        Raises:
            LineError: ``bad_node`` (a node can't be monitored), ``timeout``,
                ``disconnected``, ``protocol``.
        """
        if not points:
            return True
        client, runner = self._live()
        ids = [self._node_id(p) for p in points]
        indexes: dict[ua.NodeId, list[int]] = {}
        for i, node_id in enumerate(ids):
            indexes.setdefault(node_id, []).append(i)
        handler = _Changes(self, points, indexes, on_change)
        try:
            results = runner.call(self._subscribe(client, ids, handler, period_s), self.timeout_s)
        except Exception as exc:
            raise self._error(exc, "subscribe") from exc
        for point, result in zip(points, results, strict=True):
            if not isinstance(result, int):
                raise self._status_error(result, f"monitor {point.address}")
        return True

    async def _subscribe(
        self, client: Client, ids: list[ua.NodeId], handler: _Changes, period_s: float
    ) -> list[int | ua.StatusCode]:
        from asyncua import ua  # noqa: PLC0415 - loads with the driver

        subscription = await client.create_subscription(period_s * 1000, handler)
        nodes = [client.get_node(i) for i in ids]
        return await subscription.subscribe_data_change(
            nodes, sampling_interval=ua.Double(period_s * 1000)
        )

    # -- helpers -----------------------------------------------------------------------

    def _live(self) -> tuple[Client, AsyncRunner]:
        client, runner = self._client, self._runner
        if client is None or runner is None:
            raise LineError(self.settings.name, "disconnected", "not connected")
        if self._lost:
            raise LineError(self.settings.name, "disconnected", self._lost)
        if client.state.value != "connected":
            raise LineError(
                self.settings.name,
                "disconnected",
                f"the session is gone (the keep-alive found it {client.state.value})",
            )
        return client, runner

    def _node_id(self, point: Point) -> ua.NodeId:
        node_id = self._node_ids.get(point.address)
        if node_id is not None:
            return node_id
        from asyncua import ua  # noqa: PLC0415 - loads with the driver
        from asyncua.ua.uaerrors import UaError  # noqa: PLC0415

        try:
            parsed = ua.NodeId.from_string(point.address)
        except (UaError, ValueError) as exc:
            raise LineError(self.settings.name, "bad_node", f"{point.address}: {exc}") from exc
        if isinstance(parsed, ua.ExpandedNodeId) and parsed.NamespaceUri:
            try:
                index = self._namespaces.index(parsed.NamespaceUri)
            except ValueError:
                raise LineError(
                    self.settings.name,
                    "bad_node",
                    f"{point.address}: the server has no namespace {parsed.NamespaceUri!r}",
                ) from None
            parsed = ua.NodeId(parsed.Identifier, ua.Int16(index), parsed.NodeIdType)
        elif isinstance(parsed, ua.ExpandedNodeId):
            parsed = ua.NodeId(parsed.Identifier, parsed.NamespaceIndex, parsed.NodeIdType)
        self._node_ids[point.address] = parsed
        return parsed

    def _value(self, point: Point, data: ua.DataValue) -> Any:
        status = data.StatusCode
        if status is not None and status.is_bad():
            raise self._status_error(status, f"read {point.address}")
        try:
            return value_of(point, data.Value)
        except ValueMismatch as exc:
            raise LineError(self.settings.name, "type_mismatch", str(exc)) from exc

    def _data_value(self, point: Point, value: Any) -> ua.DataValue:
        from asyncua import ua  # noqa: PLC0415 - loads with the driver

        try:
            fitted = coerce(value, point.vtype)
        except ValueMismatch as exc:
            raise LineError(self.settings.name, "type_mismatch", f"{point.address}: {exc}") from exc
        variant_type = getattr(ua.VariantType, VARIANT_NAMES[point.vtype])
        return ua.DataValue(Value=ua.Variant(fitted, variant_type))

    def _status_error(self, status: ua.StatusCode, doing: str) -> LineError:
        name = status.name
        return LineError(
            self.settings.name, STATUS_REASONS.get(name, "protocol"), f"{doing}: {name}"
        )

    def _error(self, exc: BaseException, doing: str) -> LineError:
        if isinstance(exc, LineError):
            return exc
        from asyncua import ua  # noqa: PLC0415 - loads with the driver
        from asyncua.ua.uaerrors import UaError, UaStatusCodeError  # noqa: PLC0415

        if isinstance(exc, UaStatusCodeError):
            return self._status_error(ua.StatusCode(exc.code), doing)
        if isinstance(exc, UaError) and "No matching endpoints" in str(exc):
            return LineError(self.settings.name, "denied", f"{doing}: {exc}")
        error = wrap(self.settings.name, exc)
        if error.reason == "timeout":
            return LineError(
                self.settings.name, "timeout", f"{doing}: no answer within {self.timeout_s:g} s"
            )
        return LineError(error.link, error.reason, f"{doing}: {error.detail}")

    async def _on_connection_lost(self, exc: Exception) -> None:
        self._lose(f"the keep-alive lost the session: {type(exc).__name__}: {exc}")

    def _lose(self, why: str) -> None:
        """The session or its subscription died (loop thread): the next call says so, and
        the link reopens. asyncua's publish loop would retry (and log) every second until
        then: it is ended here."""
        if self._lost:
            return
        self._lost = why
        log.warning("plc %s: %s", self.settings.name, why)
        client = self._client
        # asyncua keeps the task on its UaClient without a public name for it
        task = None if client is None else getattr(client.uaclient, "_publish_task", None)
        if isinstance(task, asyncio.Task) and not task.done():
            task.cancel()


class _Changes:
    """The subscription's handler: asyncua calls it from a task on the driver's loop."""

    def __init__(
        self,
        driver: OpcUaDriver,
        points: Sequence[Point],
        indexes: dict[ua.NodeId, list[int]],
        on_change: Callable[[int, Any], None],
    ) -> None:
        self._driver = driver
        self._points = list(points)
        self._indexes = indexes
        self._on_change = on_change

    def datachange_notification(self, node: Any, val: Any, data: DataChangeNotif) -> None:
        counts = self._driver.counts
        for index in self._indexes.get(node.nodeid, ()):
            try:
                value = value_of(self._points[index], data.monitored_item.Value.Value)
                self._on_change(index, value)
            except Exception:
                counts["watch_errors"] += 1
                log.exception(
                    "plc %s: a change of %s was not handed on",
                    self._driver.settings.name,
                    self._points[index].address,
                )
            else:
                counts["watch_changes"] += 1

    def status_change_notification(self, status: ua.StatusChangeNotification) -> None:
        self._driver._lose(f"the server ended the subscription: {status.Status.name}")


def value_of(point: Point, variant: ua.Variant | None) -> Any:
    """The Python value of ``variant`` when it holds ``point``'s type.

    Raises:
        ValueMismatch: another type, an array, or a string over the bound.
    """
    expected = VARIANT_NAMES[point.vtype]
    if variant is None:
        raise ValueMismatch(f"{point.address} has no value")
    held = variant.VariantType.name
    if held != expected:
        raise ValueMismatch(
            f"{point.address} holds {held}, configured as {point.vtype} ({expected})"
        )
    if variant.is_array or isinstance(variant.Value, list):
        raise ValueMismatch(f"{point.address} holds an array of {held}, not one {point.vtype}")
    value = variant.Value
    if point.vtype == "string":
        text = "" if value is None else str(value)
        if len(text.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
            raise ValueMismatch(f"{point.address} holds a string over {MAX_STRING_BYTES} bytes")
        return text
    if point.vtype == "bool":
        return bool(value)
    return value


async def _abandon(client: Client | None) -> None:
    """Close the socket and end every other task of the loop (asyncua's supervisor,
    channel renewal, publish loop) without asking the server anything."""
    if client is not None:
        with contextlib.suppress(Exception):
            client.uaclient.request_disconnect()
        with contextlib.suppress(Exception):
            client.disconnect_socket()
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S / 2)
