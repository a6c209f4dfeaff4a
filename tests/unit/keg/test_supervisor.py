"""The supervisor's logic on fake children (real ones: tests/integration/runtime/test_faults.py),
and the environment keg gives its children."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from filter_rules import load_rule_text
from interceptors.secrets import secret_env_names
from keg.children import BASE, ENVOY, JAVA, PYTHON, child_environment, die_with_parent
from keg.supervisor import RESTARTING, UP, Backoff, Child, Supervisor, describe_exit


class FakeChild:
    """A child whose exit the test decides; `restart()` waits for `gate` and fails
    `failures` times first."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.starts = 0
        self.failures = 0
        self.gate = threading.Event()
        self.gate.set()

    def restart(self) -> None:
        assert self.gate.wait(10)
        self.starts += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError("port 50051 in use")
        self.code = None

    def child(self) -> Child:
        return Child(poll=lambda: self.code, restart=self.restart, pid=lambda: 100 + self.starts)


def wait_for(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    supervisor = Supervisor(backoff=Backoff(initial_s=0.01, max_s=0.02), poll_interval_s=0.005)
    yield supervisor
    supervisor.stop()


def sample(supervisor: Supervisor, name: str, component: str) -> float | None:
    return supervisor.registry.get_sample_value(name, {"component": component})


def test_backoff_restarts_at_once_then_doubles_up_to_its_maximum() -> None:
    backoff = Backoff(first_s=0.0, initial_s=0.5, max_s=30.0)
    assert [backoff.delay(n) for n in range(1, 10)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0,
                                                         30.0, 30.0]


def test_how_a_process_ended_is_said_plainly() -> None:
    assert describe_exit(-9) == "signal 9 (SIGKILL)"
    assert describe_exit(3) == "exit code 3"


def test_an_exited_child_is_restarted_logged_and_counted(
        supervisor: Supervisor, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeChild()
    supervisor.watch("ext_proc", fake.child())
    assert sample(supervisor, "keg_component_up", "ext_proc") == 1.0
    assert sample(supervisor, "keg_component_restarts_total", "ext_proc") == 0.0
    with caplog.at_level(logging.ERROR, logger="keg.supervisor"):
        fake.code = -9
        wait_for("the restart", lambda: fake.starts == 1 and supervisor.problems() == [])
    assert fake.code is None
    assert sample(supervisor, "keg_component_restarts_total", "ext_proc") == 1.0
    assert sample(supervisor, "keg_component_up", "ext_proc") == 1.0
    (status,) = supervisor.status()
    assert (status.state, status.restarts, status.last_exit) == (UP, 1, "signal 9 (SIGKILL)")
    assert "ext_proc (pid 100) exited with signal 9 (SIGKILL)" in caplog.text


def test_a_child_being_restarted_is_reported_down(supervisor: Supervisor) -> None:
    fake = FakeChild()
    fake.gate.clear()  # its start hangs until the test lets it go
    supervisor.watch("envoy", fake.child())
    fake.code = 1
    # The state turns to restarting before the restart is counted: wait for both (a
    # loaded machine read the state in between, "0 restart(s) so far").
    restarting = "envoy restarting (its process ended with exit code 1; 1 restart(s) so far)"
    wait_for("the restart to begin", lambda: supervisor.problems() == [restarting])
    assert supervisor.status()[0].state == RESTARTING
    assert sample(supervisor, "keg_component_up", "envoy") == 0.0
    fake.gate.set()
    wait_for("envoy up", lambda: supervisor.problems() == [])
    assert sample(supervisor, "keg_component_up", "envoy") == 1.0


def test_a_child_that_cannot_start_is_tried_again_until_it_can(
        supervisor: Supervisor, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeChild()
    fake.failures = 3
    supervisor.watch("kafka", fake.child())
    with caplog.at_level(logging.ERROR, logger="keg.supervisor"):
        fake.code = -9
        wait_for("the fourth start", lambda: fake.starts == 4 and supervisor.problems() == [])
    assert sample(supervisor, "keg_component_restarts_total", "kafka") == 4.0
    assert caplog.text.count("kafka did not come back: port 50051 in use") == 3


def test_a_child_that_stops_answering_is_killed_and_so_restarted(
        caplog: pytest.LogCaptureFixture) -> None:
    """A stopped (SIGSTOP) or deadlocked worker is there but does not answer: nothing
    noticed, and its connections waited for as long as it lasted. Real processes: a
    `sleep` that never answers is killed; its exit restarts it."""
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        processes.append(subprocess.Popen(["sleep", "60"]))

    start()
    answering = threading.Event()
    supervisor = Supervisor(backoff=Backoff(initial_s=0.01, max_s=0.02), poll_interval_s=0.005,
                            probe_interval_s=0.02, hung_after_s=0.2)
    try:
        with caplog.at_level(logging.ERROR, logger="keg.supervisor"):
            supervisor.watch("ext_proc", Child(
                poll=lambda: processes[-1].poll(), restart=start,
                pid=lambda: processes[-1].pid, answers=answering.is_set))
            wait_for("the kill and restart", lambda: len(processes) == 2)
            answering.set()  # the new one answers: left alone
            time.sleep(0.5)
        assert processes[0].returncode == -9 and processes[1].poll() is None
        assert len(processes) == 2
        assert f"ext_proc (pid {processes[0].pid}) has not answered for 0 s: killing it" \
            in caplog.text
    finally:
        supervisor.stop()
        for process in processes:
            process.kill()
            process.wait()


def test_a_child_no_longer_watched_is_left_alone(supervisor: Supervisor) -> None:
    fake = FakeChild()
    supervisor.watch("ext_proc", fake.child())
    supervisor.unwatch("ext_proc")
    fake.code = 0
    time.sleep(0.05)  # ten polls' worth: nothing may happen, so nothing to wait for
    assert fake.starts == 0 and supervisor.status() == []
    assert sample(supervisor, "keg_component_up", "ext_proc") is None
    # Watched again (started again on purpose): its earlier restarts still count.
    fake.code = None
    supervisor.watch("ext_proc", fake.child())
    assert supervisor.status()[0].state == UP


def test_children_get_their_allow_list_and_what_is_named_for_them() -> None:
    parent = {"PATH": "/usr/bin", "HOME": "/home/k", "LC_ALL": "C.UTF-8", "TZ": "UTC",
              "JAVA_HOME": "/opt/jdk", "VIRTUAL_ENV": "/venv", "KEG_CARD_KEY": "secret",
              "KEG_API_TOKENS": "ops:token", "AWS_SECRET_ACCESS_KEY": "secret"}
    assert child_environment(ENVOY, environ=parent) == {
        "PATH": "/usr/bin", "HOME": "/home/k", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
    assert child_environment(JAVA, environ=parent)["JAVA_HOME"] == "/opt/jdk"
    assert "JAVA_HOME" not in child_environment(PYTHON, environ=parent)
    ext_proc = child_environment((*PYTHON, "KEG_CARD_KEY"), {"EXTRA": "1"}, environ=parent)
    assert ext_proc == {"PATH": "/usr/bin", "HOME": "/home/k", "LC_ALL": "C.UTF-8",
                        "TZ": "UTC", "VIRTUAL_ENV": "/venv", "KEG_CARD_KEY": "secret",
                        "EXTRA": "1"}
    assert set(BASE) <= set(PYTHON) and set(BASE) <= set(JAVA)


def test_a_child_is_started_to_end_with_keg() -> None:
    command = die_with_parent(["envoy", "-c", "x"])
    assert command[-3:] == ["envoy", "-c", "x"]
    if len(command) > 3:  # Linux with util-linux
        assert command[1:4] == ["--pdeathsig", "TERM", "--"]


def test_the_key_variables_a_rule_set_reads() -> None:
    ruleset = load_rule_text("""
rules:
  - id: enc
    action:
      encrypt: {fields: [$.a], key: {id: k1, secret: {env: KEG_A_KEY}}}
  - id: dec
    match: {direction: response}
    action:
      decrypt: {fields: [$.a], keys: [{id: k1, secret: {env: KEG_A_KEY}},
                                      {id: k0, secret: {env: KEG_OLD_KEY}}]}
  - id: hash
    action: {mask: {fields: [$.b], method: hash, hash_key: {env: KEG_HASH_KEY}}}
  - id: from-a-file
    action:
      encrypt: {fields: [$.c], key: {id: k2, secret: {file: keys/k2}}}
  - id: switched-off
    mode: disabled
    action:
      encrypt: {fields: [$.d], key: {id: k3, secret: {env: KEG_UNUSED_KEY}}}
""", "rules.yaml")
    assert secret_env_names(ruleset) == {"KEG_A_KEY", "KEG_OLD_KEY", "KEG_HASH_KEY"}
