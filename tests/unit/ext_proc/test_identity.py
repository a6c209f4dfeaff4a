"""IdentityTracker: the principal read from SASL, only once the broker accepted it."""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kafka_wire
from ext_proc.identity import (
    ANONYMOUS,
    UNKNOWN,
    IdentityTracker,
    SaslParseError,
    jwt_claims,
    parse_oauthbearer,
    parse_plain,
    parse_scram_client_first,
    principal_for_envelope,
    unescape_saslname,
)
from kafka_wire import ApiKey
from kafka_wire.envelope import Principal, decode_principal, encode_principal

PASSWORD = "Tr0ub4dor&3-never-logged"
SASL_AUTHENTICATION_FAILED = 58


def handshake(t: IdentityTracker, mechanism: str, version: int = 1, error: int = 0) -> None:
    t.observe_request(ApiKey.SASL_HANDSHAKE, version, {"Mechanism": mechanism})
    t.observe_response(
        ApiKey.SASL_HANDSHAKE, version, {"ErrorCode": error, "Mechanisms": [mechanism]}
    )


def auth_request(t: IdentityTracker, data: bytes) -> None:
    t.observe_request(ApiKey.SASL_AUTHENTICATE, 2, {"AuthBytes": data})


def auth_response(
    t: IdentityTracker, error: int = 0, data: bytes = b"", lifetime: int = 0
) -> None:
    t.observe_response(ApiKey.SASL_AUTHENTICATE, 2, {
        "ErrorCode": error,
        "ErrorMessage": "Authentication failed" if error else None,
        "AuthBytes": data,
        "SessionLifetimeMs": lifetime,
    })


def plain_login(t: IdentityTracker, user: str, error: int = 0, authzid: str = "") -> None:
    handshake(t, "PLAIN")
    auth_request(t, f"{authzid}\0{user}\0{PASSWORD}".encode())
    auth_response(t, error)


def refused_after_malformed(mechanism: str, data: bytes) -> IdentityTracker:
    """Malformed first bytes of `mechanism`: a reason at once, still anonymous once refused."""
    t = IdentityTracker()
    handshake(t, mechanism)
    auth_request(t, data)
    assert t.reason is not None
    auth_response(t, SASL_AUTHENTICATION_FAILED)
    assert t.principal == ANONYMOUS
    return t


def scram_exchange(mechanism: str, client_first: bytes, nonce: str = "abcdef",
                   error: int = 0) -> IdentityTracker:
    """A whole SCRAM exchange: two client messages, the server's final one (or a refusal)."""
    t = IdentityTracker()
    handshake(t, mechanism)
    auth_request(t, client_first)
    auth_response(t, data=f"r={nonce},s=c2FsdA==,i=4096".encode())
    auth_request(t, f"c=biws,r={nonce},p=cHJvb2Y=".encode())
    auth_response(t, error, b"" if error else b"v=dmVyaWZpZXI=")
    return t


def jwt(claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part(header or {'alg': 'none'})}.{part(claims)}."


def oauth_bytes(token: str, authzid: str = "") -> bytes:
    gs2 = f"n,a={authzid}," if authzid else "n,,"
    return f"{gs2}\x01auth=Bearer {token}\x01\x01".encode()


def scram_escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def assert_no_secret(t: IdentityTracker, *secrets: str) -> None:
    """No secret in repr(t) nor in any attribute's value (as text or bytes)."""
    texts = [repr(t), *(repr(v) for v in vars(t).values())]
    for value in vars(t).values():
        if isinstance(value, bytes | bytearray):
            texts.append(bytes(value).decode("latin-1"))
    for secret in secrets:
        assert all(secret not in text for text in texts), secret


# -- the starting point --------------------------------------------------------------------


def test_a_new_connection_is_anonymous_plaintext() -> None:
    t = IdentityTracker()
    assert t.principal == ANONYMOUS and not t.authenticated
    assert t.mechanism is None and t.security_protocol == "PLAINTEXT"
    assert t.client_id is None and not t.principal_known


