"""Rule files are regular files, read bounded: a FIFO or a device named `*.yaml` in a
rule directory is an error of its own, never read. Regression: a FIFO blocked the loader
(the control plane's reload thread, `keg validate`) forever, and a symlink to /dev/zero
(st_size 0) passed the size check and was read until MemoryError."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from filter_rules import RuleSetInvalid, load_rule_dir, load_rule_file
from filter_rules import loader as loader_module
from filter_rules.files import UnusableFile, check_regular_file, read_regular_file
from tests.unit.special_files import fifo, guarded, run_capped

RULE = "rules:\n  - id: deny-all\n    action: {deny: {}}\n"


def _errors(directory: Path, fifos: tuple[Path, ...] = ()) -> list[str]:
    def load() -> None:
        load_rule_dir(directory)

    with pytest.raises(RuleSetInvalid) as caught:
        guarded(load, fifos)
    return [str(error) for error in caught.value.errors]


def test_a_fifo_in_the_rule_directory_is_refused_not_read(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(RULE)
    pipe = fifo(tmp_path / "fifo.yaml")
    assert _errors(tmp_path, (pipe,)) == [
        f"{pipe}: cannot read: not a regular file (a FIFO)"]
    with pytest.raises(RuleSetInvalid, match="a FIFO"):
        guarded(lambda: load_rule_file(pipe), (pipe,))
    pipe.unlink()
    assert [rule.id for rule in load_rule_dir(tmp_path).rules] == ["deny-all"]


def test_a_symlink_to_a_fifo_is_refused_too(tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "pipe")  # not a rule file's name: only the link is loaded
    (tmp_path / "link.yaml").symlink_to(pipe)
    assert _errors(tmp_path, (pipe,)) == [
        f"{tmp_path / 'link.yaml'}: cannot read: not a regular file (a FIFO)"]


def test_a_symlink_to_dev_zero_is_refused_not_read() -> None:
    """In a child process of bounded memory: reading /dev/zero must not take this one's."""
    script = (
        "import sys, tempfile, pathlib\n"
        "from filter_rules import RuleSetInvalid, load_rule_dir\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "(d / 'zero.yaml').symlink_to('/dev/zero')\n"
        "(d / 'ok.yaml').write_text('rules: []\\n')\n"
        "try:\n"
        "    load_rule_dir(d)\n"
        "except RuleSetInvalid as err:\n"
        "    print('\\n'.join(e.message for e in err.errors))\n"
    )
    done = run_capped("-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "cannot read: not a regular file (a character device)"]


def test_a_directory_or_socket_named_like_a_rule_file_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dir.yaml").mkdir()
    monkeypatch.chdir(tmp_path)  # a socket's path is short (108 bytes)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock.yaml")
        errors = _errors(tmp_path)
    assert errors == [
        f"{tmp_path / 'dir.yaml'}: cannot read: not a regular file (a directory)",
        f"{tmp_path / 'sock.yaml'}: cannot read: not a regular file (a socket)"]


def _lying_size(real: os.stat_result) -> os.stat_result:
    fields = list(real)
    fields[6] = 0  # st_size, as /proc's files and some devices report it
    return os.stat_result(fields)


def test_a_file_larger_than_the_limit_is_refused_whatever_its_size_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit counts what is read: a file whose stat says 0 bytes is read up to the
    limit and one byte more, then refused."""
    monkeypatch.setattr(loader_module, "MAX_FILE_BYTES", 10)
    (tmp_path / "big.yaml").write_text("rules: []\n# more than ten bytes\n")
    real_stat, real_fstat = os.stat, os.fstat
    with monkeypatch.context() as patch:
        patch.setattr(os, "stat", lambda *a, **k: _lying_size(real_stat(*a, **k)))
        patch.setattr(os, "fstat", lambda fd: _lying_size(real_fstat(fd)))
        assert os.stat(tmp_path / "big.yaml").st_size == 0
        errors = _errors(tmp_path)
    assert errors == [f"{tmp_path / 'big.yaml'}: cannot read: file is larger than 10 bytes"]


def test_read_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert read_regular_file(path, 10) == b"0123456789"
    assert check_regular_file(path, 10).st_size == 10
    (tmp_path / "link").symlink_to(path)
    assert read_regular_file(tmp_path / "link") == b"0123456789"
    with pytest.raises(UnusableFile, match=r"^file is larger than 9 bytes$") as caught:
        read_regular_file(path, 9)
    assert isinstance(caught.value, OSError) and caught.value.filename == str(path)
    assert caught.value.strerror == "file is larger than 9 bytes"
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "missing")
    with pytest.raises(UnusableFile, match=r"not a regular file \(a character device\)"):
        check_regular_file("/dev/zero")


def test_a_file_swapped_for_a_fifo_after_its_stat_is_refused_without_blocking(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stat said regular file; what was opened is a FIFO (swapped meanwhile): the open
    does not wait for a writer and the opened file's own fstat refuses it."""
    regular = tmp_path / "regular"
    regular.write_text("x")
    pipe = fifo(tmp_path / "pipe")
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(
        regular if Path(p) == pipe else p, *a, **k))
    with pytest.raises(UnusableFile, match=r"not a regular file \(a FIFO\)"):
        guarded(lambda: read_regular_file(pipe), (pipe,))
