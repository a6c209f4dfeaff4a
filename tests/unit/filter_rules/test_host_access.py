"""What of the gateway host a rule uses (filter_rules.host_access)."""

from __future__ import annotations

import pytest

from filter_rules import load_rule_text
from filter_rules.host_access import host_resources


def uses(action: str) -> list[str]:
    rule = load_rule_text(f"rules:\n  - id: r\n    action: {action}\n").rules[0]
    return host_resources(rule)


@pytest.mark.parametrize(("action", "expected"), [
    ("{deny: {}}", []),
    ("{mask: {fields: ['$.a']}}", []),
    ("{copy: {topic: audit.copy}}", []),
    ("{encrypt: {fields: ['$.a'], key: {id: k, secret: {env: KEG_KEY}}}}",
     ["the environment variable KEG_KEY"]),
    ("{decrypt: {keys: [{id: k, secret: {file: /etc/k}}, {id: j, secret: {file: /etc/j}}]}}",
     ["the file /etc/j", "the file /etc/k"]),
    ("{validate: {json_schema_file: /s.json}}", ["the file /s.json"]),
    ("{validate: {avro_schema: {file: /s.avsc}}}", ["the file /s.avsc"]),
    ("{interceptor: {class: 'pkg.mod:Hook'}}", ["code (interceptor class pkg.mod:Hook)"]),
    ("{capture: {path: /var/cap}}", ["writes under the directory /var/cap"]),
    ("{encrypt: {fields: ['$.a'], kms: {aws: {key_id: alias/k}}}}",
     ["the host's AWS credentials"]),
    ("{encrypt: {fields: ['$.a'], kms: {aws: {key_id: alias/k, ca_file: /ca.pem, "
     "access_key_id: {env: A}, secret_access_key: {env: B}}}}}",
     ["the environment variable A", "the environment variable B", "the file /ca.pem"]),
])
def test_what_a_rule_reaches_of_the_host(action: str, expected: list[str]) -> None:
    assert uses(action) == expected
