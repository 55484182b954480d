"""The tests' throw-away PostgreSQL cluster: the one copy in :mod:`hil.pgcluster`."""

from hil.pgcluster import PgCluster, start_cluster, stop_cluster

__all__ = ["PgCluster", "start_cluster", "stop_cluster"]
