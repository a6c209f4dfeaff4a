"""Generate kafka_wire/enums.py: Kafka's API keys and error codes as IntEnums.

    .venv/bin/python tools/gen_protocol_enums.py            # rewrite kafka_wire/enums.py
    .venv/bin/python tools/gen_protocol_enums.py --check    # exit 1 if it is stale

API keys come from the message schemas keg ships (kafka_wire/schemas: every request
schema's `apiKey` and `name`, the newest name of a key winning). Error codes are not in
the message schemas: they come from Apache Kafka's own source, the enum
`org.apache.kafka.common.protocol.Errors` of the kafka-clients sources jar (code, name,
default message), an error being retriable when its exception class extends
`RetriableException` (as Kafka's protocol guide says). The jar is read from the local
Maven repository and fetched there with `mvn dependency:get` when missing; the generated
module is checked in, so neither keg nor its tests need the jar or the network
(tests/unit/kafka_wire/test_protocol_enums.py checks the module against both inputs).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUTPUT = ROOT / "kafka_wire" / "enums.py"
KAFKA_VERSION = "4.1.1"
ARTIFACT = f"org.apache.kafka:kafka-clients:{KAFKA_VERSION}:jar:sources"
SOURCES_JAR = (Path.home() / ".m2" / "repository" / "org" / "apache" / "kafka" / "kafka-clients"
               / KAFKA_VERSION / f"kafka-clients-{KAFKA_VERSION}-sources.jar")
ERRORS_JAVA = "org/apache/kafka/common/protocol/Errors.java"
RETRIABLE_BASE = "RetriableException"


@dataclass(frozen=True)
class ApiKeySpec:
    name: str  # UPPER_SNAKE, from the schema's CamelCase name
    key: int
    schema_name: str  # "Produce", as the schemas and rule files spell it


@dataclass(frozen=True)
class ErrorSpec:
    name: str
    code: int
    retriable: bool
    message: str | None


# --- API keys from the schema set ------------------------------------------------------

def upper_snake(camel: str) -> str:
    """ "DescribeTopicPartitions" -> "DESCRIBE_TOPIC_PARTITIONS", "ApiVersions" -> ..."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).upper()


def api_keys_from_schemas() -> list[ApiKeySpec]:
    from kafka_wire._catalog import api_name, known_api_keys

    specs = []
    for key in known_api_keys():
        name = api_name(key)
        assert name is not None
        specs.append(ApiKeySpec(upper_snake(name), key, name))
    return specs


# --- Errors from Kafka's Errors.java ---------------------------------------------------

# NAME(code, "message" + "more", Builder::new) or NAME(0, null, message -> null)
_JAVA_STRING = r'"(?:\\.|[^"\\])*"'
_ERROR_ENTRY = re.compile(
    r"^\s+([A-Z][A-Z0-9_]*)\(\s*(-?\d+)\s*,\s*"
    rf"(null|{_JAVA_STRING}(?:\s*\+\s*{_JAVA_STRING})*)\s*,\s*"
    r"(?:(\w+)::new|\w+\s*->\s*null)\s*\)\s*[,;]",
    re.MULTILINE,
)
_CLASS = re.compile(r"\bclass\s+(\w+)(?:<[^>]*>)?\s+extends\s+(\w+)")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'"}


def _java_string(concatenation: str) -> str | None:
    if concatenation == "null":
        return None
    parts = re.findall(_JAVA_STRING, concatenation)
    text = "".join(p[1:-1] for p in parts)
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def errors_from_sources(errors_java: str, class_sources: Iterable[str]) -> list[ErrorSpec]:
    """Kafka's errors from the text of Errors.java and of the exception classes."""
    parent: dict[str, str] = {}
    for text in class_sources:
        for child, base in _CLASS.findall(text):
            parent.setdefault(child, base)

    def retriable(exception: str | None) -> bool:
        seen = set()
        while exception is not None and exception not in seen:
            if exception == RETRIABLE_BASE:
                return True
            seen.add(exception)
            exception = parent.get(exception)
        return False

    body = errors_java[errors_java.index("public enum Errors"):]
    errors = [ErrorSpec(name, int(code), retriable(builder or None), _java_string(message))
              for name, code, message, builder in _ERROR_ENTRY.findall(body)]
    declared = len(re.findall(r"^\s+[A-Z][A-Z0-9_]*\(\s*-?\d", body, re.MULTILINE))
    if len(errors) != declared:
        raise SystemExit(f"Errors.java: read {len(errors)} of {declared} errors; "
                         "the generator's pattern needs updating")
    return errors


