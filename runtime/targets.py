"""The runtime's performance targets, measured as ratios against the bare runtime.

One round measures, on the same model and input:

1. the bare runtime (one session, 1 thread, tight loop): p50, p99, throughput;
2. the bare runtime with ``intra_op_num_threads=2``: throughput;
3. the pool with 1 worker and with 2 pinned workers, closed loop: throughput
   (capacity);
4. the pool with 2 workers, open loop at half of capacity: p50, p99, p99.9, and the
   p50 of each stage of a request (where the pool's extra time goes);
5. the pool with 2 workers, queue bound B, open loop at 1.2 x capacity: the
   accepted requests' p99 and how many were refused;
6. the ``inline`` mode (one lane, the sending thread runs the session), open loop at
   half of the bare runtime's throughput: p50, p99.

The pool runs as ``config`` says (pipelining, spin; by default the x86-gateway
profile's choice). Several rounds give the median of each figure. The targets (issue 15):

- pool p50 <= bare p50 + 0.10 ms and pool p99 <= 1.3 x bare p99 at half capacity;
- 2 workers >= 1.85 x 1 worker, and >= one session with 2 intra-op threads;
- at 1.2 x capacity, accepted p99 <= (B + 1) x service time (bare p50), excess refused;
- inline: p50 <= bare p50 + 0.10 ms and p99 <= 1.3 x bare p99 (reported beside them).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.bench import measure_bare, run_closed_loop, run_open_loop, sample_input
from runtime.config import ModelConfig, PoolConfig
from runtime.pool import WorkerPool


@dataclass(frozen=True)
class Target:
    name: str
    measured: str
    goal: str
    met: bool


def one_round(
    path: str,
    input_shapes: dict[str, tuple[int, ...]],
    *,
    duration_s: float,
    queue_bound: int,
    progress: bool,
    config: PoolConfig | None = None,
) -> dict[str, float]:
    """Measure every figure once."""
    base = dataclasses.replace(config or PoolConfig(), execution_mode="pool")
    model = ModelConfig("model", path, input_shapes=input_shapes, queue_bound=queue_bound)
    figures: dict[str, float] = {}
    with WorkerPool([model], dataclasses.replace(base, workers=1)) as pool1:
        inputs = sample_input(list(pool1.models[0].inputs))
        bare = measure_bare(path, inputs, duration_s=duration_s, progress=progress)
        bare2 = measure_bare(path, inputs, threads=2, duration_s=duration_s, progress=progress)
        one = run_closed_loop(pool1, "model", inputs, duration_s=duration_s, progress=progress)
    figures.update(
        bare_p50_ms=bare.latency["p50_ms"],
        bare_p99_ms=bare.latency["p99_ms"],
        bare_p999_ms=bare.latency["p999_ms"],
        bare_throughput_rps=bare.throughput_rps,
        bare2_throughput_rps=bare2.throughput_rps,
        one_worker_rps=one.throughput_rps,
    )
    with WorkerPool([model], dataclasses.replace(base, workers=2)) as pool:
        cap = run_closed_loop(pool, "model", inputs, duration_s=duration_s, progress=progress)
        capacity = cap.throughput_rps
        pool.reset_metrics()
        half = run_open_loop(
            pool, "model", inputs, capacity / 2, duration_s=duration_s * 1.5, progress=progress
        )
        stages = pool.stats()["models"]["model"]["stages"]
        figures.update({f"stage_{k}_p50_ms": v["p50_ms"] for k, v in stages.items()})
        figures.update({f"stage_{k}_p99_ms": v["p99_ms"] for k, v in stages.items()})
        over = run_open_loop(
            pool, "model", inputs, capacity * 1.2, duration_s=duration_s * 1.5, progress=progress
        )
    figures.update(
        two_worker_rps=capacity,
        half_rate_rps=capacity / 2,
        pool_p50_ms=half.latency["p50_ms"],
        pool_p99_ms=half.latency["p99_ms"],
        pool_p999_ms=half.latency["p999_ms"],
        pool_max_ms=half.latency["max_ms"],
        over_rate_rps=capacity * 1.2,
        over_p99_ms=over.latency["p99_ms"],
        over_refused_frac=over.refused / over.sent if over.sent else 0.0,
        over_failed=float(over.failed + half.failed),
    )
    inline_cfg = dataclasses.replace(base, workers=1, execution_mode="inline")
    with WorkerPool([model], inline_cfg) as inline:
        rate = bare.throughput_rps / 2
        run = run_open_loop(
            inline, "model", inputs, rate, duration_s=duration_s * 1.5, progress=progress
        )
    figures.update(
        inline_rate_rps=rate,
        inline_p50_ms=run.latency["p50_ms"],
        inline_p99_ms=run.latency["p99_ms"],
    )
    return figures


def median_figures(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def check(fig: dict[str, float], queue_bound: int) -> list[Target]:
    bound_ms = (queue_bound + 1) * fig["bare_p50_ms"]
    excess = 1 - 1 / 1.2
    return [
        Target(
            "pool p50 <= bare p50 + 0.10 ms (half capacity)",
            f"{fig['pool_p50_ms']:.3f} vs {fig['bare_p50_ms']:.3f} ms "
            f"(+{fig['pool_p50_ms'] - fig['bare_p50_ms']:.3f})",
            f"<= {fig['bare_p50_ms'] + 0.10:.3f} ms",
            fig["pool_p50_ms"] <= fig["bare_p50_ms"] + 0.10,
        ),
        Target(
            "pool p99 <= 1.3 x bare p99 (half capacity)",
            f"{fig['pool_p99_ms']:.3f} vs {fig['bare_p99_ms']:.3f} ms "
            f"(x{fig['pool_p99_ms'] / fig['bare_p99_ms']:.2f})",
            f"<= {1.3 * fig['bare_p99_ms']:.3f} ms",
            fig["pool_p99_ms"] <= 1.3 * fig["bare_p99_ms"],
        ),
        Target(
            "2 pinned workers >= 1.85 x 1 worker",
            f"{fig['two_worker_rps']:.0f} vs {fig['one_worker_rps']:.0f} rps "
            f"(x{fig['two_worker_rps'] / fig['one_worker_rps']:.2f})",
            f">= {1.85 * fig['one_worker_rps']:.0f} rps",
            fig["two_worker_rps"] >= 1.85 * fig["one_worker_rps"],
        ),
        Target(
            "2 pinned workers >= 1 session with 2 threads",
            f"{fig['two_worker_rps']:.0f} vs {fig['bare2_throughput_rps']:.0f} rps",
            f">= {fig['bare2_throughput_rps']:.0f} rps",
            fig["two_worker_rps"] >= fig["bare2_throughput_rps"],
        ),
        Target(
            f"1.2 x capacity: accepted p99 <= (B+1) x service (B={queue_bound})",
            f"{fig['over_p99_ms']:.3f} ms",
            f"<= {bound_ms:.3f} ms",
            fig["over_p99_ms"] <= bound_ms,
        ),
        Target(
            "1.2 x capacity: the excess is refused, not queued",
            f"{100 * fig['over_refused_frac']:.1f} % refused",
            f">= {100 * excess * 0.5:.1f} % (offered excess {100 * excess:.1f} %)",
            fig["over_refused_frac"] >= excess * 0.5,
        ),
        Target(
            "inline p50 <= bare p50 + 0.10 ms (half of one core)",
            f"{fig['inline_p50_ms']:.3f} ms (+{fig['inline_p50_ms'] - fig['bare_p50_ms']:.3f})",
            f"<= {fig['bare_p50_ms'] + 0.10:.3f} ms",
            fig["inline_p50_ms"] <= fig["bare_p50_ms"] + 0.10,
        ),
        Target(
            "inline p99 <= 1.3 x bare p99 (half of one core)",
            f"{fig['inline_p99_ms']:.3f} ms (x{fig['inline_p99_ms'] / fig['bare_p99_ms']:.2f})",
            f"<= {1.3 * fig['bare_p99_ms']:.3f} ms",
            fig["inline_p99_ms"] <= 1.3 * fig["bare_p99_ms"],
        ),
    ]


def run_targets(
    path: str,
    input_shapes: dict[str, tuple[int, ...]],
    *,
    rounds: int = 5,
    duration_s: float = 3.0,
    queue_bound: int = 4,
    progress: bool = True,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    config: PoolConfig | None = None,
) -> dict[str, Any]:
    """Measure ``rounds`` times; return the per-round figures, medians and targets."""
    results = []
    for i in range(rounds):
        fig = one_round(
            path,
            input_shapes,
            duration_s=duration_s,
            queue_bound=queue_bound,
            progress=progress,
            config=config,
        )
        results.append(fig)
        if on_round is not None:
            on_round(i, fig)
    med = median_figures(results)
    targets = check(med, queue_bound)
    return {
        "model": path,
        "rounds": results,
        "median": med,
        "queue_bound": queue_bound,
        "pipelining": (config or PoolConfig()).pipelining,
        "spin_us": (config or PoolConfig()).spin_us,
        "targets": [t.__dict__ for t in targets],
        "all_met": all(t.met for t in targets),
    }


def format_targets(report: dict[str, Any]) -> str:
    med = report["median"]
    n = len(report["rounds"])
    lines = [
        f"model: {report['model']}   rounds: {n} (median shown)",
        "",
        f"{'':28}{'bare':>12}{'pool':>12}",
        f"{'p50 ms (half capacity)':28}{med['bare_p50_ms']:12.3f}{med['pool_p50_ms']:12.3f}",
        f"{'p99 ms (half capacity)':28}{med['bare_p99_ms']:12.3f}{med['pool_p99_ms']:12.3f}",
        f"{'p99.9 ms (half capacity)':28}{med['bare_p999_ms']:12.3f}{med['pool_p999_ms']:12.3f}",
        f"{'throughput rps, 1 thread':28}{med['bare_throughput_rps']:12.0f}"
        f"{med['one_worker_rps']:12.0f}",
        f"{'throughput rps, 2 threads':28}{med['bare2_throughput_rps']:12.0f}"
        f"{med['two_worker_rps']:12.0f}",
        f"{'inline p50 / p99 ms':28}{med['inline_p50_ms']:12.3f}{med['inline_p99_ms']:12.3f}",
        "",
        "pool stages at half capacity, p50 / p99 ms: "
        + ", ".join(
            f"{k[6:-7]} {med[k]:.3f}/{med[k[:-7] + '_p99_ms']:.3f}"
            for k in med
            if k.startswith("stage_") and k.endswith("_p50_ms")
        ),
        "",
        f"{'target':58} {'measured':34} {'goal':26} ok",
    ]
    for t in report["targets"]:
        mark = "yes" if t["met"] else "NO"
        lines.append(f"{t['name']:58} {t['measured']:34} {t['goal']:26} {mark}")
    return "\n".join(lines)
