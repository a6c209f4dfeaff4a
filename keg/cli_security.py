"""The security options `keg up` and `keg control-plane` share: TLS on the listeners, TLS
and SASL to the brokers, SASL termination. Secrets never come as arguments: a SASL
password or token from a file (`--sasl-password-file`) or `$KEG_SASL_PASSWORD`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from keg.cli_options import option_group
from keg.security import SASL_PASSWORD_ENV

if TYPE_CHECKING:
    from control_plane.tls import ListenerTls, UpstreamTls
    from ext_proc.sasl.login import SaslCredentials

TlsCert = Annotated[Path | None, typer.Option(
    help="Serve the Kafka listeners over TLS with this certificate (PEM, chain); "
         "replacing the file rotates it without dropping connections.")]
TlsKey = Annotated[Path | None, typer.Option(help="The private key of --tls-cert (PEM).")]
TlsClientCa = Annotated[Path | None, typer.Option(
    help="Mutual TLS: clients must present a certificate signed by this CA; its subject "
         "becomes the principal (--tls-principal-mapping-rules).")]
TlsPrincipalRules = Annotated[str, typer.Option(
    help="Kafka's ssl.principal.mapping.rules for client certificates, e.g. "
         "'RULE:^CN=(.*?),.*$/$1/L,DEFAULT'.")]
TlsPrincipalFrom = Annotated[str, typer.Option(
    help="subject: the rules apply to the certificate's subject (as Kafka); uri_san: to "
         "its first URI SAN (a SPIFFE id).")]
UpstreamTlsFlag = Annotated[bool, typer.Option(
    help="Connect to the brokers over TLS (the system's CAs unless --upstream-tls-ca).")]
UpstreamTlsCa = Annotated[Path | None, typer.Option(
    help="CA file the brokers' certificates are checked against (implies --upstream-tls).")]
UpstreamTlsCert = Annotated[Path | None, typer.Option(
    help="Client certificate for brokers that ask for one (implies --upstream-tls).")]
UpstreamTlsKey = Annotated[Path | None, typer.Option(help="Its private key.")]
UpstreamServerName = Annotated[str | None, typer.Option(
    help="SNI and name the brokers' certificates must carry (default: each broker's "
         "advertised host).")]
UpstreamVerifyHostname = Annotated[bool, typer.Option(
    help="Check that a broker's certificate names its host (on by default).")]
SaslMechanism = Annotated[str | None, typer.Option(
    help="Log in to the brokers with SASL: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or "
         "OAUTHBEARER (discovery, and the service account of --sasl-termination).")]
SaslUsername = Annotated[str | None, typer.Option(help="SASL user name.")]
SaslPasswordFile = Annotated[Path | None, typer.Option(
    help=f"File holding the SASL password (OAUTHBEARER: the token); else ${SASL_PASSWORD_ENV}.")]
SaslTermination = Annotated[Path | None, typer.Option(
    help="Authenticate Kafka clients at the gateway (YAML: credentials file, JWKS, "
         "mechanisms; docs/production.md); the gateway reaches the brokers as the "
         "--sasl-* service account.")]


@dataclass(frozen=True)
class SecurityOptions:
    """What the options say, before any file is read."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tls_principal_mapping_rules: str = "DEFAULT"
    tls_principal_from: str = "subject"
    upstream_tls: bool = False
    upstream_tls_ca: Path | None = None
    upstream_tls_cert: Path | None = None
    upstream_tls_key: Path | None = None
    upstream_server_name: str | None = None
    upstream_verify_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_file: Path | None = None
    sasl_termination: Path | None = None

    def build(self) -> tuple[SaslCredentials | None, ListenerTls | None, UpstreamTls | None]:
        """(SaslCredentials | None, ListenerTls | None, UpstreamTls | None); ValueError
        (TlsConfigError, SecretMissing, MappingRuleError) saying what is wrong."""
        from control_plane.tls import ListenerTls, TlsConfigError, UpstreamTls
        from keg.security import sasl_credentials

        listener = None
        if self.tls_cert is not None or self.tls_key is not None:
            if self.tls_cert is None or self.tls_key is None:
                raise TlsConfigError("--tls-cert and --tls-key go together")
            listener = ListenerTls(self.tls_cert, self.tls_key, self.tls_client_ca,
                                   self.tls_principal_mapping_rules, self.tls_principal_from)
        elif self.tls_client_ca is not None:
            raise TlsConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        upstream = None
        if (self.upstream_tls or self.upstream_tls_ca is not None
                or self.upstream_tls_cert is not None):
            upstream = UpstreamTls(self.upstream_tls_ca, self.upstream_tls_cert,
                                   self.upstream_tls_key, self.upstream_server_name,
                                   self.upstream_verify_hostname)
        sasl = sasl_credentials(self.sasl_mechanism, self.sasl_username,
                                self.sasl_password_file)
        return sasl, listener, upstream


# Each SecurityOptions field's typer option (its default is the field's).
_OPTION_TYPES: Final[dict[str, Any]] = {
    "tls_cert": TlsCert,
    "tls_key": TlsKey,
    "tls_client_ca": TlsClientCa,
    "tls_principal_mapping_rules": TlsPrincipalRules,
    "tls_principal_from": TlsPrincipalFrom,
    "upstream_tls": UpstreamTlsFlag,
    "upstream_tls_ca": UpstreamTlsCa,
    "upstream_tls_cert": UpstreamTlsCert,
    "upstream_tls_key": UpstreamTlsKey,
    "upstream_server_name": UpstreamServerName,
    "upstream_verify_hostname": UpstreamVerifyHostname,
    "sasl_mechanism": SaslMechanism,
    "sasl_username": SaslUsername,
    "sasl_password_file": SaslPasswordFile,
    "sasl_termination": SaslTermination,
}
NO_SECURITY_OPTIONS: Final = SecurityOptions()


def security_options(*, sasl_termination: bool = True) -> Callable[
        [Callable[..., None]], Callable[..., None]]:
    """The security options on a typer command, declared once, here: the command takes
    `security: SecurityOptions = NO_SECURITY_OPTIONS`, shown as the options `--tls-cert`
    ... `--sasl-password-file` (and `--sasl-termination` unless `sasl_termination=False`)
    in its place."""
    return option_group(SecurityOptions, _OPTION_TYPES, "security",
                        leave_out=() if sasl_termination else ("sasl_termination",))
