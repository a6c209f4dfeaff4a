"""/v1/dry-run of rules naming a file that is a FIFO or /dev/zero (a key file): refused
with the reason, at once. Regression: building the rule opened the FIFO and blocked a
thread of the API's pool forever (some 40 such requests froze the whole REST API)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.unit.control_plane.conftest import ADMIN
from tests.unit.special_files import fifo, guarded, zero_link


def _dry_run(client: TestClient, key_file: Path) -> tuple[int, str]:
    rules = ("rules:\n  - id: encrypt-card\n    action:\n      encrypt:\n"
             f"        key: {{id: k1, secret: {{file: '{key_file}'}}}}\n")
    body = {"rules": rules, "records": [{"topic": "orders", "value": '{"card": "4111"}'}]}
    response = client.post("/v1/dry-run", json=body, headers=ADMIN)
    return response.status_code, response.text


def test_a_key_file_that_is_a_fifo_or_dev_zero_is_refused_by_the_dry_run(
        client: TestClient, tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "card.key")
    status, text = guarded(lambda: _dry_run(client, pipe), (pipe,))
    assert status == 422, text
    assert "key k1: cannot read" in text and "not a regular file (a FIFO)" in text
    zero = zero_link(tmp_path / "zero.key")
    status, text = _dry_run(client, zero)
    assert status == 422, text
    assert "not a regular file (a character device)" in text
