"""keg up's checks of the ports it is given, before anything starts."""

from __future__ import annotations

from pathlib import Path

from keg.cli import ephemeral_range, ports_in_ephemeral_range


def test_ports_the_kernel_may_give_outgoing_connections_are_named(tmp_path: Path) -> None:
    proc = tmp_path / "ip_local_port_range"
    proc.write_text("32768\t60999\n")
    ephemeral = ephemeral_range(proc)
    assert ephemeral == (32768, 60999)
    ports: list[tuple[str, str, int | None]] = [
        ("--listen-port-base", "127.0.0.1", 19092), ("--api-port", "127.0.0.1", 0),
        ("--internal-port-base (+1: ext_proc-0)", "127.0.0.1", 49201),
        ("--module-metrics-port", "127.0.0.1", None)]
    assert ports_in_ephemeral_range(ports, ephemeral) == [
        "--internal-port-base (+1: ext_proc-0) 49201"]
    assert ports_in_ephemeral_range(ports, None) == []
    assert ephemeral_range(tmp_path / "absent") is None
