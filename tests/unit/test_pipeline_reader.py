"""The Kafka reader choice of the pipeline (``--reader python|connector``, docs/pipeline.md): the connector's
pinned version agrees with its pom and PySpark's Scala, a missing jar is one line naming scripts/setup.sh,
and the CLI's default is the one the code configures (``sources.DEFAULT_READER``)."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest
from click.testing import CliRunner

from trimtab.cli.main import main
from trimtab.pipeline import session, sources
from trimtab.pipeline.common import PipelineError

ROOT = Path(__file__).resolve().parents[2]


def test_the_pom_pins_the_connector_version_the_code_uses_for_pysparks_scala() -> None:
    pom = (ROOT / "devkit" / "spark" / "pom.xml").read_text()
    assert re.search(r"<connector.version>(.*)</connector.version>", pom)[1] == session.CONNECTOR_VERSION  # type: ignore[index]
    scala = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("scala-library-*.jar")}
    assert len(scala) == 1
    binary = re.fullmatch(r"scala-library-(\d+\.\d+)\.\d+\.jar", scala.pop())[1]  # type: ignore[index]
    assert (
        session.CONNECTOR_ARTIFACT.endswith(f"_{binary}")
        and f"<artifactId>{session.CONNECTOR_ARTIFACT}" in pom
    )
    # Same major version as the installed PySpark (the exact one when Maven Central has it).
    assert session.CONNECTOR_VERSION.split(".")[0] == pyspark.__version__.split(".")[0]


def test_missing_connector_jars_are_one_line_naming_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(session.CONNECTOR_ENV, str(tmp_path))
    with pytest.raises(PipelineError) as e:
        session.connector_jars()
    assert "\n" not in str(e.value) and "bash scripts/setup.sh" in str(e.value)
    (tmp_path / f"{session.CONNECTOR_ARTIFACT}-{session.CONNECTOR_VERSION}.jar").write_bytes(b"PK")
    (tmp_path / "kafka-clients-3.9.2.jar").write_bytes(b"PK")
    jars = session.connector_jars()
    assert len(jars) == 2
    conf = session.with_connector({"spark.jars": "/x/own.jar"})
    assert conf["spark.jars"].split(",") == ["/x/own.jar", *jars]


@pytest.mark.parametrize("given", [["--reader", "connector"], ["--kafka-source", "spark"], []])
def test_the_cli_reader_and_its_configured_default(
    given: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No jars: asking for the connector fails before Spark starts, with the one line. Without --reader the
    command takes ``sources.DEFAULT_READER`` (made the connector here, so the same line proves it)."""
    monkeypatch.setenv(session.CONNECTOR_ENV, str(tmp_path / "none"))
    monkeypatch.setattr(sources, "DEFAULT_READER", "connector")
    r = CliRunner().invoke(
        main,
        ["pipeline", "ingest", "--out", str(tmp_path / "h"), "--bootstrap-servers", "127.0.0.1:1", *given],
    )
    assert r.exit_code == 1, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "bash scripts/setup.sh" in lines[0], r.output
    assert sources.reader_name(None) == "connector" and sources.reader_name("spark") == "connector"
    with pytest.raises(PipelineError):
        sources.reader_name("kafka")


def test_the_connector_refuses_librdkafka_only_security_settings() -> None:
    """The Java client would ignore them and never connect: one line saying which, and what to use."""
    with pytest.raises(PipelineError) as e:
        sources.spark_connector_frame(
            None,  # type: ignore[arg-type]  # refused before any Spark call
            "127.0.0.1:9092",
            "t",
            {0: (0, 5)},
            {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"},
        )
    assert (
        "\n" not in str(e.value) and "ssl.ca.location" in str(e.value) and "--reader python" in str(e.value)
    )
