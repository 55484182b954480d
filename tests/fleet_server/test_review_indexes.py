"""The indexes decision review reads, on SQLite and on PostgreSQL: the migration builds
the expression indexes (which the schema comparison can't check on SQLite), and each
single filter's page is read from its own index. The second guards the spelling of the
line expression, which must be the same in the query as in the index."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from fleet_server.review import parse_filter
from fleet_server.review.query import page_query
from tests.fleet_server.review_data import mixed_fleet

pytest_plugins = ["tests.fleet_server.db_fixtures"]  # db (SQLite and PostgreSQL), pg_cluster

EXPRESSION_INDEXES = {"ix_decisions_line_ts", "ix_decisions_device_id_line_ts"}


def _index_sql(db: Engine) -> dict[str, str]:
    with db.connect() as conn:
        if db.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
                "AND tbl_name = 'decisions'"
            )
        else:
            rows = conn.exec_driver_sql(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'decisions'"
            )
        return {str(name): str(sql) for name, sql in rows}


def test_the_migration_builds_the_line_expression_indexes(db: Engine) -> None:
    found = _index_sql(db)
    line = "json_extract(payload, '$.line')" if db.dialect.name == "sqlite" else "->> 'line'"
    for name in EXPRESSION_INDEXES:
        assert line in found[name], found[name]


@pytest.mark.parametrize(
    ("params", "index"),
    [
        ({}, "ix_decisions_ts"),
        ({"line": "1"}, "ix_decisions_line_ts"),
        ({"line": "2"}, "ix_decisions_device_id_line_ts"),  # d-b2 writes rows without one
        ({"device": "d-a1"}, "ix_decisions_device_id_ts"),
        ({"outcome": "review"}, "ix_decisions_outcome_ts"),
        ({"source": "cam1"}, "ix_decisions_source_ts"),
        ({"model_version": "1.1.0"}, "ix_decisions_model_version_ts"),
        ({"reviewed": "yes"}, "ix_decision_reviews_decision_ts_decision_id"),
        ({"model_version": "1.1.0", "outcome": "review"}, "ix_decisions_model_version_ts"),
        ({"part_id": "P-0003"}, "ix_decisions_part_id_ts"),
        ({"part_id": "P-0003", "device": "d-a1"}, "ix_decisions_part_id_ts"),
        ({"part_id": "P-0003", "line": "2"}, "ix_decisions_part_id_ts"),
        ({"part_id": "P-0003", "station": "st-b"}, "ix_decisions_part_id_ts"),
    ],
)
def test_each_single_filter_reads_its_own_index(
    db: Engine, params: dict[str, str], index: str
) -> None:
    mixed_fleet(db)
    with db.connect() as conn:
        query = page_query(conn, parse_filter(params), None, 51)
        assert query is not None
        sql = str(query.compile(dialect=db.dialect, compile_kwargs={"literal_binds": True}))
        if db.dialect.name == "sqlite":
            plan = [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
        else:  # a table this small would be read whole: ask for the indexes' plan
            conn.exec_driver_sql("SET enable_seqscan = off")
            conn.exec_driver_sql("SET enable_bitmapscan = off")
            plan = [str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + sql)]
    assert any(index in line for line in plan), "\n".join(plan)
    assert not any(line.strip() == "SCAN decisions" for line in plan), "\n".join(plan)
