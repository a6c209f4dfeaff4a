"""docker-compose.tls.yml, the TLS + SASL variant, checked without Docker like
tests/unit/keg/test_deploy.py checks the base: merged onto docker-compose.yml it follows the
Compose Specification; its keg commands and options exist; the certificates its
services read are the ones its `certs` service writes (`keg dev-certs` run here); the
services point at each other; Envoy's TLS bootstrap, rendered by the Envoy service's
own command, is a valid config for a real Envoy; no secret is written into the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from keg.embedded.envoy import envoy_binary
from keg.paths import REPO_ROOT
from tests.unit.keg.test_deploy import COMPOSE, DEPLOY, load_yaml, options

TLS_COMPOSE = REPO_ROOT / "docker-compose.tls.yml"


def _volumes(entries: list[str]) -> dict[str, str]:
    return {entry.split(":")[1]: entry for entry in entries}


def merge(base: Any, override: Any, key: str = "") -> Any:
    """Compose's merge of an override file (the rules this project's files need):
    mappings merge, `command` and other sequences are replaced, volumes merge by
    their target path."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            merged[name] = merge(base[name], value, name) if name in base else value
        return merged
    if key == "volumes" and isinstance(base, list) and isinstance(override, list):
        return list({**_volumes(base), **_volumes(override)}.values())
    return override


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    merged = merge(load_yaml(COMPOSE), load_yaml(TLS_COMPOSE))
    assert isinstance(merged, dict)
    return merged


def test_the_merged_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads((DEPLOY / "schema" / "compose-spec.json").read_text())
    validator = jsonschema.Draft201909Validator(schema)
    assert [e.message for e in validator.iter_errors(compose)] == []
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO_ROOT / source).exists(), f"{name} mounts missing {source}"


@pytest.mark.parametrize("service", ["certs", "control-plane", "ext-proc"])
def test_keg_commands_in_the_tls_variant_exist(compose: dict[str, Any], service: str) -> None:
    from typer.main import get_command

    from keg.cli import app

    argv = compose["services"][service]["command"]
    command = get_command(app).commands[argv[0]]  # type: ignore[attr-defined]
    known = {opt for param in command.params for opt in param.opts}
    assert not set(options(argv[1:])) - known


@pytest.fixture(scope="module")
def certs(compose: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the certs service writes, by running its command here."""
    directory = tmp_path_factory.mktemp("certs")
    argv = [a if a != "/certs" else str(directory) for a in compose["services"]["certs"]["command"]]
    subprocess.run([sys.executable, "-m", "keg", *argv], check=True, capture_output=True)
    return directory


def test_every_certificate_a_service_reads_is_written_by_the_certs_service(
        compose: dict[str, Any], certs: Path) -> None:
    text = TLS_COMPOSE.read_text() + (REPO_ROOT / "envoy" / "bootstrap-tls.yaml").read_text()
    wanted = set(re.findall(r"/certs/([\w.-]+\.pem)", text))
    assert wanted and wanted <= {p.name for p in certs.iterdir()}, wanted
    # Every service that reads them mounts them and waits for them.
    for name in ("kafka", "control-plane"):
        service = compose["services"][name]
        assert "./deploy/certs:/certs:ro" in service["volumes"]
        assert service["depends_on"]["certs"]["condition"] == "service_completed_successfully"


def test_the_tls_services_point_at_each_other(compose: dict[str, Any]) -> None:
    services = compose["services"]
    plane = options(services["control-plane"]["command"][1:])
    ext_proc = options(services["ext-proc"]["command"][1:])
    kafka = services["kafka"]["environment"]
    assert f"SASL_SSL://kafka:{str(plane['--bootstrap-servers']).split(':')[1]}" in \
        kafka["KAFKA_ADVERTISED_LISTENERS"]
    assert plane["--sasl-mechanism"] in kafka["KAFKA_SASL_ENABLED_MECHANISMS"]
    assert f'user_{plane["--sasl-username"]}=' in \
        kafka["KAFKA_LISTENER_NAME_SASL__SSL_PLAIN_SASL_JAAS_CONFIG"]
    assert ext_proc["--control-plane"] == f"control-plane:{plane['--xds-port']}"
    assert ext_proc["--control-plane-ca"] == plane["--xds-tls-client-ca"]
    # The secret comes from the environment, never the file or a command line.
    assert "--sasl-password-file" not in plane
    assert services["control-plane"]["environment"]["KEG_SASL_PASSWORD"].startswith("${")


def _config_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_envoy_tls_bootstrap_is_valid_and_is_the_base_one_plus_tls(
        compose: dict[str, Any], certs: Path, tmp_path: Path) -> None:
    base = (REPO_ROOT / "envoy" / "bootstrap.yaml").read_text()
    tls = (REPO_ROOT / "envoy" / "bootstrap-tls.yaml").read_text()
    base_lines, tls_lines = _config_lines(base), _config_lines(tls)
    assert [line for line in tls_lines if line in base_lines] == base_lines  # no drift
    script = compose["services"]["envoy"]["command"][0].replace("$$", "$")
    source = tmp_path / "bootstrap-tls.yaml"
    source.write_text(tls.replace("/certs/", f"{certs}/"))
    rendered = tmp_path / "bootstrap.yaml"
    script = (script.replace("/etc/keg/bootstrap.yaml", str(source))
              .replace("/tmp/bootstrap.yaml", str(rendered))
              .replace("exec envoy -c", "test -s"))
    subprocess.run(["/bin/sh", "-c", script], check=True, timeout=30)
    config = yaml.safe_load(rendered.read_text())
    socket = config["static_resources"]["clusters"][0]["transport_socket"]
    assert socket["typed_config"]["sni"] == "control-plane"
    result = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(rendered)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
