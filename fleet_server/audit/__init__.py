"""The audit trail: who changed what, when, from where, and how it ended.

- :mod:`fleet_server.audit.store`: one row a change in ``audit_log`` (:func:`record`),
  read back newest first with filters (:func:`query`); there is no update or delete but
  retention's.
- :mod:`fleet_server.audit.middleware`: every request that may change something (POST,
  PUT, PATCH, DELETE) to the API and the console is recorded with its principal, its
  client address, the route's action name (:mod:`fleet_server.audit.names`) and target,
  and its result, refused ones included, before its answer completes.
- Commands that work on the database directly (``fleetctl users``) record theirs with
  :func:`record_local` (the system user that ran them, ``source`` ``cli``).
"""

from fleet_server.audit.store import (
    AuditEntry,
    AuditFilter,
    local_actor,
    query,
    record,
    record_local,
)

__all__ = ["AuditEntry", "AuditFilter", "local_actor", "query", "record", "record_local"]
