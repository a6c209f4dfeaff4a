"""Rules from the control plane: an xDS (SotW ADS) subscription to keg's rule-set type.

The ext_proc instance is an xDS node (metadata `keg.role: ext_proc`) subscribed to
`type.googleapis.com/keg.v1.RuleSet`: one resource, an Any whose value is a
`google.protobuf.BytesValue` holding the rule set as JSON
(`RuleSet.model_dump(mode="json", by_alias=True)`, sources included). Each
response is validated and compiled, installed into the engine (live connections
pick it up on their next request, nothing is closed) and ACKed; a rule set that
does not validate or build is NACKed with the error and the running one stays.

Large rule sets: a response carries the whole set (100,000 rules are about 50 MB of
JSON), so the stream accepts messages up to `max_rule_set_bytes` (default
MAX_RULE_SET_BYTES, 128 MiB, instead of gRPC's 4 MiB) and says so in its node
metadata (`keg.max_rule_set_bytes`): the control plane never sends a node more than
it accepts, and answers for it with a NACK naming the size instead (docs/xds.md).
Decoding, validating and compiling run in a worker thread, so the data path's event
loop goes on serving connections meanwhile; only the install is on the loop.

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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, struct_pb2, wrappers_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2

from ext_proc.filters.rules import RuleEngine
from ext_proc.heap import building
from ext_proc.metrics import Metrics
from ext_proc.private_files import private_dir, write_private
from ext_proc.rule_set_json import dumps_rule_set, loads_pieces, rule_set_from
from filter_rules import CompiledRuleSet, RuleSet
from interceptors import InterceptorConfigError
from interceptors.engine import RecordEngine

log = logging.getLogger(__name__)

RULES_TYPE_URL = "type.googleapis.com/keg.v1.RuleSet"
RULE_SET_RESOURCE = "rules"
EXT_PROC_CLUSTER = "keg-ext-proc"
# The largest xDS response (the whole rule set) an instance accepts by default, and the
# node metadata key that tells the control plane an instance's limit.
MAX_RULE_SET_BYTES: Final = 128 * 1024 * 1024
MAX_RULE_SET_BYTES_KEY: Final = "keg.max_rule_set_bytes"
# An instance with no rule set at all that refused the one served (it cannot build it
# here: a key file gone bad, a schema file missing) asks for it again this often. The
# version stays what the fleet serves (an instance's refusal does not take back a
# version another applied), so nothing new would come: once the file was fixed, the
# instance stayed without rules, and its connections stalled, until some rule changed.
NO_RULES_RETRY_S: Final = 5.0


Built = tuple[RecordEngine, CompiledRuleSet]  # RuleEngine.prepare's


class RuleSetRejected(ValueError):
    """A distributed rule set this instance will not run (the NACK's message)."""


def encode_rule_set(ruleset: RuleSet) -> any_pb2.Any:
    return any_pb2.Any(type_url=RULES_TYPE_URL, value=wrappers_pb2.BytesValue(
        value=dumps_rule_set(ruleset)).SerializeToString())


def decode_rule_set(resource: any_pb2.Any) -> RuleSet:
    return _decode(resource)[0]


def _decode(resource: any_pb2.Any) -> tuple[RuleSet, bytes]:
    """The rule set and the JSON it came as."""
    if resource.type_url != RULES_TYPE_URL:
        raise RuleSetRejected(f"expected a {RULES_TYPE_URL} resource, got {resource.type_url}")
    try:
        payload = wrappers_pb2.BytesValue.FromString(resource.value).value
        data = loads_pieces(payload)
    except (DecodeError, ValueError) as err:
        raise RuleSetRejected(f"rule set resource is not JSON in a BytesValue: {err}") from err
    try:
        return rule_set_from(data), payload
    except ValueError as err:  # pydantic's ValidationError included
        raise RuleSetRejected(f"rule set does not validate: {err}") from err


def compile_rule_set(ruleset: RuleSet) -> CompiledRuleSet:
    try:
        return CompiledRuleSet(ruleset)
    except ValueError as err:
        raise RuleSetRejected(f"rule set does not compile: {err}") from err


@dataclass(frozen=True)
class _Prepared:
    """A received rule set, validated and compiled (off the event loop), and the JSON it
    came as (what the cache file keeps)."""

    compiled: CompiledRuleSet
    payload: bytes
    built: Built  # what the engine installs (RuleEngine.prepare)


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
                 credentials: grpc.ChannelCredentials | None = None,
                 max_rule_set_bytes: int = MAX_RULE_SET_BYTES,
                 on_installed: Callable[[], None] | None = None,
                 no_rules_retry_s: float = NO_RULES_RETRY_S) -> None:
        if max_rule_set_bytes <= 0:
            raise ValueError("max_rule_set_bytes must be positive")
        self.target = target
        self.credentials = credentials  # TLS to the control plane; None: plaintext
        self.max_rule_set_bytes = max_rule_set_bytes
        self.engine = engine
        self.node_id = node_id
        self.cache_file = cache_file
        self.metrics = metrics
        self.on_installed = on_installed  # after each rule set installed (kept or new)
        self.backoff = backoff
        self.no_rules_retry_s = no_rules_retry_s
        self.cluster = cluster
        self.version = ""  # the version this instance runs ("" before any)
        self.connected = False
        self.last_error: str | None = None
        self.last_refused = ""  # the version last refused ("" before any)
        self.connects = 0  # streams established

    # -- applying ----------------------------------------------------------------------

    def apply(self, version: str, resources: Sequence[any_pb2.Any]) -> None:
        """Validate, compile and install one response; RuleSetRejected if it is refused."""
        self._install_prepared(version, self._prepare(version, resources))

    async def apply_async(self, version: str, resources: Sequence[any_pb2.Any]) -> None:
        """`apply`, with decoding, validation and compiling in a worker thread: the
        event loop (every connection's data path) is not held up by a large rule set."""
        self._install_prepared(version, await asyncio.to_thread(self._prepare, version,
                                                                resources))

    def _prepare(self, version: str, resources: Sequence[any_pb2.Any]) -> _Prepared:
        with building():  # no garbage collection walking the new rules meanwhile
            return self._prepare_now(version, resources)

    def _prepare_now(self, version: str, resources: Sequence[any_pb2.Any]) -> _Prepared:
        try:
            if len(resources) != 1:
                raise RuleSetRejected(
                    f"expected exactly one {RULES_TYPE_URL} resource, got {len(resources)}")
            ruleset, payload = _decode(resources[0])
            compiled = compile_rule_set(ruleset)
            return _Prepared(compiled, payload, self._build(compiled))
        except RuleSetRejected as err:
            self._refused(version, err)
            raise

    def _build(self, compiled: CompiledRuleSet) -> Built:
        try:
            return self.engine.prepare(compiled)
        except (InterceptorConfigError, ValueError) as err:
            raise RuleSetRejected(f"rule set cannot be installed: {err}") from err

    def _install_prepared(self, version: str, prepared: _Prepared) -> None:
        try:
            self._install(version, prepared.compiled, prepared.built)
        except RuleSetRejected as err:
            self._refused(version, err)
            raise
        self._persist(version, prepared.payload)

    def _refused(self, version: str, err: RuleSetRejected) -> None:
        self.last_error = str(err)
        if self.metrics is not None:
            self.metrics.rule_reload("rejected")
        log.error("rule set version %s refused, keeping version %s: %s",
                  version, self.version or "(none)", err)

    def _install(self, version: str, compiled: CompiledRuleSet, built: Built | None = None
                 ) -> None:
        try:
            self.engine.install(compiled, built)
        except (InterceptorConfigError, ValueError) as err:
            raise RuleSetRejected(f"rule set cannot be installed: {err}") from err
        self.version = version
        self.last_error = None
        if self.metrics is not None:
            self.metrics.rule_reload("applied")
            self.metrics.set_rule_set_version(version)
        log.info("rule set version %s applied: %d rules", version, len(compiled))
        if self.on_installed is not None:
            self.on_installed()

    def _persist(self, version: str, payload: bytes) -> None:
        """Keep `payload` (the rule set's JSON as it came) with its version."""
        if self.cache_file is None:
            return
        body = b"".join((b'{"version":', json.dumps(version).encode(), b',"ruleset":',
                         payload, b"}"))
        try:
            private_dir(self.cache_file.parent)
            write_private(self.cache_file, body)  # 0600, whole or not at all
        except OSError as err:
            log.warning("could not keep the rule set in %s: %s", self.cache_file, err)

    def restore(self) -> bool:
        """Install the last good rule set from the cache file, if there is one."""
        if self.cache_file is None or not self.cache_file.exists():
            return False
        try:
            with building():
                body = loads_pieces(self.cache_file.read_bytes())
                version = body["version"]
                ruleset = rule_set_from(body["ruleset"])
                if not isinstance(version, str):
                    raise TypeError("version is not a string")
                self._install(version, compile_rule_set(ruleset))
        except (OSError, ValueError, KeyError, TypeError, RuleSetRejected) as err:
            log.warning("ignoring the kept rule set in %s: %s", self.cache_file, err)
            return False
        log.info("serving the kept rule set version %s from %s until the control plane "
                 "answers", self.version, self.cache_file)
        return True

    # -- the stream --------------------------------------------------------------------

    def _node(self) -> base_pb2.Node:
        metadata = struct_pb2.Struct()
        metadata.update({"keg.role": "ext_proc",
                         MAX_RULE_SET_BYTES_KEY: self.max_rule_set_bytes})
        return base_pb2.Node(id=self.node_id, cluster=self.cluster, metadata=metadata,
                             user_agent_name="keg-ext-proc")

    async def run(self) -> None:
        attempt = 0
        options = [("grpc.max_receive_message_length", self.max_rule_set_bytes)]
        channel = (grpc.aio.secure_channel(self.target, self.credentials, options=options)
                   if self.credentials is not None
                   else grpc.aio.insecure_channel(self.target, options=options))
        async with channel:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            while True:
                try:
                    if await self._stream(stub):
                        attempt = 0
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        # A control plane that does not honour keg.max_rule_set_bytes.
                        self.last_error = (f"the control plane sent more than this instance "
                                           f"accepts ({self.max_rule_set_bytes} bytes, "
                                           f"--max-rule-set-bytes): {err.details()}")
                        log.error("rule stream to %s: %s", self.target, self.last_error)
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
        retry_at: float | None = None  # when to ask again for a refused set (no rules)
        loop = asyncio.get_running_loop()
        try:
            await call.wait_for_connection()
            self.connected = True
            self.connects += 1
            log.info("rule stream to %s up (running version %s)", self.target,
                     self.version or "(none)")
            responses = call.__aiter__()
            while True:
                wait = None if retry_at is None else max(0.0, retry_at - loop.time())
                try:
                    response = await asyncio.wait_for(anext(responses), wait)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    log.warning("no rule set running: asking %s for version %s again",
                                self.target, self.last_refused or "(any)")
                    break  # a new stream: the control plane sends what it serves
                answered = True
                verdict = await self._verdict(response)
                outbox.put_nowait(verdict)
                refused = verdict.HasField("error_detail") and not self.version
                retry_at = loop.time() + self.no_rules_retry_s if refused else None
        finally:
            call.cancel()
        return answered

    async def _verdict(self, response: discovery_pb2.DiscoveryResponse
                       ) -> discovery_pb2.DiscoveryRequest:
        request = discovery_pb2.DiscoveryRequest(type_url=RULES_TYPE_URL,
                                                 response_nonce=response.nonce)
        try:
            if response.type_url != RULES_TYPE_URL:
                raise RuleSetRejected(f"unexpected type {response.type_url}")
            await self.apply_async(response.version_info, response.resources)
        except RuleSetRejected as err:
            self.last_refused = response.version_info
            request.version_info = self.version
            request.error_detail.CopyFrom(status_pb2.Status(code=code_pb2.INVALID_ARGUMENT,
                                                            message=str(err)))
            return request
        request.version_info = self.version
        return request
