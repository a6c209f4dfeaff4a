"""A real schema registry with a Confluent-compatible API: Apicurio Registry, in memory.

Apicurio Registry 2.6 (Apache-2.0) ships on Maven Central as a runnable Quarkus
application for Java 17 (`io.apicurio:apicurio-registry-app:<version>:all@tar.gz`),
fetched once into keg's cache by `keg setup --test-services` (registry-pom.xml next to
this module)::

    <cache>/apicurio-registry-<version>/apicurio-registry-app-<version>-runner.jar

It keeps its schemas in memory (a fresh registry per start) and serves Confluent's API
under `/apis/ccompat/v7` (`ccompat_url`): what the `schema` rule's tests and a local
gateway talk to. With `tls=(certificate, key)` (PEM files) it also serves HTTPS on
`https_port`. Confluent's own registry is not on Maven Central, and Karapace not on PyPI.

    with EmbeddedRegistry() as registry:
        registry.ccompat_url      # http://127.0.0.1:<port>/apis/ccompat/v7
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Self

from keg.children import JAVA, child_environment
from keg.embedded._child import Child, ChildFailed, ChildService
from keg.embedded.kafka import (
    EmbeddedKafkaError,
    _free_ports,
    cache_dir,
    ensure_maven_dir,
    java_executable,
    maven_dir_ready,
)

log = logging.getLogger(__name__)

POM_PATH = Path(__file__).resolve().parent / "registry-pom.xml"
CCOMPAT_PATH = "/apis/ccompat/v7"


@cache
def registry_version() -> str:
    root = ET.parse(POM_PATH).getroot()
    node = root.find("m:properties/m:apicurio.version",
                     {"m": "http://maven.apache.org/POM/4.0.0"})
    if node is None or not (node.text or "").strip():
        raise EmbeddedKafkaError(f"{POM_PATH}: no <apicurio.version> property")
    return (node.text or "").strip()


def registry_home() -> Path:
    return cache_dir() / f"apicurio-registry-{registry_version()}"


def registry_ready() -> bool:
    """Whether the registry is in the cache already (no Maven needed)."""
    return maven_dir_ready(registry_home(), POM_PATH)


def ensure_registry(progress: Callable[[str], None] | None = None) -> Path:
    """The runnable jar, fetched with Maven first when the cache lacks it."""
    home = ensure_maven_dir(POM_PATH, registry_home(), ["dependency:unpack-dependencies"],
                            f"Apicurio Registry {registry_version()}", progress)
    jar = home / f"apicurio-registry-app-{registry_version()}-runner.jar"
    if not jar.exists():
        raise EmbeddedKafkaError(f"{jar} is missing from the unpacked registry")
    return jar


class EmbeddedRegistry(ChildService):
    """Apicurio Registry in a child JVM, on loopback: `port` (0: a free one) and, with
    `tls`, a free port for HTTPS."""

    def __init__(self, *, port: int = 0, tls: tuple[Path, Path] | None = None,
                 heap: str = "384m", start_timeout: float = 180.0,
                 log_dir: Path | None = None) -> None:
        self._requested_port = port
        self._tls = tls
        self._heap = heap
        self._start_timeout = start_timeout
        self._log_dir = log_dir
        self.https_port = 0

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API's base URL."""
        return self.url + CCOMPAT_PATH

    @property
    def https_ccompat_url(self) -> str:
        if not self._tls:
            raise EmbeddedKafkaError("the registry was started without tls")
        return f"https://localhost:{self.https_port}{CCOMPAT_PATH}"

    def start(self) -> Self:
        if self._child is not None and self._child.running:
            return self
        jar = ensure_registry()
        free = _free_ports(2, {self._requested_port})
        self.port = self._requested_port or free[0]
        self.https_port = free[1]
        props = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.log.level": "WARN",
            "quarkus.log.category.\"io.apicurio\".level": "WARN",
        }
        if self._tls is not None:
            certificate, key = self._tls
            props.update({"quarkus.http.ssl-port": str(self.https_port),
                          "quarkus.http.ssl.certificate.files": str(certificate),
                          "quarkus.http.ssl.certificate.key-files": str(key)})
        log_dir = self._log_dir or self._scratch_dir("keg-registry-")
        self._child = Child("Apicurio Registry", log_dir / "registry.log")
        cmd = [java_executable(), f"-Xmx{self._heap}", "-XX:+UseSerialGC",
               *(f"-D{k}={v}" for k, v in props.items()), "-jar", str(jar)]
        try:
            self._child.start(cmd, child_environment(JAVA), self._answers,
                              self._start_timeout, cwd=log_dir)
        except ChildFailed as err:
            raise EmbeddedKafkaError(str(err)) from None
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.ccompat_url + "/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False
