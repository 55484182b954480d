"""Certificates the fleet server issues itself from its CA: each managed broker's server
certificate and the MQTT client identities of the fleet server and its services.

A certificate is (re)issued when missing, unreadable, from another CA, expiring within
:data:`RENEW_BEFORE`, or (a server certificate) not naming every host it is reached by.
Replicas and the ``brokers`` process share one state directory: issuing is serialised by
an ``flock`` on a lock file beside the certificate, and the check is made again under
it, so two processes starting at once do not write key and certificate of two different
issues.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509

from fleet_server.ca import FleetCA, Issued
from fleet_server.errors import FleetError
from fleet_server.repository._files import make_dirs, write_durable

log = logging.getLogger(__name__)

RENEW_BEFORE = timedelta(days=30)
"""Certificates of the brokers and the fleet services are reissued this long before expiry."""
LOCK_TIMEOUT_S = 30.0


class CertError(FleetError):
    """A certificate can't be written or its lock taken.

    Attributes:
        path: the certificate file.
        reason: what failed.
    """

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def needs_renewal(path: Path, ca: FleetCA, ips: Sequence[str] = (), dns: Sequence[str] = ()) -> str:
    """Why the certificate at ``path`` must be reissued ("" when it is fine)."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    if cert.issuer != ca.certificate().subject:
        return "issued by another CA"
    if cert.not_valid_after_utc - datetime.now(timezone.utc) < RENEW_BEFORE:
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = x509.SubjectAlternativeName([])
    have = {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    have |= set(san.get_values_for_type(x509.DNSName))
    wanted = {str(ipaddress.ip_address(a)) for a in ips} | set(dns)
    missing = wanted - have
    return f"does not name {sorted(missing)}" if missing else ""


def split_hosts(hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    """The IP addresses and DNS names a server certificate names for ``hosts`` (loopback
    always; an unspecified address is left out)."""
    ips, dns = ["127.0.0.1", "::1"], ["localhost"]
    for host in hosts:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            dns.append(host)
            continue
        if not ip.is_unspecified:
            ips.append(str(ip))
    return sorted(set(ips)), sorted(set(dns))


@contextlib.contextmanager
def _locked(cert_file: Path) -> Iterator[None]:
    lock = cert_file.with_name(cert_file.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CertError(cert_file, f"{lock} held over {LOCK_TIMEOUT_S} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def ensure_cert(
    ca: FleetCA,
    key_file: Path,
    cert_file: Path,
    what: str,
    issue: Callable[[], tuple[bytes, Issued]],
    *,
    ips: Sequence[str] = (),
    dns: Sequence[str] = (),
) -> bool:
    """Issue (``issue()``) and write key and certificate when :func:`needs_renewal` says
    so; whether it did.

    Raises:
        CertError: the files or the lock can't be written.
        CAError: the CA failed to issue.
    """
    if not needs_renewal(cert_file, ca, ips, dns):
        return False
    try:
        make_dirs(key_file.parent, mode=0o700)
        make_dirs(cert_file.parent, mode=0o700)
    except OSError as exc:
        raise CertError(cert_file, f"cannot create its directory: {exc}") from exc
    try:
        with _locked(cert_file):
            why = needs_renewal(cert_file, ca, ips, dns)
            if not why:
                return False  # another process issued it meanwhile
            log.info("issuing %s (%s)", what, why)
            key_pem, issued = issue()
            write_durable(key_file, key_pem, mode=0o600)
            write_durable(cert_file, issued.cert_pem, mode=0o644)
    except OSError as exc:
        raise CertError(cert_file, f"cannot write: {exc}") from exc
    return True


def ensure_server_cert(ca: FleetCA, key_file: Path, cert_file: Path, hosts: Sequence[str]) -> bool:
    """A broker's server certificate naming ``hosts`` (and loopback); whether issued.

    Raises:
        CertError: the files can't be written.
        CAError: the CA failed to issue.
    """
    ips, dns = split_hosts(hosts)
    return ensure_cert(
        ca,
        key_file,
        cert_file,
        f"the broker server certificate {cert_file}",
        lambda: ca.issue_server(dns_names=dns, ip_addresses=ips),
        ips=ips,
        dns=dns,
    )
