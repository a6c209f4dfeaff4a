"""The principal of a TLS client certificate: Kafka's `ssl.principal.mapping.rules`.

A broker with an SSL listener names a client by its certificate's subject, in RFC 2253
form (``CN=alice,OU=eng,O=example``), mapped through `ssl.principal.mapping.rules`
(KIP-371, `org.apache.kafka.common.security.ssl.SslPrincipalMapper`). keg's gateway
terminates TLS in Envoy, which hands the same RFC 2253 subject to the data path
(`%DOWNSTREAM_PEER_SUBJECT%`); this module maps it the way the broker would:

    RULE:^CN=([a-zA-Z0-9.]*),OU=ServiceUsers.*$/$1/L, RULE:^CN=(.*?),.*$/$1/, DEFAULT

Rules are tried in order; the first whose pattern matches the *whole* name gives
`replacement` with `$1`.. filled from the pattern's groups, optionally lower- (`/L`)
or upper-cased (`/U`); `DEFAULT` gives the name unchanged. No rule matching is an
error, as in Kafka (the broker refuses such a client). Patterns are RE2 (linear time:
the names come from clients), which accepts Kafka's usual patterns; a backreference
inside a pattern is refused.

keg can also take the name from the certificate's first URI SAN (a SPIFFE id,
``spiffe://example.org/ns/team/sa/alice``) instead of its subject: the same rules then
apply to that URI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from ext_proc.connection import ConnectionInfo
from filter_rules.patterns import PatternError, compile_re2

DEFAULT_RULES: Final = "DEFAULT"
SUBJECT: Final = "subject"
URI_SAN: Final = "uri_san"
PRINCIPAL_SOURCES: Final = (SUBJECT, URI_SAN)

# Kafka's own grammar (SslPrincipalMapper): a rule is DEFAULT, or RULE:pattern/repl/[LU]
# where a backslash escapes the next character; rules are separated by commas.
_RULE: Final = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)(.*?)|(.*?)"
_SPLITTER: Final = re.compile(r"\s*(" + _RULE + r")\s*(?:,\s*|$)")
_PARSER: Final = re.compile(_RULE)
_BACK_REFERENCE: Final = re.compile(r"\$(\d+)|\\(.)")


class MappingRuleError(ValueError):
    """A mapping rule that does not parse; the message names the rule."""


class NoMatchingRule(ValueError):  # Kafka's own name for it
    """No rule applies to the name: the client is refused, as a broker would."""


@dataclass(frozen=True)
class _Rule:
    text: str
    pattern: Any = None  # None: DEFAULT
    replacement: str = ""
    lower: bool = False
    upper: bool = False

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        result = _substitute(self.replacement, match)
        if self.lower:
            return result.lower()
        if self.upper:
            return result.upper()
        return result


def _substitute(replacement: str, match: Any) -> str:
    """Java's Matcher.replaceAll replacement on a whole-string match: `$n` is group n
    (a group the pattern does not have stays literal, as Kafka escapes it), `\\x` is x."""
    groups = match.re.groups

    def one(m: re.Match[str]) -> str:
        if m.group(2) is not None:
            return m.group(2)
        number = int(m.group(1))
        if number > groups:
            return m.group(0)
        return match.group(number) or ""

    return _BACK_REFERENCE.sub(one, replacement)


@dataclass(frozen=True)
class PrincipalMapper:
    """Kafka's SslPrincipalMapper for one rule text."""

    rules_text: str
    rules: tuple[_Rule, ...]

    def name(self, distinguished_name: str) -> str:
        """The mapped name (without the ``User:`` prefix); NoMatchingRule if none applies."""
        for rule in self.rules:
            result = rule.apply(distinguished_name)
            if result is not None:
                return result
        raise NoMatchingRule(f"no ssl.principal.mapping.rules rule applies to the "
                             f"certificate name {distinguished_name!r}")

    def principal(self, distinguished_name: str) -> str:
        return f"User:{self.name(distinguished_name)}"


@lru_cache(maxsize=32)
def parse_mapping_rules(text: str | None) -> PrincipalMapper:
    """Parse Kafka's rule syntax (None or blank: DEFAULT); MappingRuleError if invalid.

    Cached: every connection of a listener repeats the same text."""
    source = DEFAULT_RULES if text is None or not text.strip() else text.strip()
    rules: list[_Rule] = []
    for piece in (m.group(1) for m in _SPLITTER.finditer(source)):
        if not piece:
            continue
        match = _PARSER.match(piece)
        if match is None or match.end() != len(piece) or match.group(6):
            raise MappingRuleError(f"invalid ssl.principal.mapping.rules rule {piece!r}: "
                                   "expected DEFAULT or RULE:pattern/replacement/[LU]")
        if match.group(1):
            rules.append(_Rule(piece))
            continue
        if match.group(5):
            raise MappingRuleError(f"invalid ssl.principal.mapping.rules rule {piece!r}: "
                                   f"unexpected {match.group(5)!r} after the flags")
        try:
            pattern = compile_re2(match.group(2))
        except PatternError as err:
            raise MappingRuleError(f"invalid pattern in ssl.principal.mapping.rules rule "
                                   f"{piece!r}: {err}") from None
        rules.append(_Rule(piece, pattern, match.group(3), match.group(4) == "L",
                           match.group(4) == "U"))
    if not rules:
        raise MappingRuleError("ssl.principal.mapping.rules holds no rule")
    return PrincipalMapper(source, tuple(rules))


def certificate_name(subject: str | None, uri_sans: str | None, source: str) -> str | None:
    """The name the rules apply to: the subject, or the first URI SAN; None if absent.

    Envoy gives the URI SANs comma-separated (%DOWNSTREAM_PEER_URI_SAN%)."""
    if source == URI_SAN:
        first = (uri_sans or "").split(",", 1)[0].strip()
        return first or None
    return subject or None


def certificate_principal(conn: ConnectionInfo) -> str | None:
    """The principal a mutual-TLS connection's client certificate names (``User:...``),
    None without a certificate. NoMatchingRule when no mapping rule applies (the
    connection must then be refused, as a broker refuses it); MappingRuleError when
    the rules Envoy passed do not parse."""
    name = certificate_name(conn.peer_subject, conn.peer_uri_san, conn.principal_from)
    if name is None:
        return None
    return parse_mapping_rules(conn.principal_rules).principal(name)


__all__ = [
    "DEFAULT_RULES",
    "PRINCIPAL_SOURCES",
    "SUBJECT",
    "URI_SAN",
    "MappingRuleError",
    "NoMatchingRule",
    "PrincipalMapper",
    "certificate_name",
    "certificate_principal",
    "parse_mapping_rules",
]
