"""Alerts on fleet events (docs/alerts.md): rules the leader evaluates against what the
fleet stores (:mod:`~fleet_server.alerts.rules`, pure; :mod:`~fleet_server.alerts.facts`
reads), alerts that fire once and resolve once because their state is in the database
(:mod:`~fleet_server.alerts.store`), signed webhooks retried with backoff into dead
letters (:mod:`~fleet_server.alerts.webhook`, :mod:`~fleet_server.alerts.delivery`),
and the service of ``fleet-server serve`` (:mod:`~fleet_server.alerts.runner`).

This package's ``__init__`` imports nothing: the configuration imports
:mod:`fleet_server.alerts.config` alone.
"""