def test_client_id_is_the_last_non_null_one() -> None:
    t = IdentityTracker()
    t.observe_client_id("orders-service")
    t.observe_client_id(None)
    assert t.client_id == "orders-service"
    t.observe_client_id("other")
    assert t.client_id == "other"


def test_tls_told_by_the_caller() -> None:
    t = IdentityTracker(tls=True)
    assert t.security_protocol == "SSL"
    handshake(t, "PLAIN")
    assert t.security_protocol == "SASL_SSL"


# -- PLAIN ----------------------------------------------------------------------------------


def test_plain_principal_after_success() -> None:
    t = IdentityTracker()
    handshake(t, "PLAIN")
    assert t.security_protocol == "SASL_PLAINTEXT" and t.mechanism == "PLAIN"
    auth_request(t, f"\0alice\0{PASSWORD}".encode())
    assert t.principal == ANONYMOUS, "not before the broker answered"
    auth_response(t)
    assert t.principal == "User:alice" and t.authenticated and t.principal_known
    assert t.reason is None
    assert_no_secret(t, PASSWORD)


def test_plain_failed_authentication_stays_anonymous() -> None:
    t = IdentityTracker()
    plain_login(t, "alice", error=SASL_AUTHENTICATION_FAILED)
    assert t.principal == ANONYMOUS and not t.authenticated
    assert t.reason is not None and "58" in t.reason
    assert_no_secret(t, PASSWORD)


def test_plain_authzid() -> None:
    t = IdentityTracker()
    plain_login(t, "alice", authzid="alice")
    assert t.principal == "User:alice"
    assert parse_plain(b"bob\0bob\0pw") == "bob"
    with pytest.raises(SaslParseError):
        parse_plain(b"admin\0alice\0pw")


@pytest.mark.parametrize("data", [
    b"", b"alice", f"alice\0{PASSWORD}".encode(), f"\0\0{PASSWORD}".encode(),
    b"\0\xff\xfe\0" + PASSWORD.encode(), b"\xff\0alice\0" + PASSWORD.encode(),
])
def test_plain_malformed_is_anonymous_and_never_quotes_the_bytes(data: bytes) -> None:
    t = refused_after_malformed("PLAIN", data)
    assert_no_secret(t, PASSWORD)


def test_plain_password_is_not_decoded() -> None:
    # Invalid UTF-8 in the password does not matter: it is never read.
    assert parse_plain(b"\0alice\0\xff\xfe\xfd") == "alice"


