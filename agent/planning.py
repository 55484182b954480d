"""Planning the agent's pipelines: which bundle directories each one runs (the config's,
or the installer's active slots), loaded and checked against this device's profile,
with the policy that applies. Pure of threads and processes; :mod:`agent.app` runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.config import AgentConfig, PipelineConfig
from agent.errors import AgentError
from agent.installer import Installer
from agent.kernel.bundle import Bundle, load_bundle
from agent.kernel.errors import EdgefleetError
from agent.policy import PolicySpec, parse_policy
from runtime.profiles import load_profile


@dataclass
class Problem:
    """Something that did not start, with the part and the reason (shown by health)."""

    part: str
    reason: str


@dataclass
class Plan:
    """A pipeline whose bundles loaded: its stages' bundles and model names."""

    config: PipelineConfig
    bundles: list[Bundle]
    models: list[str]
    policy: PolicySpec
    line: str
    max_crops: list[int] = field(default_factory=list)
    padding: list[float] = field(default_factory=list)


def pipeline_policy(cfg: AgentConfig, p: PipelineConfig, first: Bundle) -> PolicySpec:
    """The pipeline's own policy, else its line's, else the bundle's defaults."""
    if p.policy is not None:
        return p.policy
    line = cfg.lines.get(cfg.source_line(p.source))
    if line is not None and line.policy is not None:
        return line.policy
    return parse_policy(first.manifest.policy or {}, str(first.path / "manifest.json"))


Resolver = Callable[[PipelineConfig], list[Path]]
"""Gives a pipeline's bundle directories, first stage first (e.g. the installer's active
slots); by default the paths in the config."""


def config_bundles(p: PipelineConfig) -> list[Path]:
    """The bundle directories named in the config (no installer)."""
    out = []
    for ref in (p, *p.chain):
        if ref.bundle is None:
            raise AgentError(f"bundle '{ref.installed}' is managed by the installer")
        out.append(ref.bundle)
    return out


def installed_resolver(installer: Installer) -> Resolver:
    """A stage naming an installed bundle gets its active slot; until one is installed,
    the configured directory (if any)."""

    def resolve(p: PipelineConfig) -> list[Path]:
        out = []
        for ref in (p, *p.chain):
            path = installer.active_bundle(ref.installed) if ref.installed else None
            path = path or ref.bundle
            if path is None:
                raise AgentError(f"no bundle '{ref.installed}' installed yet")
            out.append(path)
        return out

    return resolve


def plan_pipelines(
    cfg: AgentConfig, resolve: Resolver | None = None
) -> tuple[list[Plan], list[Problem]]:
    """Load every pipeline's bundles; a pipeline whose bundle fails to load or does not
    list this device's firmware profile is left out."""
    plans: list[Plan] = []
    problems: list[Problem] = []
    profile = load_profile(cfg.agent.profile).name
    for p in cfg.pipelines:
        try:
            bundles = [load_bundle(path) for path in (resolve or config_bundles)(p)]
            for b in bundles:
                b.check_profile(profile)
            policy = pipeline_policy(cfg, p, bundles[0])
        except EdgefleetError as e:
            problems.append(Problem(f"pipeline {p.name}", str(e)))
            continue
        models = [f"{p.name}.{i}" for i in range(len(bundles))]
        plans.append(
            Plan(
                p,
                bundles,
                models,
                policy,
                cfg.source_line(p.source),
                [1, *(s.max_crops for s in p.chain)],
                [0.0, *(s.padding for s in p.chain)],
            )
        )
    return plans, problems
