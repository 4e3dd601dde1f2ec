"""What every ``trimtab`` command line shares, defined once: the ``--config`` and ``--set`` options, how
a command turns them into settings (exit 2 with the problems when they are invalid), and how a command
writes a file that must never be seen half-written.

Used by ``trimtab.cli`` and by ``trimtab.cli.pipeline`` (which may not import ``trimtab.cli``: the
import contracts in pyproject.toml). Imports only click at import time: the settings' modules are loaded
by the first command that needs them, so ``trimtab --help`` does not pay for them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import click

from trimtab.errors import ConfigError

if TYPE_CHECKING:
    from trimtab.config.settings import Settings

T = TypeVar("T")

config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file ($TRIMTAB_CONFIG).",
)
set_option = click.option(
    "--set", "sets", multiple=True, metavar="SECTION.FIELD=VALUE", help="Override one setting (repeatable)."
)


def settings_from(config: str | None, sets: tuple[str, ...], **flags: Any) -> Settings:
    """The effective settings of a command: defaults < ``config`` (or ``$TRIMTAB_CONFIG``) < environment <
    ``--set`` < ``flags`` (dotted paths to values, None = not given). Invalid: the problems on stderr, exit
    2, before the command does anything."""
    from trimtab.config.loader import load_with_flags

    try:
        return load_with_flags(config, list(sets), flags)
    except ConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(2)


def settings_layers(config: str | None, sets: tuple[str, ...]) -> dict[str, Any]:
    """``config``'s settings with the ``--set`` assignments on top, as one nested dict, unvalidated: for a
    command that hands settings on to processes it starts (``trimtab dev up`` writes them into the local
    cluster's config file). Deep-merged (:func:`trimtab.config.merge.deep_merge`): ``--set
    broker.adapter.timeout_s=3`` keeps the file's ``broker.adapter.kind`` and ``url``."""
    from trimtab.config.loader import parse_assignments
    from trimtab.config.merge import deep_merge

    layer: dict[str, Any] = {}
    if config:
        try:
            layer = tomllib.loads(Path(config).read_text())
        except OSError as e:
            raise click.BadParameter(
                f"cannot read {config}: {e.strerror or e}", param_hint="--config"
            ) from None
        except tomllib.TOMLDecodeError as e:
            raise click.BadParameter(f"{config} is not valid TOML: {e}", param_hint="--config") from None
    try:
        return deep_merge(layer, parse_assignments(list(sets)))
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--set") from None


def write_atomically(path: Path, write: Callable[[BinaryIO], T]) -> T:
    """Call ``write`` with a file beside ``path`` and rename it into place only once it is complete and on
    disk: a failed or interrupted write never leaves a truncated file that looks whole (a channel export,
    a report), nor half of one over the previous version. Returns what ``write`` returns."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            result = write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return result
