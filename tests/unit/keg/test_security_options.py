"""Secrets and security options as `keg` reads them: files or the environment, never
arguments; errors that say where, never what."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.tls import UpstreamTls
from ext_proc.sasl.login import SaslCredentials
from keg.paths import SIDE_EFFECTS_PASSWORD_ENV
from keg.security import (
    SASL_PASSWORD_ENV,
    SERVICE_PASSWORD_ENV,
    SecretMissing,
    ext_proc_security,
    librdkafka_security,
    read_secret,
    sasl_credentials,
)


def test_a_secret_comes_from_its_file_or_once_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    assert read_secret(secret, SASL_PASSWORD_ENV) == "s3cret"
    monkeypatch.setenv(SASL_PASSWORD_ENV, "from-env")
    assert read_secret(None, SASL_PASSWORD_ENV) == "from-env"
    # Taken out of this process's environment: no child inherits it.
    assert read_secret(None, SASL_PASSWORD_ENV) is None
    with pytest.raises(SecretMissing, match="cannot read the secret file") as err:
        read_secret(tmp_path / "missing", SASL_PASSWORD_ENV)
    (tmp_path / "empty").write_text("")
    with pytest.raises(SecretMissing, match="is empty"):
        read_secret(tmp_path / "empty", SASL_PASSWORD_ENV)
    assert "s3cret" not in str(err.value)


def test_sasl_options_must_be_complete(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SASL_PASSWORD_ENV, raising=False)
    assert sasl_credentials(None, None, None) is None
    with pytest.raises(SecretMissing, match="need --sasl-mechanism"):
        sasl_credentials(None, "keg", None)
    with pytest.raises(SecretMissing, match="needs a password"):
        sasl_credentials("SCRAM-SHA-512", "keg", None)
    token = tmp_path / "token"
    token.write_text("header.payload.signature")
    creds = sasl_credentials("oauthbearer", None, token)
    assert creds == SaslCredentials("", "header.payload.signature", "OAUTHBEARER")


def test_the_ext_proc_service_gets_settings_as_arguments_and_the_password_by_environment(
        tmp_path: Path) -> None:
    sasl = SaslCredentials("keg", "pw", "SCRAM-SHA-512")
    tls = UpstreamTls(Path("/ca.pem"))
    assert librdkafka_security(sasl, tls) == [
        ("security.protocol", "SASL_SSL"), ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "keg"), ("ssl.ca.location", "/ca.pem"),
        ("ssl.endpoint.identification.algorithm", "https")]
    args, env = ext_proc_security(sasl, tls, tmp_path / "termination.yaml")
    assert "pw" not in args and "--sasl-termination" in args
    assert env == {SIDE_EFFECTS_PASSWORD_ENV: "pw", SERVICE_PASSWORD_ENV: "pw"}
    with pytest.raises(SecretMissing, match="service account"):
        ext_proc_security(None, None, tmp_path / "termination.yaml")


def test_an_empty_oauth_principal_claim_is_refused_before_anything_starts() -> None:
    from typer.testing import CliRunner

    from keg.cli import app

    for command in (["up", "--bootstrap-servers", "127.0.0.1:1"], ["ext-proc"],
                    ["control-plane", "--bootstrap-servers", "127.0.0.1:1"]):
        result = CliRunner().invoke(app, [*command, "--oauth-principal-claim", " "])
        assert result.exit_code == 2, (command, result.output)
        assert "a JWT claim name" in result.output, result.output


def test_api_tokens_are_checked_before_anything_starts(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A missing or invalid --api-tokens file ended keg up with a traceback, after its
    broker had started and stopped again."""
    from typer.testing import CliRunner

    from keg.cli import app

    short = tmp_path / "short"
    short.write_text("ops:tiny\n")
    for tokens, says in ((tmp_path / "missing", "cannot read token file"),
                         (short, "must be at least")):
        for command in (["up"], ["control-plane", "--bootstrap-servers", "127.0.0.1:1",
                                 "--ext-proc", "127.0.0.1:2"]):
            result = CliRunner().invoke(app, [*command, "--api-port", "1", "--api-tokens",
                                              str(tokens)])
            assert result.exit_code == 2, (command, result.output)
            assert says in result.output and "Traceback" not in result.output, result.output
