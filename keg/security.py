"""Secrets and security settings as `keg` hands them to the gateway's parts.

Secrets (a SASL password, an OAUTHBEARER token) come from a file or an environment
variable, never from a command line (`ps` shows every argument). `keg up` reads them
once, drops the variable from its own environment (so Envoy and every other child
never inherit it) and gives the ext_proc service, the one child that needs the
password (the `copy` rules' producer, the service account of SASL termination), its
own copy in *its* environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from control_plane.tls import ClientTls, UpstreamTls
from ext_proc.sasl.login import SaslCredentials
from keg.paths import SIDE_EFFECTS_PASSWORD_ENV

# Where `keg up` and `keg control-plane` look for the SASL password without a file.
SASL_PASSWORD_ENV: Final = "KEG_SASL_PASSWORD"
# The ext_proc service's service-account password (SASL termination), set by `keg up`.
SERVICE_PASSWORD_ENV: Final = "KEG_SERVICE_SASL_PASSWORD"


class SecretMissing(ValueError):
    """A secret that was asked for is not there; the message names where, not what."""


def read_secret(file: Path | None, env: str) -> str | None:
    """The secret in `file` (first line, trailing newline removed), else in the
    environment variable `env`, which is then removed from this process's environment;
    None when neither is given."""
    if file is not None:
        try:
            text = file.read_text()
        except OSError as err:
            raise SecretMissing(f"cannot read the secret file {file}: "
                                f"{err.strerror or type(err).__name__}") from None
        secret = text.splitlines()[0] if text else ""
        if not secret:
            raise SecretMissing(f"the secret file {file} is empty")
        return secret
    value = os.environ.pop(env, None)
    return value or None


def sasl_credentials(mechanism: str | None, username: str | None,
                     password_file: Path | None) -> SaslCredentials | None:
    """The control plane's (and the gateway's service account's) SASL login from the
    command line's options; None without a mechanism."""
    if mechanism is None:
        if username is not None or password_file is not None:
            raise SecretMissing("--sasl-username and --sasl-password-file need "
                                "--sasl-mechanism")
        return None
    mechanism = mechanism.upper()
    password = read_secret(password_file, SASL_PASSWORD_ENV)
    if password is None:
        what = "token" if mechanism == "OAUTHBEARER" else "password"
        raise SecretMissing(f"SASL {mechanism} needs a {what}: --sasl-password-file FILE "
                            f"or ${SASL_PASSWORD_ENV}")
    if username is None and mechanism != "OAUTHBEARER":
        raise SecretMissing(f"SASL {mechanism} needs --sasl-username")
    return SaslCredentials(username or "", password, mechanism)


def librdkafka_security(sasl: SaslCredentials | None,
                        tls: UpstreamTls | None) -> list[tuple[str, str]]:
    """librdkafka properties (the `copy` rules' producer) to reach the brokers as the
    gateway does; no secret among them (the password goes by environment)."""
    protocol = ("SASL_" if sasl is not None else "") + ("SSL" if tls is not None else "PLAINTEXT")
    config = [("security.protocol", protocol)]
    if sasl is not None:
        config += [("sasl.mechanism", sasl.mechanism), ("sasl.username", sasl.username)]
    if tls is not None:
        config.append(("ssl.ca.location", str(tls.trust_file())))
        if tls.cert_file is not None and tls.key_file is not None:
            config += [("ssl.certificate.location", str(tls.cert_file)),
                       ("ssl.key.location", str(tls.key_file))]
        config.append(("ssl.endpoint.identification.algorithm",
                       "https" if tls.verify_hostname else "none"))
    return config


def ext_proc_security(sasl: SaslCredentials | None, tls: UpstreamTls | None,
                      sasl_termination: Path | None) -> tuple[list[str], dict[str, str]]:
    """The ext_proc service's arguments and environment for the brokers' security: its
    producer's settings, and with SASL termination the service account it logs in as."""
    args: list[str] = []
    env: dict[str, str] = {}
    if sasl is None or sasl.mechanism != "OAUTHBEARER":  # librdkafka: no static token
        for key, value in librdkafka_security(sasl, tls):
            args += ["--side-effects-config", f"{key}={value}"]
        if sasl is not None:
            env[SIDE_EFFECTS_PASSWORD_ENV] = sasl.password
    if sasl_termination is not None:
        if sasl is None:
            raise SecretMissing("SASL termination logs in to the brokers as keg's service "
                                "account: give --sasl-mechanism, --sasl-username and the "
                                "password")
        args += ["--sasl-termination", str(sasl_termination),
                 "--service-sasl-mechanism", sasl.mechanism,
                 "--service-sasl-username", sasl.username]
        env[SERVICE_PASSWORD_ENV] = sasl.password
    return args, env


class PlaintextTokens(ValueError):
    """The REST API would take tokens over plaintext on a non-loopback address."""


def refuse_plaintext_tokens(host: str, has_tokens: bool, tls: bool, insecure: bool) -> None:
    """Tokens never cross a network in plaintext: an API with write tokens on an address
    other machines reach needs TLS (--api-tls-cert), or the explicit
    --api-insecure-tokens for a TLS-terminating proxy in front of it."""
    loopback = host in ("localhost", "::1") or host.startswith("127.")
    if has_tokens and not tls and not loopback and not insecure:
        raise PlaintextTokens(
            f"the REST API on {host} would take write tokens over plaintext HTTP: give it "
            "a certificate (--api-tls-cert/--api-tls-key), bind it to 127.0.0.1, or, with "
            "a TLS proxy in front, --api-insecure-tokens")


def control_plane_client_args(tls: ClientTls | None) -> list[str]:
    """The ext_proc service's arguments to reach the control plane over TLS."""
    if tls is None:
        return []
    args = ["--control-plane-ca", str(tls.ca_file)]
    if tls.cert_file is not None and tls.key_file is not None:
        args += ["--control-plane-cert", str(tls.cert_file),
                 "--control-plane-key", str(tls.key_file)]
    return args
