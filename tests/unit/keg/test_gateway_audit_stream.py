"""How the gateway hands the audit stream to its ext_proc workers: a spool of each one's
own, the fronted cluster reached with the gateway's own login and TLS, the password by
environment only. End to end (real workers, brokers, kill -9, outage):
tests/integration/runtime/test_audit_stream.py and test_keg_up_secure.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.tls import UpstreamTls
from ext_proc.sasl.login import SaslCredentials
from keg.gateway import AuditStream, Gateway, GatewayError, GatewaySettings
from keg.paths import AUDIT_KAFKA_PASSWORD_ENV


def stream_args(settings: GatewaySettings, stream: AuditStream
                ) -> list[tuple[dict[str, list[str]], dict[str, str]]]:
    """Each worker's options (name: values, in order) and secrets."""
    gateway = Gateway(settings)
    out = []
    for worker in gateway.workers:
        worker.port = 20000 + worker.index
        args, secrets = gateway._audit_stream_args(stream, worker)
        options: dict[str, list[str]] = {}
        for name, value in zip(args[::2], args[1::2], strict=True):
            options.setdefault(name, []).append(value)
        out.append((options, secrets))
    return out


def test_each_worker_spools_on_its_own(tmp_path: Path) -> None:
    settings = GatewaySettings("kafka:9092", work_dir=tmp_path, ext_proc_workers=3)
    spools = [o["--audit-spool"] for o, _ in stream_args(settings, AuditStream())]
    assert spools == [[str(tmp_path / "audit-spool")], [str(tmp_path / "audit-spool-1")],
                      [str(tmp_path / "audit-spool-2")]]
    given = [o["--audit-spool"] for o, _ in stream_args(
        settings, AuditStream(spool_dir=tmp_path / "s"))]
    assert given == [[str(tmp_path / "s")], [str(tmp_path / "s-1")], [str(tmp_path / "s-2")]]


def test_the_fronted_cluster_is_reached_as_the_gateway_reaches_it(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    settings = GatewaySettings(
        "kafka:9093", work_dir=tmp_path,
        sasl=SaslCredentials("keg", "s3cret-pass", "SCRAM-SHA-512"),
        upstream_tls=UpstreamTls(ca_file=ca))
    ((options, secrets),) = stream_args(settings, AuditStream(topic="audit"))
    assert options["--audit-kafka-bootstrap"] == ["kafka:9093"]
    assert options["--audit-kafka-topic"] == ["audit"]
    config = dict(item.split("=", 1) for item in options["--audit-kafka-config"])
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512" and config["sasl.username"] == "keg"
    assert config["ssl.ca.location"] == str(ca)
    # The password goes by environment, never on the command line (ps shows it).
    assert secrets == {AUDIT_KAFKA_PASSWORD_ENV: "s3cret-pass"}
    assert not any("s3cret-pass" in value for values in options.values() for value in values)


def test_an_audit_cluster_of_its_own_gets_only_its_settings(tmp_path: Path) -> None:
    settings = GatewaySettings("kafka:9093", work_dir=tmp_path,
                               sasl=SaslCredentials("keg", "s3cret-pass", "PLAIN"))
    stream = AuditStream(bootstrap_servers="audit:9092",
                         config=(("acks", "all"), ("sasl.password", "audit-pass")))
    ((options, secrets),) = stream_args(settings, stream)
    assert options["--audit-kafka-bootstrap"] == ["audit:9092"]
    assert options["--audit-kafka-config"] == ["acks=all"]
    assert secrets == {AUDIT_KAFKA_PASSWORD_ENV: "audit-pass"}


def test_oauthbearer_to_the_fronted_cluster_is_refused_with_the_way_out(tmp_path: Path) -> None:
    settings = GatewaySettings("kafka:9093", work_dir=tmp_path,
                               sasl=SaslCredentials("keg", "a-token", "OAUTHBEARER"))
    with pytest.raises(GatewayError, match="--audit-kafka-bootstrap"):
        stream_args(settings, AuditStream())