# -- SCRAM ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_authenticated_only_by_the_server_final_message(mechanism: str) -> None:
    t = IdentityTracker()
    handshake(t, mechanism)
    auth_request(t, b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL")
    auth_response(t, data=b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096")
    assert not t.authenticated and t.principal == ANONYMOUS
    proof = "v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    auth_request(t, f"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p={proof}".encode())
    auth_response(t, data=b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=", lifetime=3_600_000)
    assert t.principal == "User:alice" and t.authenticated and t.mechanism == mechanism
    assert t.session_lifetime_ms == 3_600_000
    assert_no_secret(t, proof)


def test_scram_failure_on_the_final_step() -> None:
    t = scram_exchange("SCRAM-SHA-256", b"n,,n=alice,r=abc", error=SASL_AUTHENTICATION_FAILED)
    assert t.principal == ANONYMOUS and not t.authenticated


@pytest.mark.parametrize(("escaped", "name"), [
    ("alice", "alice"),
    ("a=2Cb", "a,b"),
    ("a=3Db", "a=b"),
    ("=3D=2C=3D", "=,="),
    ("CN=3Dsvc=2COU=3Dkafka", "CN=svc,OU=kafka"),
])
def test_scram_username_escapes(escaped: str, name: str) -> None:
    t = scram_exchange("SCRAM-SHA-512", f"n,,n={escaped},r=nonce".encode(), nonce="nonce123")
    assert t.principal == f"User:{name}"


def test_scram_authzid_and_reserved_and_extensions() -> None:
    assert parse_scram_client_first(b"n,a=alice,n=alice,r=x") == ("alice", False)
    assert parse_scram_client_first(b"n,,m=ext,n=bob,r=x") == ("bob", False)
    assert parse_scram_client_first(b"n,,n=tok1,r=x,tokenauth=true") == ("tok1", True)
    with pytest.raises(SaslParseError):
        parse_scram_client_first(b"n,a=admin,n=alice,r=x")


@pytest.mark.parametrize("data", [
    b"", b"n,,", b"n,,n=alice", b"x,,n=alice,r=abc", b"n,,r=abc,n=alice",
    b"n,,n=,r=abc", b"n,,n=a=2Xb,r=abc", b"n,,n=a=,r=abc", b"n,,n=alice,r=",
    b"n,b=alice,n=alice,r=abc", b"n,,n=\xff,r=abc", b"n,,n=alice,r=abc,=x",
])
def test_scram_malformed(data: bytes) -> None:
    with pytest.raises(SaslParseError):
        parse_scram_client_first(data)
    refused_after_malformed("SCRAM-SHA-256", data)


def test_scram_delegation_token_owner_is_unknown() -> None:
    t = scram_exchange("SCRAM-SHA-256", b"n,,n=tokenid42,r=abc,tokenauth=true")
    assert t.authenticated and t.opaque_token and t.principal == ANONYMOUS
    assert not t.principal_known and t.reason is not None


@given(st.text(min_size=1))
@settings(max_examples=200, deadline=None)
def test_scram_escape_round_trip(name: str) -> None:
    assert unescape_saslname(scram_escape(name)) == name
    data = f"n,,n={scram_escape(name)},r=nonce".encode()
    assert parse_scram_client_first(data) == (name, False)


# -- OAUTHBEARER ----------------------------------------------------------------------------


def test_oauthbearer_jwt_sub_after_success() -> None:
    token = jwt({"sub": "svc-orders", "exp": 2_000_000_000, "scope": "kafka"})
    t = IdentityTracker()
    handshake(t, "OAUTHBEARER")
    auth_request(t, oauth_bytes(token))
    assert t.principal == ANONYMOUS
    auth_response(t)
    assert t.principal == "User:svc-orders" and t.authenticated and not t.opaque_token
    assert_no_secret(t, token, token.split(".")[1])


def test_oauthbearer_signed_jwt_and_authzid() -> None:
    token = jwt({"sub": "alice"}, {"alg": "RS256", "kid": "k1"})[:-1] + ".c2lnbmF0dXJl"
    assert parse_oauthbearer(oauth_bytes(token)) == "alice"
    assert parse_oauthbearer(oauth_bytes(token, authzid="alice")) == "alice"
    with pytest.raises(SaslParseError):
        parse_oauthbearer(oauth_bytes(token, authzid="admin"))
    # scheme is case-insensitive, other key=value pairs are allowed
    data = f"n,,\x01host=kafka\x01auth=bearer {token}\x01\x01".encode()
    assert parse_oauthbearer(data) == "alice"


def test_oauthbearer_configured_claim() -> None:
    token = jwt({"sub": "0oa1b2c3", "client_id": "orders"})
    t = IdentityTracker(oauth_principal_claim="client_id")
    handshake(t, "OAUTHBEARER")
    auth_request(t, oauth_bytes(token))
    auth_response(t)
    assert t.principal == "User:orders"


def test_oauthbearer_opaque_token_is_anonymous_with_a_flag() -> None:
    t = IdentityTracker()
    handshake(t, "OAUTHBEARER")
    auth_request(t, oauth_bytes("2YotnFZFEjr1zCsicMWpAA"))
    auth_response(t)
    assert t.authenticated and t.opaque_token and t.principal == ANONYMOUS
    assert t.reason is not None and "JWT" in t.reason
    assert_no_secret(t, "2YotnFZFEjr1zCsicMWpAA")


def test_oauthbearer_rejected_token() -> None:
    t = IdentityTracker()
    handshake(t, "OAUTHBEARER")
    auth_request(t, oauth_bytes(jwt({"sub": "mallory"})))
    auth_response(t, data=b'{"status":"invalid_token"}')  # RFC 7628 error challenge
    assert not t.authenticated
    auth_request(t, b"\x01")
    auth_response(t, SASL_AUTHENTICATION_FAILED)
    assert t.principal == ANONYMOUS and not t.authenticated


@pytest.mark.parametrize("data", [
    b"", b"n,,", b"n,,\x01\x01", b"n,,\x01auth=Bearer\x01\x01", b"n,,\x01auth=Basic abc\x01\x01",
    b"n,,\x01auth=Bearer a.b.c", b"n,,\x01=x\x01auth=Bearer abc\x01\x01", b"q,,\x01\x01",
    oauth_bytes(jwt({"name": "no sub"})), oauth_bytes(jwt({"sub": 42})),
    b"n,,\x01auth=Bearer \xff\x01\x01",
])
def test_oauthbearer_malformed(data: bytes) -> None:
    refused_after_malformed("OAUTHBEARER", data)


def test_jwt_claims() -> None:
    assert jwt_claims(jwt({"sub": "a"})) == {"sub": "a"}
    assert jwt_claims("a.b.c.d.e") is None  # JWE
    assert jwt_claims("opaque") is None
    assert jwt_claims("!!.!!.") is None
    assert jwt_claims("e30.W10.") is None  # payload is a list
    assert jwt_claims("bm90IGpzb24.e30.") is None


# -- opaque mechanisms ----------------------------------------------------------------------


def test_gssapi_principal_is_unknown() -> None:
    t = IdentityTracker()
    handshake(t, "GSSAPI")
    auth_request(t, b"\x60\x82\x02\x6b\x06\x09opaque-kerberos")
    assert not t.authenticated and t.principal == ANONYMOUS
    for _ in range(3):
        auth_response(t, data=b"\x05\x04opaque")
        assert t.authenticated and t.principal == UNKNOWN and not t.principal_known
        auth_request(t, b"\x05\x04more-opaque")
    assert t.reason is not None and "GSSAPI" in t.reason


def test_gssapi_failure_at_a_later_step() -> None:
    t = IdentityTracker()
    handshake(t, "GSSAPI")
    auth_request(t, b"\x60opaque")
    auth_response(t, data=b"\x05\x04opaque")
    auth_request(t, b"\x05\x04more")
    auth_response(t, SASL_AUTHENTICATION_FAILED)
    assert not t.authenticated and t.principal == ANONYMOUS


# -- protocol edges -------------------------------------------------------------------------


def test_handshake_rejected() -> None:
    t = IdentityTracker()
    handshake(t, "SCRAM-SHA-1", error=33)
    assert t.reason is not None and "33" in t.reason
    auth_request(t, b"n,,n=alice,r=abc")
    auth_response(t)
    assert t.principal == ANONYMOUS and not t.authenticated


def test_handshake_v0_raw_tokens() -> None:
    t = IdentityTracker()
    handshake(t, "PLAIN", version=0)
    assert t.reason is not None and "v0" in t.reason
    assert t.security_protocol == "SASL_PLAINTEXT" and t.principal == ANONYMOUS


def test_authenticate_without_handshake_is_ignored() -> None:
    t = IdentityTracker()
    auth_request(t, b"\0alice\0pw")
    auth_response(t)
    assert t.principal == ANONYMOUS and not t.authenticated and t.reason is not None


def test_response_without_a_seen_request() -> None:
    t = IdentityTracker()
    handshake(t, "PLAIN")
    auth_response(t)  # the request did not decode, say
    assert t.authenticated and t.principal == ANONYMOUS
    assert t.reason is not None and "not read" in t.reason


def test_reauthentication_keeps_the_principal_until_it_ends() -> None:
    t = IdentityTracker()
    plain_login(t, "alice")
    handshake(t, "PLAIN")
    auth_request(t, f"\0alice\0{PASSWORD}".encode())
    assert t.principal == "User:alice", "still authenticated while re-authenticating"
    auth_response(t, lifetime=60_000)
    assert t.principal == "User:alice" and t.session_lifetime_ms == 60_000
    plain_login(t, "alice", error=SASL_AUTHENTICATION_FAILED)
    assert t.principal == ANONYMOUS and not t.authenticated


@pytest.mark.parametrize("body", [
    {}, {"AuthBytes": None}, {"AuthBytes": "text"}, {"AuthBytes": 7}, {"Mechanism": None},
])
def test_odd_bodies_never_raise(body: dict[str, Any]) -> None:
    t = IdentityTracker()
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "OAUTHBEARER", "GSSAPI"):
        handshake(t, mechanism)
        t.observe_request(ApiKey.SASL_HANDSHAKE, 1, body)
        t.observe_request(ApiKey.SASL_AUTHENTICATE, 2, body)
        t.observe_response(ApiKey.SASL_AUTHENTICATE, 2, body)
        t.observe_response(ApiKey.SASL_HANDSHAKE, 1, body)
    assert t.principal.startswith("User:")


def test_oversized_auth_bytes_are_not_parsed() -> None:
    t = IdentityTracker()
    handshake(t, "PLAIN")
    auth_request(t, b"\0alice\0" + b"x" * (1024 * 1024))
    auth_response(t, SASL_AUTHENTICATION_FAILED)
    assert t.principal == ANONYMOUS and t.reason is not None


def test_bodies_decoded_by_kafka_wire() -> None:
    """The field names the tracker reads are the codec's."""
    t = IdentityTracker()
    frames: list[tuple[int, int, dict[str, Any]]] = [
        (ApiKey.SASL_HANDSHAKE, 1, {"Mechanism": "PLAIN"}),
        (ApiKey.SASL_AUTHENTICATE, 2, {"AuthBytes": f"\0carol\0{PASSWORD}".encode()}),
    ]
    for api_key, version, body in frames:
        header = kafka_wire.RequestHeader(api_key, version, 1, "cli", {})
        decoded_header, decoded = kafka_wire.decode_request(
            kafka_wire.encode_request(header, body)[4:]
        )
        t.observe_client_id(decoded_header.client_id)
        t.observe_request(api_key, version, decoded)
    response = {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"", "SessionLifetimeMs": 0}
    encoded = kafka_wire.encode_response(1, ApiKey.SASL_AUTHENTICATE, 2, response)
    _, decoded_response = kafka_wire.decode_response(encoded[4:], ApiKey.SASL_AUTHENTICATE, 2)
    t.observe_response(ApiKey.SASL_AUTHENTICATE, 2, decoded_response)
    assert t.principal == "User:carol" and t.client_id == "cli"
    assert_no_secret(t, PASSWORD)


# -- hypothesis: random bytes never raise ---------------------------------------------------

MECHANISMS = st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI",
                              "x-custom", ""])


