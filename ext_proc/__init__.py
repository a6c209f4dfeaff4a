"""keg's data path: an Envoy network ext_proc service that understands Kafka.

`server` is the grpc.aio adapter; `session` holds one Kafka connection's state
(framing both ways, correlation, filters); `filters` are the per-API transformations.
"""

from ext_proc.server import ExtProcServer, ProcessorSettings

__all__ = ["ExtProcServer", "ProcessorSettings"]
