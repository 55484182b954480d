"""Benchmark: the decision log writer against raw ``executemany``, in the same run.

Nothing here asserts a speed; the figures are returned for a report or a target check.
"""

from __future__ import annotations

import time
from pathlib import Path

from agent.decisionlog import schema
from agent.decisionlog.config import DecisionLogConfig
from agent.decisionlog.connection import connect_writer, transaction
from agent.decisionlog.encode import row_of
from agent.decisionlog.log import DecisionLog
from agent.decisionlog.record import DecisionRecord, new_id
from agent.errors import DecisionLogError

_DEVICE = "bench-device-0001"


def sample_record(i: int, t: float) -> DecisionRecord:
    """A decision with the fields and sizes a detection line produces (no thumbnail)."""
    return DecisionRecord(
        capture_time=t - 0.012,
        decision_time=t,
        source=f"cam-line3-{i % 4}",
        line="line-3",
        model_name="surface-defects",
        model_version="2026.11.3",
        bundle_digest="sha256:" + "9f2c" * 16,
        backend="onnxruntime:CPUExecutionProvider",
        config_hash="c0ffee" * 2,
        input_digest=f"{i:016x}" * 4,
        outputs={
            "label": "scratch" if i % 7 == 0 else "ok",
            "score": 0.912 - (i % 100) / 1000,
            "boxes": [[12, 40, 64, 32, 0.91, 1], [300, 120, 18, 22, 0.55, 2]],
        },
        outcome="reject" if i % 7 == 0 else "pass",
        thresholds={"reject": 0.8, "review": 0.5},
        latencies_ms={
            "capture": 1.2,
            "preprocess": 2.4,
            "infer": 6.1,
            "postprocess": 0.9,
            "policy": 0.1,
            "e2e": 11.3,
        },
    )


def bench_writer(tmp_dir: Path, rows: int = 100_000) -> dict[str, float]:
    """Sustained rows/s of DecisionLog and of raw executemany of the same rows.

    The writer figure runs from the first ``append`` to the ``flush`` that commits the
    last row; the records are built beforehand (that is the caller's cost) and the
    queue bound is raised to hold them all, so none is dropped. The raw
    figure inserts the already encoded rows with ``executemany``, ``batch_size`` rows a
    transaction, into a new database with the same schema and pragmas.

    Raises:
        DecisionLogError: the writer did not commit every row.
    """
    tmp_dir = Path(tmp_dir)
    config = DecisionLogConfig(queue_bound=max(20_000, rows + 1), thumbnails="none")
    t0 = time.time()
    records = [sample_record(i, t0 + i * 1e-4) for i in range(rows)]
    encoded = [
        row_of(_with_id(sample_record(i, t0 + i * 1e-4)), _DEVICE, None) for i in range(rows)
    ]

    log = DecisionLog(tmp_dir / "writer", config, device_id=_DEVICE)
    log.open()
    try:
        start = time.perf_counter()
        for record in records:
            log.append(record)
        append_s = time.perf_counter() - start
        if not log.flush(timeout_s=600):
            raise DecisionLogError("bench: the writer did not flush within 600 s")
        writer_s = time.perf_counter() - start
        written = log.stats()["written"]
    finally:
        log.close()
    if written != rows:
        raise DecisionLogError(f"bench: the writer committed {written} of {rows} rows")

    raw_dir = tmp_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    conn = connect_writer(raw_dir / "raw.db")
    try:
        schema.migrate(conn)
        step = config.batch_size
        start = time.perf_counter()
        for i in range(0, rows, step):
            with transaction(conn):
                conn.executemany(schema.INSERT_SQL, encoded[i : i + step])
        raw_s = time.perf_counter() - start
    finally:
        conn.close()

    writer_rate = rows / writer_s
    raw_rate = rows / raw_s
    return {
        "rows": float(rows),
        "writer_rows_per_s": writer_rate,
        "raw_executemany_rows_per_s": raw_rate,
        "ratio": writer_rate / raw_rate,
        "append_us": append_s / rows * 1e6,
    }


def _with_id(record: DecisionRecord) -> DecisionRecord:
    record.id = new_id(record.decision_time)
    return record
