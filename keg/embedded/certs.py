"""Throw-away certificates for development and tests: a CA, servers and clients.

`DevCa(directory)` makes a CA (``ca.pem``, its key ``ca-key.pem``) and issues
certificates signed by it as PEM files: `server(name, hosts)` for a broker or the
gateway (DNS and IP SANs), `client(name, subject)` for mutual TLS (the subject is
what Kafka's ssl.principal.mapping.rules see). Keys are EC P-256, PKCS#8, unencrypted,
written with mode 0600. Never use these for anything real.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as files (`cert` may hold the chain up to the CA)."""

    cert: Path
    key: Path


def _name(common_name: str, organizational_unit: str | None = None) -> x509.Name:
    """Most significant first, as X.509 orders it; RFC 2253 (what Kafka and Envoy
    print) reverses it: ``CN=...,OU=...,O=keg``."""
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "keg")]
    if organizational_unit:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, organizational_unit))
    parts.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(parts)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, mode: int = 0o600) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _write_cert(path: Path, *certs: x509.Certificate) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    tmp.replace(path)


class DevCa:
    """A development CA in `directory` (created, or loaded when its files exist)."""

    def __init__(self, directory: Path, name: str = "keg dev CA", key_mode: int = 0o600) -> None:
        self.directory = directory
        # 0o644 for containers running as other users (docker-compose.tls.yml): dev only.
        self.key_mode = key_mode
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_file = directory / "ca.pem"
        self.key_file = directory / "ca-key.pem"
        if self.cert_file.exists() and self.key_file.exists():
            self._cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
            key = serialization.load_pem_private_key(self.key_file.read_bytes(), None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            self._key = key
            return
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = _name(name)
        self._cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        _write_key(self.key_file, self._key)  # the CA's own key stays private
        _write_cert(self.cert_file, self._cert)

    def _issue(self, stem: str, subject: x509.Name, sans: list[x509.GeneralName],
               usage: list[x509.ObjectIdentifier], days: float) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(self._cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem")
        _write_key(issued.key, key, self.key_mode)
        _write_cert(issued.cert, cert)
        return issued

    def keystore(self, issued: Issued) -> Path:
        """The key and chain in one PEM file, as Kafka's PEM key store reads it."""
        path = issued.cert.with_name(issued.cert.stem + "-keystore.pem")
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.key_mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(issued.key.read_bytes() + issued.cert.read_bytes())
        os.chmod(tmp, self.key_mode)
        tmp.replace(path)
        return path

    def server(self, stem: str, hosts: list[str] | tuple[str, ...] = ("localhost", "127.0.0.1"),
               common_name: str | None = None, days: float = 30) -> Issued:
        """A server certificate naming `hosts` (IP addresses become IP SANs)."""
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(stem, _name(common_name or hosts[0]), sans,
                           [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                           days)

    def client(self, stem: str, common_name: str, organizational_unit: str | None = None,
               uri: str | None = None, days: float = 30) -> Issued:
        """A client certificate: subject ``CN=<common_name>[,OU=<ou>],O=keg`` (RFC 2253
        order: ``CN=alice,OU=eng,O=keg``), and a URI SAN when given."""
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)] if uri else []
        return self._issue(stem, _name(common_name, organizational_unit), sans,
                           [ExtendedKeyUsageOID.CLIENT_AUTH], days)


__all__ = ["DevCa", "Issued"]
