"""Settings are layered with one deep merge everywhere (issue 30, point 6): the regression of ``trimtab dev
up``, which merged one level deep -- a config file's ``broker.adapter.{kind,url}`` was lost to ``--set
broker.adapter.timeout_s=3`` -- run through the real command line down to the config file the local
cluster's nodes read; and the command-line plumbing every command shares (tests/property/
test_settings_merge_props.py has the merge's properties)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO

import pytest
from click.testing import CliRunner

from trimtab.cli.common import settings_layers, write_atomically
from trimtab.cli.main import main
from trimtab.config.loader import load_settings
from trimtab.devkit.localcluster import ClusterError, LocalCluster

CONFIG = """\
[broker.adapter]
kind = "webhook"
url = "http://127.0.0.1:9/broker"

[shedding]
target_std = 0.2
"""


class _Started(ClusterError):
    """Raised by the stand-in start once the cluster's config file is written: nothing more to run."""


@pytest.fixture
def no_processes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """``LocalCluster.start`` that writes the nodes' config file exactly as the real one does, with
    stand-ins for ZooKeeper and Kafka, and stops there; the paths of the files it wrote."""
    written: list[Path] = []

    def start(self: LocalCluster, timeout: float = 90.0) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.zk = SimpleNamespace(hosts="127.0.0.1:2181", stop=lambda: None)  # type: ignore[assignment]
        self.kafka = SimpleNamespace(  # type: ignore[assignment]
            bootstrap_servers="127.0.0.1:9092", security="plaintext", close=lambda: None
        )
        self._write_config()
        written.append(self.config_path)
        raise _Started("config written")

    monkeypatch.setattr(LocalCluster, "start", start)
    return written


def test_dev_up_keeps_the_files_sibling_settings_under_a_set(
    tmp_path: Path, no_processes: list[Path]
) -> None:
    config = tmp_path / "dev.toml"
    config.write_text(CONFIG)
    args = ["dev", "up", "--config", str(config), "--set", "broker.adapter.timeout_s=3", "--no-prometheus"]
    args += ["--workdir", str(tmp_path / "work"), "--state-file", str(tmp_path / "state.json"), "--no-view"]
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, _Started), result.output
    (written,) = no_processes
    s = load_settings(written, environ=False)  # what every node of the dev cluster reads
    adapter = s.broker.adapter
    assert (adapter.kind, adapter.url, adapter.timeout_s) == ("webhook", "http://127.0.0.1:9/broker", 3.0)
    assert s.shedding.target_std == 0.2  # another section of the file, untouched
    assert s.sim.msg_rate_per_topic == 60.0  # and dev up's own layer under them


def test_settings_layers_merges_the_set_assignments_deeply(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    got = settings_layers(str(config), ("broker.adapter.timeout_s=3", "broker.id=b1:1"))
    assert got["broker"] == {
        "adapter": {"kind": "webhook", "url": "http://127.0.0.1:9/broker", "timeout_s": 3},
        "id": "b1:1",
    }
    assert got["shedding"] == {"target_std": 0.2}


@pytest.mark.parametrize(
    ("text", "sets", "needle"),
    [
        (None, ("a.b",), "expected section.field=value"),
        ("[broker\n", (), "is not valid TOML"),
        ("", ("shedding=1", "shedding.target_std=0.3"), "shedding is not a section"),
    ],
)
def test_dev_up_refuses_settings_it_cannot_read_as_a_usage_error(
    tmp_path: Path, text: str | None, sets: tuple[str, ...], needle: str
) -> None:
    args = ["dev", "up", "--workdir", str(tmp_path / "w"), "--no-prometheus"]
    if text is not None:
        (tmp_path / "c.toml").write_text(text)
        args += ["--config", str(tmp_path / "c.toml")]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and needle in result.output, result.output
    assert not (tmp_path / "w").exists()  # refused before anything was started or removed


def test_a_file_written_atomically_is_whole_or_not_there(tmp_path: Path) -> None:
    dest = tmp_path / "export.jsonl"
    dest.write_bytes(b"the previous export\n")

    def fails(out: BinaryIO) -> int:
        out.write(b"half of it")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(dest, fails)
    assert dest.read_bytes() == b"the previous export\n" and os.listdir(tmp_path) == ["export.jsonl"]

    def writes(out: BinaryIO) -> Any:
        out.write(b"all of it\n")
        return 7

    assert write_atomically(dest, writes) == 7
    assert dest.read_bytes() == b"all of it\n" and os.listdir(tmp_path) == ["export.jsonl"]
