"""The installer's settings (an ``[installer]`` section when the agent config has one)."""

from __future__ import annotations

from pydantic import Field

from agent.kernel.configbase import MAX_QUEUE, MAX_TIMEOUT_S, Section


class InstallerConfig(Section):
    """How an install checks a bundle before and after the switch."""

    benchmark_runs: int = Field(
        30, ge=5, le=10_000, description="Inferences of the sample in the self-benchmark."
    )
    run_timeout_s: float = Field(
        10.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=(
            "Longest wait for one inference during the checks, and for a first live one "
            "after the health window when frames came and none was decided."
        ),
    )
    health_window_s: float = Field(
        60.0,
        ge=0,
        le=MAX_TIMEOUT_S,
        description="How long the new bundle runs on trial after the switch.",
    )
    health_poll_s: float = Field(
        1.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="How often the health probe is read during the window.",
    )
    max_worker_crashes: int = Field(
        0, ge=0, le=MAX_QUEUE, description="Worker crashes the health window tolerates."
    )
    max_inference_errors: int = Field(
        0, ge=0, le=MAX_QUEUE, description="Inference errors the health window tolerates."
    )
    lock_timeout_s: float = Field(
        5.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="How long an install waits for another one on the same bundle.",
    )
