"""Scenario files for ``trimtab sim`` (docs/simulator.md): what cluster, what load, what happens when.

A scenario is YAML (or JSON) read as hostile input: unknown fields, wrong types and impossible values are
refused with the field's path (``events.2.kill: ...``), and the ``config`` overrides are validated by the
daemons' own settings model, under the same names (``shedding.interval_s``). The minimal form::

    seed: 1
    duration_s: 600
    brokers: {count: 5}
    namespaces: [{name: public/ns, bundles: 100, topics: 10000, msg_rate: 200000, skew: 1.1}]
    events: [{at_s: 60, add_brokers: 5}]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trimtab.channel.bundles import validate_namespace
from trimtab.config.loader import load_settings
from trimtab.config.settings import Settings
from trimtab.errors import BundleError, ConfigError

POLICIES = ("transfer", "threshold", "legacy-overload", "legacy-threshold", "legacy-uniform", "none")
Policy = Literal["transfer", "threshold", "legacy-overload", "legacy-threshold", "legacy-uniform", "none"]
_BROKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")

Seconds = Annotated[float, Field(ge=0, le=30 * 86400, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BrokerSpec(_Closed):
    id: str
    tags: dict[str, str] = Field(default_factory=dict)
    domain: str | None = None
    capacity_msg_rate: Positive | None = None  # default: sim.capacity_msg_rate

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _BROKER_ID.match(v):
            raise ValueError("broker ids are 1-128 characters of letters, digits and _.:-")
        return v


class BrokerCount(_Closed):
    count: int = Field(ge=1, le=10_000)


class Diurnal(_Closed):
    """Load multiplier ``1 + amplitude * sin(2 pi (t + phase_s) / period_s)``."""

    amplitude: float = Field(ge=0, lt=1)
    period_s: Positive = 86400.0
    phase_s: Seconds = 0.0


class NamespaceSpec(_Closed):
    name: str
    bundles: int = Field(ge=1, le=100_000)
    topics: int = Field(ge=1, le=1_000_000)
    msg_rate: float = Field(ge=0, allow_inf_nan=False, description="msg/s in (out is the same), all topics")
    skew: float = Field(1.1, ge=0, le=5, description="Zipf exponent of topic rates (0 = uniform)")
    hot_topic_share: float | None = Field(
        None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="One topic (t-000000) carries this share of the namespace's rate; the others share the "
        "rest by the Zipf skew (Pulsar #3419: a hot topic that no split by range helps)",
    )
    diurnal: Diurnal | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return validate_namespace(v)
        except BundleError as e:
            raise ValueError(str(e)) from e


class Event(_Closed):
    """One thing that happens at ``at_s``; exactly one action field is set."""

    at_s: Seconds
    add_brokers: int | None = Field(None, ge=1, le=10_000)
    remove_brokers: int | None = Field(None, ge=1, le=10_000, description="drained, then gone")
    kill: int | None = Field(None, ge=1, le=10_000, description="brokers die with their agents (kill -9)")
    pause: int | None = Field(None, ge=1, le=10_000, description="agents paused for duration_s (SIGSTOP)")
    restart: int | None = Field(None, ge=1, le=10_000, description="rolling restart: drain, down, back")
    load_scale: dict[str, Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]] | None = None
    zookeeper_outage: bool | None = None
    kafka_outage: bool | None = None
    duration_s: Seconds | None = Field(None, description="pause and outages: how long")
    within_s: Seconds = Field(0.0, description="restart: spread the brokers over this long")
    down_s: Seconds = Field(10.0, description="restart: how long each broker is away")

    ACTIONS: ClassVar[tuple[str, ...]] = (
        "add_brokers",
        "remove_brokers",
        "kill",
        "pause",
        "restart",
        "load_scale",
        "zookeeper_outage",
        "kafka_outage",
    )

    @model_validator(mode="after")
    def _one_action(self) -> Event:
        set_ = [a for a in self.ACTIONS if getattr(self, a) is not None]
        if len(set_) != 1:
            raise ValueError(
                f"an event needs exactly one of {', '.join(self.ACTIONS)} (got {set_ or 'none'})"
            )
        if set_[0] in ("pause", "zookeeper_outage", "kafka_outage") and not self.duration_s:
            raise ValueError(f"{set_[0]} needs duration_s > 0")
        if self.load_scale is not None:
            for ns in self.load_scale:
                try:
                    validate_namespace(ns)
                except BundleError as e:
                    raise ValueError(str(e)) from e
        return self

    @property
    def action(self) -> str:
        return next(a for a in self.ACTIONS if getattr(self, a) is not None)


class ChannelFaults(_Closed):
    """Channel misbehaviour, applied to every record produced inside [from_s, until_s)."""

    duplicate_p: float = Field(0.0, ge=0, le=1, description="a record is appended twice")
    reorder_p: float = Field(0.0, ge=0, le=1, description="a record swaps places with the next one")
    race_p: float = Field(0.0, ge=0, le=1, description="a lookup of an unowned bundle races a second agent's")
    from_s: Seconds = 0.0
    until_s: Seconds = 30 * 86400.0


class Model(_Closed):
    """What the real cluster does between decisions, in virtual seconds."""

    acquire_s: Seconds = Field(0.2, description="a broker takes over a bundle (cold)")
    release_s: Seconds = Field(0.05, description="a broker fences or closes a bundle")
    split_s: Seconds = Field(0.2, description="a broker splits a bundle in place")
    channel_s: Seconds = Field(0.01, description="a record reaches every node")
    lookup_retry_s: Seconds = Field(0.5, description="clients of an unserved bundle look it up again")
    capacity_msg_rate: Positive = Field(
        50_000.0, description="msg/s (in+out) at which a broker reads 100% CPU"
    )
    msg_size_bytes: int = Field(1024, ge=1)
    sessions_per_topic: int = Field(2, ge=0)


class ReportSpec(_Closed):
    balance_target_std: float | None = Field(
        None,
        gt=0,
        le=1,
        description="balanced when the load std is at most this; default shedding.target_std",
    )
    hold_samples: int = Field(3, ge=1, description="...for this many consecutive samples")
    sample_s: Positive = Field(10.0, description="how often the report samples broker loads")
    measure_from_s: Seconds | None = Field(
        None, description="time to balance counts from here; default the last event"
    )
    oscillation_window_s: Seconds = Field(600.0, description="a bundle moved twice within this oscillates")
    optimum: bool | None = Field(
        None, description="solve the exact minimum number of moves; default: small instances"
    )


class Scenario(_Closed):
    name: str = "scenario"
    description: str = ""
    seed: int = Field(1, ge=0, le=2**63 - 1)
    duration_s: Seconds = Field(gt=0)
    brokers: BrokerCount | list[BrokerSpec]
    namespaces: list[NamespaceSpec] = Field(min_length=1)
    events: list[Event] = Field(default_factory=list)
    policies: list[Policy] = Field(default_factory=lambda: list[Policy](["transfer"]), min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    model: Model = Field(default_factory=Model)
    faults: ChannelFaults | None = None
    report: ReportSpec = Field(default_factory=ReportSpec)

    @field_validator("brokers")
    @classmethod
    def _unique(cls, v: BrokerCount | list[BrokerSpec]) -> BrokerCount | list[BrokerSpec]:
        if isinstance(v, list):
            if not v:
                raise ValueError("at least one broker")
            ids = [b.id for b in v]
            if len(set(ids)) != len(ids):
                raise ValueError("broker ids must be unique")
        return v

    @model_validator(mode="after")
    def _checks(self) -> Scenario:
        names = [n.name for n in self.namespaces]
        if len(set(names)) != len(names):
            raise ValueError("namespace names must be unique")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("a policy is listed twice")
        for e in self.events:
            if e.load_scale:
                unknown = sorted(set(e.load_scale) - set(names))
                if unknown:
                    raise ValueError(f"load_scale names unknown namespaces {unknown}")
        self.settings()  # refuse bad config overrides now, with their names
        return self

    def settings(self) -> Settings:
        """The daemons' settings with this scenario's overrides (never the environment: runs must replay)."""
        try:
            return load_settings(None, self.config, environ=False)
        except ConfigError as e:
            raise ValueError(f"config: {e}") from e

    def broker_specs(self) -> list[BrokerSpec]:
        if isinstance(self.brokers, BrokerCount):
            return [BrokerSpec(id=f"broker-{i:03d}") for i in range(self.brokers.count)]
        return list(self.brokers)


def _path_of(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_scenario(data: object, source: str = "scenario") -> Scenario:
    """A scenario from decoded YAML/JSON; :class:`ConfigError` naming every bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a scenario is a mapping (got {type(data).__name__})")
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        lines = [f"  {_path_of(err['loc'])}: {err['msg']}" for err in e.errors(include_url=False)]
        raise ConfigError(f"{source}: invalid scenario\n" + "\n".join(lines)) from None


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read scenario: {e.strerror or e}") from None
    if len(text) > 4 << 20:
        raise ConfigError(f"{p}: scenario larger than 4 MiB")
    import yaml  # the sim extra (pip install 'trimtab[sim]'); JSON is valid YAML too

    class NoAliases(yaml.SafeLoader):
        """Aliases refused: a few kilobytes of nested aliases expand to billions of nodes when validated."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError("aliases (*name) are not allowed")
            return super().compose_node(parent, index)

    try:
        data = yaml.load(text.decode("utf-8"), Loader=NoAliases)  # a SafeLoader subclass
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{p}: not valid UTF-8 YAML: {e}") from None
    s = parse_scenario(data, str(p))
    if s.name == "scenario":
        s = s.model_copy(update={"name": p.stem})
    return s
