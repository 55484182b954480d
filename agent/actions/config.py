"""Configuration of the actions: what to do with a decision (local MQTT, HTTP webhook)."""

from __future__ import annotations

import string
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from agent.kernel.configbase import MAX_TIMEOUT_S, Section
from agent.kernel.secrets import read_secret

PLACEHOLDERS = frozenset({"line", "source", "outcome"})
"""The names a topic template may use: ``{line}``, ``{source}``, ``{outcome}``."""

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_VARIABLE_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
# Headers the webhook sets itself, or that would put a secret in the config file.
_RESERVED_HEADERS = frozenset({"authorization", "content-length", "content-type", "host"})


def topic_placeholders(topic: str) -> set[str]:
    """The placeholder names in a topic template.

    Raises:
        ValueError: the template is malformed, uses a name outside :data:`PLACEHOLDERS`,
            a positional ``{}``, a conversion or a format spec, or an MQTT wildcard.
    """
    if not topic:
        raise ValueError("topic must not be empty")
    if topic.startswith("$"):
        raise ValueError(f"topic {topic!r} starts with '$', which is reserved for the broker")
    if len(topic.encode("utf-8")) > 65535:
        raise ValueError("topic is longer than 65535 bytes")
    names: set[str] = set()
    try:
        parts = list(string.Formatter().parse(topic))
    except ValueError as exc:
        raise ValueError(f"topic {topic!r} is not a valid template: {exc}") from exc
    for literal, field, spec, conversion in parts:
        if any(c in literal for c in "+#\0"):
            raise ValueError(f"topic {topic!r} contains a wildcard (+, #) or NUL")
        if field is None:
            continue
        if field not in PLACEHOLDERS:
            allowed = ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS))
            raise ValueError(f"topic {topic!r} uses {{{field}}}; allowed: {allowed}")
        if spec or conversion:
            raise ValueError(f"topic {topic!r}: {{{field}}} takes no conversion or format spec")
        names.add(field)
    return names


class _ActionBase(Section):
    name: str = Field(
        pattern=_NAME,
        description="Unique name of the action; the `action` label of its metrics.",
    )
    outcomes: list[str] = Field(
        default_factory=list,
        description="Outcomes this action fires on (pass, reject, ...); empty: every outcome.",
    )
    max_age_s: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=(
            "An event that waited longer than this in the action's queue is dropped "
            "(counted `dropped`) instead of reaching the robot late; unset: no limit."
        ),
    )

    def wants(self, outcome: str) -> bool:
        """Whether this action fires on ``outcome``."""
        return not self.outcomes or outcome in self.outcomes


class MqttAction(_ActionBase):
    """Publish the decision on a topic of the local broker (robot, PLC)."""

    kind: Literal["mqtt"] = Field("mqtt", description="Selects this action type.")
    topic: str = Field(
        description=(
            "Topic to publish on; may contain {line}, {source} and {outcome}, "
            "e.g. `factory/{line}/{source}/{outcome}`."
        )
    )
    qos: Literal[0, 1, 2] = Field(1, description="MQTT QoS of the publish.")
    retain: bool = Field(
        False, description="Set the retain flag, so a late subscriber gets the last decision."
    )
    ack_timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description=(
            "A publish not acknowledged (QoS 1/2) or written (QoS 0) within this time, "
            "counting any wait for the broker connection, is counted as a timeout or failure."
        ),
    )

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, topic: str) -> str:
        topic_placeholders(topic)
        return topic


class WebhookAction(_ActionBase):
    """POST the decision as JSON to an HTTP(S) endpoint."""

    kind: Literal["webhook"] = Field("webhook", description="Selects this action type.")
    url: str = Field(description="http:// or https:// URL the JSON is POSTed to.")
    timeout_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="Socket timeout of the connect and of each read; beyond it: a timeout.",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra request headers. Authorization, Content-Type, Content-Length and Host "
            "are not allowed here (use token_env for a bearer token)."
        ),
    )
    token_env: str | None = Field(
        None,
        pattern=_VARIABLE_NAME,
        description=(
            "Name of the environment variable (or file in $CREDENTIALS_DIRECTORY) that "
            "holds a bearer token; never the token itself."
        ),
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r} must be http:// or https:// with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"url {url!r} carries credentials; use token_env")
        return url

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for key, value in headers.items():
            if not key or any(c in key for c in "\r\n: \t") or any(c in value for c in "\r\n"):
                raise ValueError(f"header {key!r} has an invalid name or value")
            if key.lower() in _RESERVED_HEADERS:
                raise ValueError(f"header {key!r} is set by the agent and can't be configured")
        return headers

    def token(self) -> str | None:
        """The bearer token from $CREDENTIALS_DIRECTORY/<token_env> or the environment."""
        return read_secret(self.token_env) if self.token_env else None


ActionConfig = Annotated[MqttAction | WebhookAction, Field(discriminator="kind")]


class ActionsConfig(Section):
    """The actions run on each decision, each with its own bounded queue and thread."""

    queue_bound: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Capacity of each action's queue; an event beyond it is dropped and counted.",
    )
    actions: list[ActionConfig] = Field(
        default_factory=list, description="The actions, by `kind` (mqtt or webhook)."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> ActionsConfig:
        seen: set[str] = set()
        for action in self.actions:
            if action.name in seen:
                raise ValueError(f"action name {action.name!r} is used twice")
            seen.add(action.name)
        return self
