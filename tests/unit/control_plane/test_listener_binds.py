"""Listeners an Envoy could not bind: which, when they go again, and how they are marked."""

from __future__ import annotations

from envoy.config.listener.v3 import listener_pb2

from control_plane.listener_binds import (
    ATTEMPT_FIELD,
    MAX_RETRY_S,
    METADATA_KEY,
    UnboundListeners,
    unbound_listeners,
)

# As Envoy 1.40 words it (seen in the integration test's NACK).
NACK = ("Error adding/updating listener(s) kafka_broker_2: cannot bind '127.0.0.1:19093': "
        "Address already in use\nkafka_broker_3: cannot bind '127.0.0.1:19094': "
        "Address already in use\n")


def listeners() -> dict[str, listener_pb2.Listener]:
    return {name: listener_pb2.Listener(name=name, stat_prefix=name)
            for name in ("kafka_broker_1", "kafka_broker_2", "kafka_broker_3")}


def attempt(listener: object) -> float | None:
    assert isinstance(listener, listener_pb2.Listener)
    if METADATA_KEY not in listener.metadata.filter_metadata:
        return None
    return listener.metadata.filter_metadata[METADATA_KEY].fields[ATTEMPT_FIELD].number_value


def test_a_nack_names_each_listener_it_could_not_bind() -> None:
    assert unbound_listeners(NACK) == {
        "kafka_broker_2": "cannot bind 127.0.0.1:19093: Address already in use",
        "kafka_broker_3": "cannot bind 127.0.0.1:19094: Address already in use"}
    assert unbound_listeners("Error adding/updating listener(s) x: invalid filter") == {}


def test_unbound_listeners_go_again_later_each_time_up_to_a_bound() -> None:
    binds = UnboundListeners()
    assert binds.refused("edge", "some other refusal") is None
    delays = []
    for _ in range(8):
        delay = binds.refused("edge", NACK)
        assert delay is not None
        delays.append(delay)
        assert binds.retry("edge")
    assert delays == sorted(delays) and delays[0] == 1.0 and delays[-1] == MAX_RETRY_S
    assert len(binds.problems()) == 2 and "kafka_broker_2" in binds.problems()[0]


def test_only_the_unbound_listeners_are_marked_and_stay_marked_once_bound() -> None:
    binds = UnboundListeners()
    assert binds.marked("edge", listeners()) is None
    binds.refused("edge", NACK.split("\n")[0])  # broker 2's only
    assert binds.marked("edge", listeners()) is None  # not tried again yet
    binds.retry("edge")
    marked = binds.marked("edge", listeners())
    assert marked is not None
    assert [attempt(marked[n]) for n in sorted(marked)] == [None, 1.0, None]
    assert marked["kafka_broker_1"] == listeners()["kafka_broker_1"]
    binds.accepted("edge")  # bound now: no problem, and the listener is not changed again
    assert binds.problems() == [] and not binds.retry("edge")
    again = binds.marked("edge", listeners())
    assert again is not None and attempt(again["kafka_broker_2"]) == 1.0
    assert binds.marked("other", listeners()) is None
    binds.forget("edge")
    assert binds.marked("edge", listeners()) is None
