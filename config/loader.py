"""Load :class:`config.settings.Settings` from defaults < TOML file < environment < flags.

Invalid configuration raises :class:`ConfigError` with one line per problem, naming the field path, the
reason and the value given, so a daemon can print it and exit before doing anything.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from trimtab.config.settings import Settings
from trimtab.errors import ConfigError

CONFIG_ENV = "TRIMTAB_CONFIG"


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e


def _format(err: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        shown = "" if isinstance(given, dict) or given is None else f" (got {given!r})"
        lines.append(f"  {loc}: {msg}{shown}")
    return "\n".join(lines)


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Put ``value`` at ``a.b.c`` in a nested dict (flags like ``--set shedding.target_std=0.3``)."""
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {p} is not a section")
    node[parts[-1]] = value


def load_with_flags(path: str | None, sets: list[str], flags: Mapping[str, Any]) -> Settings:
    """The settings of a command line: the file, then ``--set`` assignments, then named flags (dotted path ->
    value, None = not given); :class:`ConfigError` when invalid. Every command (daemons, pipeline) uses it."""
    overrides = parse_assignments(sets)
    for dotted, value in flags.items():
        if value is not None:
            set_path(overrides, dotted, value)
    return load_settings(path, overrides)


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c.d=[\\"x\\"]"]`` -> nested dict; values are parsed as TOML when they can be."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.field=value")
        key, raw = item.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        set_path(out, key.strip(), value)
    return out


def load_settings(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: bool = True,
) -> Settings:
    """Build the effective settings. ``path`` defaults to ``$TRIMTAB_CONFIG`` when set."""
    if path is None:
        path = os.environ.get(CONFIG_ENV) or None
    file_data = _read_file(Path(path)) if path else {}
    origin = f"defaults < {path or 'no file'} < environment < flags"

    class _Effective(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings]
            if environ:
                sources.append(env_settings)
            sources.append(_FileSource(settings_cls, file_data))
            return tuple(sources)

    try:
        eff = _Effective(**dict(overrides or {}))
        # Re-validate as the public type so callers never see the local subclass.
        return Settings.model_validate(eff.model_dump())
    except ValidationError as e:
        raise ConfigError(_format(e, origin)) from None
