"""The files a rule names (a key's `{file: ...}`, a keyring, a JSON Schema or Avro schema
file, a CA bundle) are used only if they are regular files, read bounded. Regression:
a FIFO named as a key file blocked the thread building the rule forever (the control
plane's /v1/dry-run, `keg validate`), and /dev/zero was read until MemoryError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from filter_rules.record_actions import (
    EncryptSpec,
    KmsAws,
    KmsSpec,
    MaskSpec,
    SchemaRegistryRef,
    ValidateSpec,
)
from interceptors import BuildContext, InterceptorConfigError, NoSideEffects
from interceptors.builtin import BUILDERS
from interceptors.kms import AwsKmsBackend, KeyringBackend
from interceptors.registry import registry_client
from tests.unit.special_files import fifo, guarded, run_capped

REFUSED = r"not a regular file \(a FIFO\)"


@pytest.fixture
def ctx(tmp_path: Path) -> BuildContext:
    return BuildContext(side_effects=NoSideEffects(), base_dir=tmp_path, environ={})


@pytest.fixture
def pipe(tmp_path: Path) -> Path:
    return fifo(tmp_path / "named.pipe")


def _refused(call: Any, pipe: Path, message: str) -> str:
    with pytest.raises(InterceptorConfigError, match=message) as caught:
        guarded(call, (pipe,))
    return str(caught.value)


def test_a_key_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    spec = EncryptSpec.model_validate({"key": {"id": "k1", "secret": {"file": pipe.name}}})
    message = _refused(lambda: BUILDERS["encrypt"](spec, ctx), pipe,
                       f"key k1: cannot read {pipe}: {REFUSED}$")
    assert message == f"key k1: cannot read {pipe}: not a regular file (a FIFO)"


def test_a_hash_key_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    spec = MaskSpec.model_validate({"fields": ["$.e"], "method": "hash",
                                    "hash_key": {"file": pipe.name}})
    _refused(lambda: BUILDERS["mask"](spec, ctx), pipe, f"hash_key: cannot read .*{REFUSED}")


def test_a_keyring_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    spec = KmsSpec.model_validate({"keyring": {"secret": {"file": pipe.name}, "key": "k"}})
    assert spec.keyring is not None
    keyring = spec.keyring
    _refused(lambda: KeyringBackend(keyring, ctx), pipe, f"keyring: cannot read .*{REFUSED}")


def test_a_json_schema_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    spec = ValidateSpec.model_validate({"json_schema_file": pipe.name})
    _refused(lambda: BUILDERS["validate"](spec, ctx), pipe,
             f"cannot read JSON Schema {pipe}: {REFUSED}")


def test_an_avro_schema_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    spec = ValidateSpec.model_validate({"avro_schema": {"file": pipe.name}})
    _refused(lambda: BUILDERS["validate"](spec, ctx), pipe,
             f"cannot read Avro schema {pipe}: {REFUSED}")


def test_a_registry_ca_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    spec = SchemaRegistryRef(url="https://registry.invalid:8081", ca_file=pipe.name)
    _refused(lambda: registry_client(spec, ctx), pipe, f"cannot use CA file {pipe}: {REFUSED}")


def test_a_kms_ca_file_that_is_a_fifo_is_refused(ctx: BuildContext, pipe: Path) -> None:
    """boto3 reads the bundle at the first call, on the data path: refused when built."""
    spec = KmsAws(endpoint="https://kms.invalid", ca_file=pipe.name)
    _refused(lambda: AwsKmsBackend(spec, ctx, 1.0), pipe,
             f"cannot use CA file {pipe}: {REFUSED}")


def test_files_that_are_dev_zero_are_refused_not_read(tmp_path: Path) -> None:
    """In a child process of bounded memory: reading /dev/zero must not take this one's."""
    (tmp_path / "zero").symlink_to("/dev/zero")
    script = """
import json, sys
from pathlib import Path
from filter_rules.record_actions import EncryptSpec, KmsSpec, ValidateSpec
from interceptors import BuildContext, InterceptorConfigError
from interceptors.builtin import BUILDERS
from interceptors.kms import KeyringBackend

ctx = BuildContext(base_dir=Path(sys.argv[1]), environ={})
keyring = KmsSpec.model_validate({"keyring": {"secret": {"file": "zero"}, "key": "k"}}).keyring
attempts = {
    "key": lambda: BUILDERS["encrypt"](EncryptSpec.model_validate(
        {"key": {"id": "k1", "secret": {"file": "zero"}}}), ctx),
    "keyring": lambda: KeyringBackend(keyring, ctx),
    "json_schema_file": lambda: BUILDERS["validate"](ValidateSpec.model_validate(
        {"json_schema_file": "zero"}), ctx),
    "avro": lambda: BUILDERS["validate"](ValidateSpec.model_validate(
        {"avro_schema": {"file": "zero"}}), ctx),
}
out = {}
for name, attempt in attempts.items():
    try:
        attempt()
        out[name] = "built"
    except InterceptorConfigError as err:
        out[name] = str(err)
    except MemoryError:
        out[name] = "MemoryError"
print(json.dumps(out))
"""
    done = run_capped("-c", script, str(tmp_path))
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert set(outcome) == {"key", "keyring", "json_schema_file", "avro"}
    for name, message in outcome.items():
        assert "not a regular file (a character device)" in message, (name, message)
