"""Record-level actions: KIP-905 interceptors run by the gateway (and by backtests).

`contract` is what an interceptor is; `builtin` holds the declarative actions
(mask, encrypt, decrypt, validate, schema, headers, drop, copy); `custom` loads users'
classes by import path; `engine` compiles a rule set's record rules and runs them
over record batches; `registry`, `kms` and `remote` are the clients of the services
rules call (schema registries, KMSs), bounded and cached, held by `services`. This
package imports `filter_rules` and `kafka_wire` only: the data path (`ext_proc`) and
the Spark pipeline share it.
"""

from interceptors.contract import (
    BatchCheck,
    BuildContext,
    InterceptedRecord,
    Interceptor,
    InterceptorConfigError,
    NoSideEffects,
    RecordRejected,
    ServiceUnavailable,
    SideEffects,
)

__all__ = [
    "BatchCheck",
    "BuildContext",
    "InterceptedRecord",
    "Interceptor",
    "InterceptorConfigError",
    "NoSideEffects",
    "RecordRejected",
    "ServiceUnavailable",
    "SideEffects",
]
