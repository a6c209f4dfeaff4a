"""TLS for the gateway: certificates from files, to Envoy over SDS, rotated in place.

Two sides, each optional:

- `ListenerTls`: Kafka clients connect to the gateway's listeners over TLS, with the
  gateway's certificate (and, with a client CA, mutual TLS: a client without a
  certificate signed by that CA is refused, and its certificate names the principal
  through Kafka's `ssl.principal.mapping.rules`, ext_proc.tls_principal).
- `UpstreamTls`: the gateway connects to the brokers over TLS: a CA to trust (the
  system's when none is given), an optional client certificate, SNI and hostname
  verification (on by default: the broker's certificate must name the host the
  broker advertises, as a direct client would check).

`TlsMaterial` reads the files, checks them (a key that does not belong to its
certificate, a file that is not PEM: a `TlsConfigError` naming the file, never its
contents) and turns them into Envoy `Secret` resources. The control plane serves
those over ADS (SDS): listeners and clusters only name them, so a new certificate is
a new Secret version and no listener changes (a listener change would drain live
connections). `TlsMaterial.reload()` is polled; files caught half-replaced (a
certificate whose key has not been written yet) keep the last good version.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from envoy.config.core.v3 import base_pb2, config_source_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2
from google.protobuf.message import Message

from ext_proc.tls_principal import PRINCIPAL_SOURCES, SUBJECT, parse_mapping_rules

log = logging.getLogger(__name__)

LISTENER_CERT: Final = "keg/listener/certificate"
LISTENER_CLIENT_CA: Final = "keg/listener/client-ca"
UPSTREAM_CA: Final = "keg/upstream/ca"
UPSTREAM_CERT: Final = "keg/upstream/certificate"


class TlsConfigError(ValueError):
    """A TLS file that cannot be used; the message names the file, never its contents."""


@dataclass(frozen=True)
class ListenerTls:
    """TLS on the gateway's Kafka listeners (`keg up --tls-cert/--tls-key/--tls-client-ca`)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None  # mutual TLS: a client certificate is required
    # Kafka's ssl.principal.mapping.rules, applied to the client certificate's name.
    principal_mapping_rules: str = "DEFAULT"
    principal_from: str = SUBJECT  # or "uri_san": the first URI SAN (a SPIFFE id)

    def __post_init__(self) -> None:
        if self.principal_from not in PRINCIPAL_SOURCES:
            raise TlsConfigError(f"principal_from must be one of {', '.join(PRINCIPAL_SOURCES)}"
                                 f", not {self.principal_from!r}")
        parse_mapping_rules(self.principal_mapping_rules)  # MappingRuleError when invalid

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None


@dataclass(frozen=True)
class UpstreamTls:
    """TLS from the gateway (and the control plane's discovery) to the brokers."""

    ca_file: Path | None = None  # None: the system's trust store
    cert_file: Path | None = None  # a client certificate, for brokers that ask for one
    key_file: Path | None = None
    server_name: str | None = None  # SNI and the name verified; default: each broker's host
    verify_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsConfigError("an upstream client certificate needs both a certificate "
                                 "and a key file")

    def trust_file(self) -> Path:
        """The CA file to trust: the given one, else the system's bundle."""
        if self.ca_file is not None:
            return self.ca_file
        paths = ssl.get_default_verify_paths()
        for candidate in (paths.cafile, paths.openssl_cafile):
            if candidate and Path(candidate).is_file():
                return Path(candidate)
        raise TlsConfigError("no system CA bundle found: give the brokers' CA file "
                             "(--upstream-tls-ca)")

    def client_context(self) -> ssl.SSLContext:
        """An ssl context for a Python client of the brokers (broker discovery)."""
        context = ssl.create_default_context(cafile=str(self.trust_file()))
        context.check_hostname = self.verify_hostname
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            except (OSError, ssl.SSLError) as err:
                raise TlsConfigError(f"upstream client certificate {self.cert_file} / key "
                                     f"{self.key_file}: {_reason(err)}") from None
        return context


