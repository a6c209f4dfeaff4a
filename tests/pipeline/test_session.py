"""The session's JVM as keg starts it (pipeline.spark.build_session)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_the_jvm_was_launched_in_a_process_group_of_its_own(spark: SparkSession) -> None:
    # Proof that PySpark launched it through keg's gateway_popen (no preexec_fn, which
    # can crash the child in a process with gRPC's threads), not its own Popen.
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    jvm = gateway.proc
    assert jvm is not None and jvm.poll() is None
    assert os.getpgid(jvm.pid) == jvm.pid != os.getpgid(0)
