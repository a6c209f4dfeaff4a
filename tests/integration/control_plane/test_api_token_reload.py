"""The control plane process as deployed (store, REST API, xDS) re-reads its API token
file: a token removed from the file is refused without a restart, the others keep
working, and a file that turns invalid keeps the last good tokens."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from control_plane.service import ControlPlaneSettings
from keg.embedded.kafka import EmbeddedKafka
from keg.gateway import ApiOptions, BackgroundLoop, ControlPlaneApp

pytestmark = pytest.mark.integration

A_TOKEN = "reload-token-a-0123456789"
B_TOKEN = "reload-token-b-0123456789"


def put_rule(api: str, rule_id: str, token: str) -> int:
    rule = json.dumps({"id": rule_id, "action": {"observe": {}}}).encode()
    request = urllib.request.Request(
        f"{api}/v1/rules/{rule_id}", data=rule, method="PUT",
        headers={"Authorization": f"Bearer {token}", "If-None-Match": "*",
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_a_token_removed_from_the_file_is_refused_without_a_restart(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"a:{A_TOKEN}\nb:{B_TOKEN}\n")
    loop = BackgroundLoop()
    process = ControlPlaneApp(
        ControlPlaneSettings(bootstrap_servers=kafka.bootstrap, ext_proc_host="127.0.0.1",
                             ext_proc_port=1, listen_port_base=0),
        ApiOptions(data_dir=tmp_path / "store", port=0, tokens_file=tokens))
    try:
        loop.run(process.start(), timeout=60)
        api = f"http://127.0.0.1:{process.api_server.port}"
        assert put_rule(api, "by-a", A_TOKEN) == 201

        tokens.write_text(f"b:{B_TOKEN}\n")  # A removed
        deadline = time.monotonic() + 10
        attempt = 0
        while (status := put_rule(api, f"by-a-{attempt}", A_TOKEN)) != 403:
            assert status == 201, status
            assert time.monotonic() < deadline, "token A still works 10 s after its removal"
            attempt += 1
            time.sleep(0.1)
        print(f"\ntoken A refused after {attempt} more write(s)")
        assert put_rule(api, "by-b", B_TOKEN) == 201

        # An invalid file keeps the last good tokens: B still writes, A stays refused.
        tokens.write_text(f"b:{B_TOKEN}\nthis line is not name:token\n")
        time.sleep(1.5)  # past the next look at the file
        assert put_rule(api, "by-b-again", B_TOKEN) == 201
        assert put_rule(api, "by-a-again", A_TOKEN) == 403

        stored = process.store.current()[1]
        assert {"by-a", "by-b", "by-b-again"} <= {r.id for r in stored.rules}
        assert "by-a-again" not in {r.id for r in stored.rules}
    finally:
        loop.run(process.stop(), timeout=60)
        loop.close()
