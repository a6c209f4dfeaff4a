"""keg up's state directories: one per rule directory, locked while a process uses it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from keg.state import DirectoryLock, StateInUse, up_state_dir


def test_one_state_directory_per_rule_directory(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "rules").mkdir()
    (tmp_path / "other" / "rules").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    state = up_state_dir(cache, Path("rules"))
    assert state == up_state_dir(cache, tmp_path / "rules")  # however it is spelled
    assert state == up_state_dir(cache, tmp_path / "other" / ".." / "rules")
    assert state.parent == cache / "up" and state.name.startswith("rules-")
    assert up_state_dir(cache, tmp_path / "other" / "rules") != state  # same name, elsewhere
    odd = tmp_path / "odd name:x"
    odd.mkdir()
    assert up_state_dir(cache, odd).name.startswith("odd_name_x-")


def test_a_locked_directory_refuses_a_second_holder_until_released(tmp_path: Path) -> None:
    first = DirectoryLock(tmp_path / "state", "keg up's state").start()
    with pytest.raises(StateInUse) as refused:
        DirectoryLock(tmp_path / "state", "keg up's state").start()
    assert str(refused.value) == (f"{tmp_path / 'state'} (keg up's state) is in use by another "
                                  f"keg process (pid {os.getpid()})")
    first.stop()
    first.stop()  # twice is fine
    with DirectoryLock(tmp_path / "state", "keg up's state"):
        pass