@given(MECHANISMS, st.lists(st.binary(max_size=200), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(-1, 100), st.binary(max_size=40)), max_size=4))
@settings(max_examples=400, deadline=None, derandomize=True)
def test_random_sasl_bytes_never_raise(
    mechanism: str, requests: list[bytes], responses: list[tuple[int, bytes]]
) -> None:
    t = IdentityTracker()
    handshake(t, mechanism)
    for data in requests:
        auth_request(t, data)
    for error, data in responses:
        auth_response(t, error, data)
    t.observe_request(ApiKey.PRODUCE, 9, {})
    assert t.principal.startswith("User:")
    if not t.authenticated:
        assert t.principal == ANONYMOUS


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_parsers_raise_only_sasl_parse_errors(data: bytes) -> None:
    for parse in (parse_plain, parse_scram_client_first, parse_oauthbearer):
        try:
            parse(data)
        except SaslParseError as err:
            assert "\\x" not in str(err)


@given(st.text(max_size=60).filter(lambda s: "\x01" not in s))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_random_oauth_tokens_never_raise(token: str) -> None:
    with contextlib.suppress(SaslParseError):
        parse_oauthbearer(oauth_bytes(token))


# -- envelopes ------------------------------------------------------------------------------


def test_envelope_principal_is_the_inner_one() -> None:
    inner = Principal("User", "alice", token_authenticated=True)
    assert principal_for_envelope(decode_principal(encode_principal(inner))) == "User:alice"
    assert principal_for_envelope(Principal("Group", "ops")) == "Group:ops"
    assert principal_for_envelope(Principal("", "bob")) == "User:bob"
    assert principal_for_envelope(None) == UNKNOWN
