"""`keg validate` on a rule directory holding a FIFO, a symlink to /dev/zero, or rules
naming such a file as a key: it ends, exit 1, one clear line per file. Regression: it
hung forever on the FIFO and died of a MemoryError (a traceback) on /dev/zero.

The real command in a child process of bounded memory, killed if it hangs."""

from __future__ import annotations

from pathlib import Path

from tests.unit.special_files import fifo, run_capped, zero_link

RULE = "rules:\n  - id: deny-all\n    action: {deny: {}}\n"
NOT_REGULAR = "not a regular file ({})"
UNREADABLE = "cannot read: " + NOT_REGULAR


def _validate(*args: str) -> tuple[int, str]:
    done = run_capped("-m", "keg", "validate", *args)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    return done.returncode, output


def test_validate_refuses_a_fifo_and_a_dev_zero_link_in_the_directory(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(RULE)
    pipe = fifo(tmp_path / "fifo.yaml")
    zero = zero_link(tmp_path / "zero.yaml")
    code, output = _validate(str(tmp_path), "--no-secrets")
    assert code == 1, output
    assert f"{pipe}: {UNREADABLE.format('a FIFO')}" in output
    assert f"{zero}: {UNREADABLE.format('a character device')}" in output
    assert f"{tmp_path}: 2 problem(s)" in output


def test_validate_refuses_a_dev_zero_link_alone(tmp_path: Path) -> None:
    zero = zero_link(tmp_path / "zero.yaml")
    code, output = _validate(str(tmp_path), "--no-secrets")
    assert code == 1, output
    assert f"{zero}: {UNREADABLE.format('a character device')}" in output


def test_validate_refuses_key_files_that_are_a_fifo_or_dev_zero(tmp_path: Path) -> None:
    """The secrets check reads the key files as the ext_proc service will: at the line of
    each `file:`, the reason."""
    (tmp_path / "keys.yaml").write_text(
        "rules:\n"
        "  - id: encrypt-card\n"
        "    action:\n"
        "      encrypt:\n"
        "        key: {id: k1, secret: {file: card.key}}\n"
        "  - id: hash-email\n"
        "    action:\n"
        "      mask:\n"
        "        fields: [$.email]\n"
        "        method: hash\n"
        "        hash_key: {file: hash.key}\n")
    pipe = fifo(tmp_path / "card.key")
    zero = zero_link(tmp_path / "hash.key")
    code, output = _validate(str(tmp_path))
    assert code == 1, output
    assert (f"{tmp_path / 'keys.yaml'}:5:32: encrypt-card.action.encrypt.key.secret.file: "
            f"key k1: cannot read {pipe}: {NOT_REGULAR.format('a FIFO')}") in output
    assert (f"{tmp_path / 'keys.yaml'}:11:20: hash-email.action.mask.hash_key.file: "
            f"hash_key: cannot read {zero}: {NOT_REGULAR.format('a character device')}"
            ) in output
