"""Client settings for TLS and SASL through the gateway, for the three real clients
(librdkafka, kafka-python, Kafka's Java tools), and small TLS probes."""

from __future__ import annotations

import hashlib
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer

from keg.embedded.certs import DevCa, Issued


@dataclass(frozen=True)
class _ConfNames:
    """What one client calls each TLS and SASL setting."""

    bootstrap: str
    ca: str
    protocol: str
    cert: str
    key: str
    mechanism: str
    user: str
    password: str


_LIBRDKAFKA = _ConfNames(
    "bootstrap.servers", "ssl.ca.location", "security.protocol", "ssl.certificate.location",
    "ssl.key.location", "sasl.mechanism", "sasl.username", "sasl.password")
_KAFKA_PYTHON = _ConfNames(
    "bootstrap_servers", "ssl_cafile", "security_protocol", "ssl_certfile", "ssl_keyfile",
    "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")


def _client_conf(names: _ConfNames, bootstrap: str, ca: DevCa, client: Issued | None,
                 sasl: tuple[str, str, str] | None) -> dict[str, str]:
    conf = {names.bootstrap: bootstrap, names.ca: str(ca.cert_file),
            names.protocol: "SASL_SSL" if sasl else "SSL"}
    if client is not None:
        conf[names.cert] = str(client.cert)
        conf[names.key] = str(client.key)
    if sasl is not None:
        mechanism, user, password = sasl
        conf.update({names.mechanism: mechanism, names.user: user, names.password: password})
    return conf


def librdkafka_conf(bootstrap: str, ca: DevCa, client: Issued | None = None,
                    sasl: tuple[str, str, str] | None = None) -> dict[str, str]:
    """TLS (with `client`'s certificate for mutual TLS), and SASL (mechanism, user,
    password) on top when given."""
    return _client_conf(_LIBRDKAFKA, bootstrap, ca, client, sasl)


def kafka_python_conf(bootstrap: str, ca: DevCa, client: Issued | None = None,
                      sasl: tuple[str, str, str] | None = None) -> dict[str, object]:
    """The same settings as `librdkafka_conf`, by kafka-python's names."""
    return dict(_client_conf(_KAFKA_PYTHON, bootstrap, ca, client, sasl))


def java_client_properties(path: Path, ca: DevCa, client: Issued | None = None,
                           sasl: tuple[str, str, str] | None = None) -> Path:
    """A client.properties for Kafka's Java tools (PEM stores, KIP-651)."""
    lines = [f"security.protocol={'SASL_SSL' if sasl else 'SSL'}",
             "ssl.truststore.type=PEM", f"ssl.truststore.location={ca.cert_file}"]
    if client is not None:
        keystore = path.with_suffix(".keystore.pem")
        keystore.write_bytes(client.key.read_bytes() + client.cert.read_bytes())
        lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]
    if sasl is not None:
        mechanism, user, password = sasl
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule"
                  if mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        lines += [f"sasl.mechanism={mechanism}",
                  f'sasl.jaas.config={module} required username="{user}" '
                  f'password="{password}";']
    path.write_text("\n".join(lines) + "\n")
    return path


def served_certificate(host: str, port: int, ca: DevCa, client: Issued | None = None) -> str:
    """SHA-256 of the certificate a new TLS connection to host:port is shown."""
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    with socket.create_connection((host, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


API_VERSIONS_V0 = bytes.fromhex("0000000e" "00120000" "00000001" "0004" "6b656773")


def plaintext_answer(host: str, port: int) -> bytes:
    """What a plaintext Kafka client gets from host:port for an ApiVersions request
    (b"" when the connection is closed without an answer)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(API_VERSIONS_V0)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return received


def produce_records(conf: dict[str, str], topic: str, count: int,
             timeout_ms: int = 20000) -> list[str | None]:
    """librdkafka's delivery errors (None: stored) for `count` records, no retries."""
    errors: list[str | None] = []
    producer = Producer({**conf, "retries": 0, "message.timeout.ms": timeout_ms,
                         "socket.timeout.ms": min(timeout_ms, 60000) // 2})
    for i in range(count):
        producer.produce(topic, b"value-%d" % i, on_delivery=lambda err, _m: errors.append(
            None if err is None else err.name()))
    producer.flush(30)
    return errors
