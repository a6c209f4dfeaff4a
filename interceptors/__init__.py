"""Record-level actions: KIP-905 interceptors run by the gateway (and by backtests).

`contract` is what an interceptor is; `builtin` holds the declarative actions
(mask, encrypt, decrypt, validate, headers, drop, copy); `custom` loads users'
classes by import path; `engine` compiles a rule set's record rules and runs them
over record batches. This package imports `filter_rules` and `kafka_wire` only: the
data path (`ext_proc`) and the Spark pipeline share it.
"""

from interceptors.contract import (
    BuildContext,
    InterceptedRecord,
    Interceptor,
    InterceptorConfigError,
    NoSideEffects,
    RecordRejected,
    SideEffects,
)

__all__ = [
    "BuildContext",
    "InterceptedRecord",
    "Interceptor",
    "InterceptorConfigError",
    "NoSideEffects",
    "RecordRejected",
    "SideEffects",
]