def fetch_sources_jar() -> Path:
    if not SOURCES_JAR.exists():
        subprocess.run(["mvn", "-q", "dependency:get", f"-Dartifact={ARTIFACT}",
                        "-Dtransitive=false"], check=True)
    return SOURCES_JAR


def errors_from_jar(jar: Path) -> list[ErrorSpec]:
    with zipfile.ZipFile(jar) as archive:
        errors_java = archive.read(ERRORS_JAVA).decode("utf-8")
        classes = [archive.read(n).decode("utf-8") for n in archive.namelist()
                   if n.startswith("org/apache/kafka/common/") and n.endswith(".java")]
    return errors_from_sources(errors_java, classes)


# --- The module --------------------------------------------------------------------------

HEADER = f'''"""Kafka's API keys and error codes. GENERATED: do not edit.

Written by tools/gen_protocol_enums.py (run it again after changing the schemas).

`ApiKey`: every API of the schema sets in kafka_wire/schemas, named after its schema
(`ApiKey.DESCRIBE_TOPIC_PARTITIONS` is "DescribeTopicPartitions", `schema_name`).
`ErrorCode`: every error of Apache Kafka {KAFKA_VERSION}'s `Errors.java`, with whether a
client retries it (`retriable`: its exception is a RetriableException) and Kafka's
default message (`message`, None for NONE).
"""

from __future__ import annotations

from enum import IntEnum
'''


def render(api_keys: Sequence[ApiKeySpec], errors: Sequence[ErrorSpec]) -> str:
    lines = [HEADER, "",
             "class ApiKey(IntEnum):",
             '    """A Kafka API key; `schema_name` is the schema\'s CamelCase name."""',
             "",
             "    schema_name: str",
             "",
             "    def __new__(cls, key: int, schema_name: str = \"\") -> ApiKey:",
             "        # (The default lets ApiKey(3) type-check; a lookup never calls this.)",
             "        member = int.__new__(cls, key)",
             "        member._value_ = key",
             "        member.schema_name = schema_name",
             "        return member",
             ""]
    lines += [f"    {a.name} = {a.key}, {_literal(a.schema_name)}" for a in api_keys]
    lines += ["", "",
              "class ErrorCode(IntEnum):",
              '    """A Kafka error code, with its retriability and default message."""',
              "",
              "    retriable: bool",
              "    message: str | None",
              "",
              "    def __new__(cls, code: int, retriable: bool = False,",
              "                message: str | None = None) -> ErrorCode:",
              "        member = int.__new__(cls, code)",
              "        member._value_ = code",
              "        member.retriable = retriable",
              "        member.message = message",
              "        return member",
              ""]
    for e in errors:
        lines.append(f"    {e.name} = (")
        lines.append(f"        {e.code}, {e.retriable},")
        if e.message is None:
            lines.append("        None,")
        else:
            chunks = [_literal(chunk) for chunk in _chunks(e.message, _MESSAGE_WIDTH)]
            chunks[-1] += ","
            lines += [f"        {chunk}" for chunk in chunks]
        lines.append("    )")
    return "\n".join(lines) + "\n"


_MESSAGE_WIDTH = 80


def _literal(text: str) -> str:
    """A double-quoted Python literal of `text` (JSON's escapes are Python's too)."""
    return json.dumps(text, ensure_ascii=False)


def _chunks(text: str, width: int) -> list[str]:
    """`text` cut after spaces into pieces of about `width` characters; joined, `text`."""
    pieces: list[str] = []
    while len(text) > width:
        cut = text.rfind(" ", 0, width) + 1 or width
        pieces.append(text[:cut])
        text = text[cut:]
    return [*pieces, text] if text or not pieces else pieces


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the module is stale")
    parser.add_argument("--jar", type=Path, help=f"the kafka-clients sources jar ({ARTIFACT})")
    args = parser.parse_args(argv)
    text = render(api_keys_from_schemas(), errors_from_jar(args.jar or fetch_sources_jar()))
    if args.check:
        if OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run tools/gen_protocol_enums.py")
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
