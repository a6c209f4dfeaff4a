"""Users' own interceptors: a class named by import path in a rule file.

    action:
      interceptor:
        class: my_company.kafka:PiiScrubber     # module:Class
        config: {field: ssn}                    # given once to configure()
        timeout_ms: 200                         # budget per batch, per attempt
        retries: 1                              # attempts after a timeout

The module is imported normally (it must be on the ext_proc instance's Python path)
or, failing that, loaded from `<module path>.py` next to the rule file, so a rule
directory can carry its interceptors. The class is instantiated without arguments
and configured once, when the rule set is compiled: an import error, a missing
class or a `configure` that raises refuses the whole rule set (the last good one
stays). See filter_rules/examples/interceptors/ for a complete example.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from filter_rules.record_actions import InterceptorSpec
from interceptors.contract import BuildContext, Interceptor, InterceptorConfigError


def build_custom(spec: InterceptorSpec, context: BuildContext) -> Interceptor:
    module_name, _, class_name = spec.class_.partition(":")
    module = _import(module_name, context)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise InterceptorConfigError(f"module '{module_name}' has no class '{class_name}'")
    try:
        instance: Any = cls()
    except Exception as err:
        raise InterceptorConfigError(f"{spec.class_}() failed: {type(err).__name__}: {err}") \
            from None
    if not callable(getattr(instance, "intercept", None)):
        raise InterceptorConfigError(f"{spec.class_} has no intercept(record) method")
    configure = getattr(instance, "configure", None)
    if callable(configure):
        try:
            configure(dict(spec.config))
        except Exception as err:
            raise InterceptorConfigError(
                f"{spec.class_}.configure() failed: {type(err).__name__}: {err}") from None
    return instance


def _import(module_name: str, context: BuildContext) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and not module_name.startswith(err.name):
            raise InterceptorConfigError(f"importing '{module_name}' failed: {err}") from None
    except Exception as err:
        raise InterceptorConfigError(
            f"importing '{module_name}' failed: {type(err).__name__}: {err}") from None
    path = context.resolve(module_name.replace(".", "/") + ".py")
    if not path.is_file():
        raise InterceptorConfigError(
            f"no module '{module_name}' on the Python path, nor a file {path}")
    unique = f"keg_interceptor_{abs(hash(str(path)))}_{path.stat().st_mtime_ns}"
    loader_spec = importlib.util.spec_from_file_location(unique, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InterceptorConfigError(f"cannot load {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[unique] = module  # dataclasses and pickling look modules up by name
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[unique]
        raise InterceptorConfigError(f"loading {path} failed: {type(err).__name__}: {err}") \
            from None
    return module
