"""What a rule makes the gateway's own host do for it: read a file or an environment
variable, run code, write files, use the host's cloud credentials.

A rule directory is written by whoever runs the gateway; the REST API also takes rules
from tokens scoped to some owners (`owner=` in the token file: a team's rules), and
from anyone who may read (a dry run). Those callers must not reach the host through a
rule: a key file named in an `encrypt` makes the gateway read it (and a dry run with
records becomes an encryption/decryption oracle with the host's keys), an interceptor
class is imported and run, a FIFO named as a file blocks the thread that reads it.
`host_resources` lists what a rule reaches, so the API can keep those rules for
unscoped tokens (see docs/control-plane-api.md, "Rules that reach the host").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from filter_rules.model import Rule
from filter_rules.record_actions import CaptureSpec, InterceptorSpec, KmsAws, SecretRef


def host_resources(rule: Rule) -> list[str]:
    """What of the gateway host `rule` uses, described for an error message (empty:
    nothing: the rule only matches and acts on the traffic)."""
    return sorted(set(_walk(rule)))


def _walk(value: Any) -> Iterator[str]:
    if isinstance(value, BaseModel):
        yield from _own(value)
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)


def _own(model: BaseModel) -> Iterator[str]:
    if isinstance(model, SecretRef):
        yield (f"the environment variable {model.env}" if model.env is not None
               else f"the file {model.file}")
        return
    if isinstance(model, InterceptorSpec):
        yield f"code (interceptor class {model.class_})"
    elif isinstance(model, CaptureSpec):
        yield f"writes under the directory {model.path}"
    elif isinstance(model, KmsAws) and model.access_key_id is None:
        yield "the host's AWS credentials"
    for name in type(model).model_fields:
        path = getattr(model, name)
        if (name == "file" or name.endswith("_file")) and isinstance(path, str):
            yield f"the file {path}"