@dataclass(frozen=True)
class ServerTls:
    """TLS of the control plane's own servers (xDS/ADS gRPC, the REST API); with a
    client CA, clients (Envoys, ext_proc instances) must present a certificate it signed."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def check(self) -> None:
        """TlsConfigError when the files do not load or do not belong together."""
        _key_pair(self.cert_file, self.key_file, "control plane TLS")
        if self.client_ca_file is not None:
            _certificates(self.client_ca_file, "control plane client CA")

    def grpc_credentials(self) -> grpc.ServerCredentials:
        self.check()
        return grpc.ssl_server_credentials(
            [(self.key_file.read_bytes(), self.cert_file.read_bytes())],
            root_certificates=(self.client_ca_file.read_bytes()
                               if self.client_ca_file is not None else None),
            require_client_auth=self.client_ca_file is not None)


@dataclass(frozen=True)
class ClientTls:
    """How a client of the control plane (an ext_proc instance, an Envoy) reaches it
    over TLS: the CA to trust, and a certificate when the control plane asks for one."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        cert = self.cert_file.read_bytes() if self.cert_file is not None else None
        key = self.key_file.read_bytes() if self.key_file is not None else None
        return grpc.ssl_channel_credentials(self.ca_file.read_bytes(), key, cert)


def _reason(err: BaseException) -> str:
    """An error's reason without anything read from a key file."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return type(err).__name__


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise TlsConfigError(f"{what} {path}: {_reason(err)}") from None


def _certificates(path: Path, what: str) -> tuple[bytes, list[x509.Certificate]]:
    data = _read(path, what)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsConfigError(f"{what} {path} holds no PEM certificate") from None
    return data, certs


def _key_pair(cert_file: Path, key_file: Path, what: str) -> tuple[bytes, bytes]:
    """The (chain, key) PEM bytes, checked to belong together."""
    chain, certs = _certificates(cert_file, f"{what} certificate")
    key_bytes = _read(key_file, f"{what} key")
    try:
        key = serialization.load_pem_private_key(key_bytes, password=None)
    except (ValueError, TypeError):
        # Never the exception text: it may quote the file.
        raise TlsConfigError(f"{what} key {key_file} is not an unencrypted PEM private "
                             "key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if (key.public_key().public_bytes(encoding, public)
            != certs[0].public_key().public_bytes(encoding, public)):
        raise TlsConfigError(f"{what} key {key_file} does not belong to the certificate "
                             f"{cert_file}")
    return chain, key_bytes


def _data_source(data: bytes) -> base_pb2.DataSource:
    return base_pb2.DataSource(inline_bytes=data)


def _certificate_secret(name: str, chain: bytes, key: bytes) -> secret_pb2.Secret:
    return secret_pb2.Secret(name=name, tls_certificate=common_pb2.TlsCertificate(
        certificate_chain=_data_source(chain), private_key=_data_source(key)))


def _ca_secret(name: str, bundle: bytes) -> secret_pb2.Secret:
    return secret_pb2.Secret(name=name, validation_context=common_pb2.CertificateValidationContext(
        trusted_ca=_data_source(bundle)))


def sds(name: str) -> secret_pb2.SdsSecretConfig:
    """A reference to a secret the control plane serves over the same ADS stream."""
    return secret_pb2.SdsSecretConfig(name=name, sds_config=config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3))


@dataclass
class TlsMaterial:
    """The files of both sides, read into Envoy secrets; `reload()` re-reads them."""

    listener: ListenerTls | None = None
    upstream: UpstreamTls | None = None
    secrets: dict[str, Message] = field(default_factory=dict)
    _digest: str = ""

    def __post_init__(self) -> None:
        self.secrets = self._read()  # TlsConfigError at start: nothing is served
        self._digest = _digest(self.secrets)

    def _read(self) -> dict[str, Message]:
        secrets: dict[str, Message] = {}
        if self.listener is not None:
            chain, key = _key_pair(self.listener.cert_file, self.listener.key_file,
                                   "listener TLS")
            secrets[LISTENER_CERT] = _certificate_secret(LISTENER_CERT, chain, key)
            if self.listener.client_ca_file is not None:
                bundle, _ = _certificates(self.listener.client_ca_file, "client CA")
                secrets[LISTENER_CLIENT_CA] = _ca_secret(LISTENER_CLIENT_CA, bundle)
        if self.upstream is not None:
            trust = self.upstream.trust_file()
            bundle, _ = _certificates(trust, "upstream CA")
            secrets[UPSTREAM_CA] = _ca_secret(UPSTREAM_CA, bundle)
            if self.upstream.cert_file is not None and self.upstream.key_file is not None:
                chain, key = _key_pair(self.upstream.cert_file, self.upstream.key_file,
                                       "upstream client")
                secrets[UPSTREAM_CERT] = _certificate_secret(UPSTREAM_CERT, chain, key)
        return secrets

    def reload(self) -> bool:
        """Re-read the files; True when a secret changed. Files that do not check (say, a
        certificate replaced before its key) keep the last good secrets, logged."""
        try:
            secrets = self._read()
        except TlsConfigError as err:
            log.warning("TLS files not (yet) usable, keeping the current certificates: %s", err)
            return False
        digest = _digest(secrets)
        if digest == self._digest:
            return False
        self.secrets, self._digest = secrets, digest
        log.info("TLS files changed: new certificates go to Envoy over SDS (%s)",
                 ", ".join(sorted(secrets)))
        return True

    # -- what listeners and clusters carry ------------------------------------------------

    def downstream_context(self) -> tls_pb2.DownstreamTlsContext | None:
        if self.listener is None:
            return None
        common = tls_pb2.CommonTlsContext(tls_certificate_sds_secret_configs=[sds(LISTENER_CERT)])
        if self.listener.mutual:
            common.validation_context_sds_secret_config.CopyFrom(sds(LISTENER_CLIENT_CA))
        return tls_pb2.DownstreamTlsContext(
            common_tls_context=common,
            require_client_certificate=_bool(self.listener.mutual))

    def upstream_context(self, broker_host: str) -> tls_pb2.UpstreamTlsContext | None:
        """TLS to one broker: SNI and the name its certificate must carry are the host it
        advertises (or the configured server name)."""
        if self.upstream is None:
            return None
        name = self.upstream.server_name or broker_host
        default = common_pb2.CertificateValidationContext()
        if self.upstream.verify_hostname:
            san_type = (common_pb2.SubjectAltNameMatcher.IP_ADDRESS if is_ip(name)
                        else common_pb2.SubjectAltNameMatcher.DNS)
            default.match_typed_subject_alt_names.append(common_pb2.SubjectAltNameMatcher(
                san_type=san_type, matcher=string_pb2.StringMatcher(exact=name)))
        common = tls_pb2.CommonTlsContext(
            combined_validation_context=tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
                default_validation_context=default,
                validation_context_sds_secret_config=sds(UPSTREAM_CA)))
        if self.upstream.cert_file is not None:
            common.tls_certificate_sds_secret_configs.append(sds(UPSTREAM_CERT))
        # SNI never carries an IP address (RFC 6066).
        return tls_pb2.UpstreamTlsContext(common_tls_context=common,
                                          sni="" if is_ip(name) else name)


def _bool(value: bool) -> wrappers_pb2.BoolValue:
    return wrappers_pb2.BoolValue(value=value)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _digest(secrets: Mapping[str, Message]) -> str:
    digest = hashlib.sha256()
    for name in sorted(secrets):
        digest.update(name.encode())
        digest.update(secrets[name].SerializeToString(deterministic=True))
    return digest.hexdigest()


def certificate_fingerprint(pem: bytes) -> str:
    """SHA-256 of a PEM certificate's DER form (tests, logs: names a certificate safely)."""
    cert = x509.load_pem_x509_certificate(pem)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


__all__ = [
    "LISTENER_CERT",
    "LISTENER_CLIENT_CA",
    "UPSTREAM_CA",
    "UPSTREAM_CERT",
    "ClientTls",
    "ListenerTls",
    "ServerTls",
    "TlsConfigError",
    "TlsMaterial",
    "UpstreamTls",
    "certificate_fingerprint",
    "is_ip",
    "sds",
]
