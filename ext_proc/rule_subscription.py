"""Rules from the control plane: an xDS (SotW ADS) subscription to keg's rule-set type.

The ext_proc instance is an xDS node (metadata `keg.role: ext_proc`) subscribed to
`type.googleapis.com/keg.v1.RuleSet`: one resource, an Any whose value is a
`google.protobuf.BytesValue` holding the rule set as JSON
(`RuleSet.model_dump(mode="json", by_alias=True)`, sources included). Each
response is validated and compiled, installed into the engine (live connections
pick it up on their next request, nothing is closed) and ACKed; a rule set that
does not validate or build is NACKed with the error and the running one stays.

The last good set is written to a local file (atomically) and installed from there
at start, so an instance restarted while the control plane is down still enforces
it. After a disconnect the subscription reconnects with exponential backoff and
jitter, and resumes: its first request names the version it runs, and a control
plane with nothing newer sends nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, struct_pb2, wrappers_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2

from ext_proc.filters.rules import RuleEngine
from ext_proc.metrics import Metrics
from filter_rules import CompiledRuleSet, RuleSet
from interceptors import InterceptorConfigError

log = logging.getLogger(__name__)

RULES_TYPE_URL = "type.googleapis.com/keg.v1.RuleSet"
RULE_SET_RESOURCE = "rules"
EXT_PROC_CLUSTER = "keg-ext-proc"


class RuleSetRejected(ValueError):
    """A distributed rule set this instance will not run (the NACK's message)."""


def encode_rule_set(ruleset: RuleSet) -> any_pb2.Any:
    payload = json.dumps(ruleset.model_dump(mode="json", by_alias=True),
                         separators=(",", ":"), sort_keys=True).encode()
    return any_pb2.Any(type_url=RULES_TYPE_URL,
                       value=wrappers_pb2.BytesValue(value=payload).SerializeToString())


def decode_rule_set(resource: any_pb2.Any) -> RuleSet:
    if resource.type_url != RULES_TYPE_URL:
        raise RuleSetRejected(f"expected a {RULES_TYPE_URL} resource, got {resource.type_url}")
    try:
        payload = wrappers_pb2.BytesValue.FromString(resource.value).value
        data = json.loads(payload)
    except (DecodeError, ValueError) as err:
        raise RuleSetRejected(f"rule set resource is not JSON in a BytesValue: {err}") from err
    try:
        return RuleSet.model_validate(data)
    except ValueError as err:  # pydantic's ValidationError included
        raise RuleSetRejected(f"rule set does not validate: {err}") from err


def compile_rule_set(ruleset: RuleSet) -> CompiledRuleSet:
    try:
        return CompiledRuleSet(ruleset)
    except ValueError as err:
        raise RuleSetRejected(f"rule set does not compile: {err}") from err


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter between reconnects."""

    initial_s: float = 0.2
    max_s: float = 10.0

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_s, self.initial_s * 2 ** min(attempt, 30))
        return random.uniform(ceiling / 2, ceiling)


def default_node_id(port: int) -> str:
    return f"ext-proc-{socket.gethostname()}-{port}-{os.getpid()}"


class RuleSubscription:
    """Keeps `engine` on the control plane's rule set; `run()` until cancelled."""

    def __init__(self, target: str, engine: RuleEngine, node_id: str, *,
                 cache_file: Path | None = None, metrics: Metrics | None = None,
                 backoff: Backoff = Backoff(), cluster: str = EXT_PROC_CLUSTER,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.target = target
        self.credentials = credentials  # TLS to the control plane; None: plaintext
        self.engine = engine
        self.node_id = node_id
        self.cache_file = cache_file
        self.metrics = metrics
        self.backoff = backoff
        self.cluster = cluster
        self.version = ""  # the version this instance runs ("" before any)
        self.connected = False
        self.last_error: str | None = None
        self.connects = 0  # streams established

    # -- applying ----------------------------------------------------------------------

    def apply(self, version: str, resources: Sequence[any_pb2.Any]) -> None:
        """Validate, compile and install one response; RuleSetRejected if it is refused."""
        try:
            if len(resources) != 1:
                raise RuleSetRejected(
                    f"expected exactly one {RULES_TYPE_URL} resource, got {len(resources)}")
            ruleset = decode_rule_set(resources[0])
            self._install(version, ruleset)
        except RuleSetRejected as err:
            self.last_error = str(err)
            if self.metrics is not None:
                self.metrics.rule_reload("rejected")
            log.error("rule set version %s refused, keeping version %s: %s",
                      version, self.version or "(none)", err)
            raise
        self._persist(version, ruleset)

    def _install(self, version: str, ruleset: RuleSet) -> None:
        compiled = compile_rule_set(ruleset)
        try:
            self.engine.install(compiled)
        except (InterceptorConfigError, ValueError) as err:
            raise RuleSetRejected(f"rule set cannot be installed: {err}") from err
        self.version = version
        self.last_error = None
        if self.metrics is not None:
            self.metrics.rule_reload("applied")
            self.metrics.set_rule_set_version(version)
        log.info("rule set version %s applied: %d rules", version, len(compiled))

    def _persist(self, version: str, ruleset: RuleSet) -> None:
        if self.cache_file is None:
            return
        body = {"version": version, "ruleset": ruleset.model_dump(mode="json", by_alias=True)}
        tmp = self.cache_file.with_name(self.cache_file.name + ".tmp")
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(body, separators=(",", ":")))
            os.replace(tmp, self.cache_file)  # readers never see half a file
        except OSError as err:
            log.warning("could not keep the rule set in %s: %s", self.cache_file, err)

    def restore(self) -> bool:
        """Install the last good rule set from the cache file, if there is one."""
        if self.cache_file is None or not self.cache_file.exists():
            return False
        try:
            body = json.loads(self.cache_file.read_text())
            version = body["version"]
            ruleset = RuleSet.model_validate(body["ruleset"])
            if not isinstance(version, str):
                raise TypeError("version is not a string")
            self._install(version, ruleset)
        except (OSError, ValueError, KeyError, TypeError, RuleSetRejected) as err:
            log.warning("ignoring the kept rule set in %s: %s", self.cache_file, err)
            return False
        log.info("serving the kept rule set version %s from %s until the control plane "
                 "answers", self.version, self.cache_file)
        return True

    # -- the stream --------------------------------------------------------------------

    def _node(self) -> base_pb2.Node:
        metadata = struct_pb2.Struct()
        metadata.update({"keg.role": "ext_proc"})
        return base_pb2.Node(id=self.node_id, cluster=self.cluster, metadata=metadata,
                             user_agent_name="keg-ext-proc")

    async def run(self) -> None:
        attempt = 0
        channel = (grpc.aio.secure_channel(self.target, self.credentials)
                   if self.credentials is not None else grpc.aio.insecure_channel(self.target))
        async with channel:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            while True:
                try:
                    if await self._stream(stub):
                        attempt = 0
                except grpc.aio.AioRpcError as err:
                    # Loud once when an established stream breaks; quiet while retrying
                    # (and while the control plane is still starting).
                    lost = self.connects and attempt == 0
                    log.log(logging.WARNING if lost else logging.INFO,
                            "rule stream to %s: %s", self.target, err.code().name)
                finally:
                    self.connected = False
                delay = self.backoff.delay(attempt)
                attempt += 1
                await asyncio.sleep(delay)

    async def _stream(self, stub: ads_pb2_grpc.AggregatedDiscoveryServiceStub) -> bool:
        """One stream until it ends; True if the control plane answered on it."""
        outbox: asyncio.Queue[discovery_pb2.DiscoveryRequest] = asyncio.Queue()

        async def requests() -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
            while True:
                yield await outbox.get()

        outbox.put_nowait(discovery_pb2.DiscoveryRequest(
            node=self._node(), type_url=RULES_TYPE_URL, version_info=self.version,
            resource_names=[],
        ))
        call = stub.StreamAggregatedResources(requests())
        answered = False
        try:
            await call.wait_for_connection()
            self.connected = True
            self.connects += 1
            log.info("rule stream to %s up (running version %s)", self.target,
                     self.version or "(none)")
            async for response in call:
                answered = True
                outbox.put_nowait(self._verdict(response))
        finally:
            call.cancel()
        return answered

    def _verdict(self, response: discovery_pb2.DiscoveryResponse
                 ) -> discovery_pb2.DiscoveryRequest:
        request = discovery_pb2.DiscoveryRequest(type_url=RULES_TYPE_URL,
                                                 response_nonce=response.nonce)
        try:
            if response.type_url != RULES_TYPE_URL:
                raise RuleSetRejected(f"unexpected type {response.type_url}")
            self.apply(response.version_info, response.resources)
        except RuleSetRejected as err:
            request.version_info = self.version
            request.error_detail.CopyFrom(status_pb2.Status(code=code_pb2.INVALID_ARGUMENT,
                                                            message=str(err)))
            return request
        request.version_info = self.version
        return request
