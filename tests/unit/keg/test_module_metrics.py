"""How `keg up` asks keg's Kafka filter for its labelled metrics: node metadata in the
Envoy bootstrap, with the ext_proc service's label bounds."""

from __future__ import annotations

import yaml

from control_plane.native_filter import METRICS_KEY
from keg.embedded.envoy import render_bootstrap
from keg.gateway import module_metrics_options


def test_the_bounds_and_topic_reading_are_the_ext_proc_services() -> None:
    assert module_metrics_options("127.0.0.1:9463", {}) == {"address": "127.0.0.1:9463"}
    env = {"KEG_METRICS_MAX_TOPICS": "20", "KEG_METRICS_MAX_CLIENTS": " 5 ",
           "KEG_METRICS_MAX_PRINCIPALS": "lots", "KEG_METRICS_TOPICS": "false",
           "KEG_METRICS_MAX_SERIES": "7"}
    assert module_metrics_options("h:1", env) == {
        "address": "h:1", "max_topics": 20, "max_clients": 5, "max_series": 7, "topics": False}


def test_the_node_metadata_reaches_the_bootstrap() -> None:
    metadata = {METRICS_KEY: module_metrics_options("127.0.0.1:9463", {})}
    text = render_bootstrap("n", "keg", "127.0.0.1", 1, metadata=metadata)
    assert yaml.safe_load(text)["node"]["metadata"] == metadata
    assert "metadata" not in yaml.safe_load(render_bootstrap("n", "keg", "127.0.0.1", 1))["node"]
