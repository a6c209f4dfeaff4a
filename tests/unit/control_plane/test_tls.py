"""TLS at the gateway: Kafka's principal mapping rules, the TLS files as Envoy secrets,
listeners and clusters naming them, and the connection facts the data path gets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from envoy.extensions.filters.network.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2

from control_plane.envoy_resources import BrokerRoute, GatewayPlan, compile_snapshot
from control_plane.snapshot import CLUSTER, LISTENER, SECRET
from control_plane.tls import (
    LISTENER_CERT,
    LISTENER_CLIENT_CA,
    UPSTREAM_CA,
    UPSTREAM_CERT,
    ListenerTls,
    TlsConfigError,
    TlsMaterial,
    UpstreamTls,
)
from ext_proc.connection import ConnectionInfo
from ext_proc.identity import IdentityTracker
from ext_proc.tls_principal import (
    MappingRuleError,
    NoMatchingRule,
    certificate_principal,
    parse_mapping_rules,
)
from kafka_wire import ApiKey
from keg.embedded.certs import DevCa

# Kafka's own examples (SslPrincipalMapperTest, KIP-371).
KAFKA_RULES = ("RULE:^CN=([a-zA-Z0-9.]*),OU=ServiceUsers.*$/$1/L, "
               "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/U, "
               "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L, DEFAULT")


@pytest.mark.parametrize(("name", "expected"), [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    ("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Santa Clara,ST=CA,C=US", "DUKE@JAVASOFT"),
    ("CN=Duke,OU=JavaSoft,O=Sun Microsystems", "duke"),
    ("OU=JavaSoft,O=Sun Microsystems", "OU=JavaSoft,O=Sun Microsystems"),  # DEFAULT
])
def test_kafka_mapping_rules_map_as_kafka_does(name: str, expected: str) -> None:
    assert parse_mapping_rules(KAFKA_RULES).name(name) == expected


def test_rules_split_on_commas_outside_patterns_and_default_without_rules() -> None:
    mapper = parse_mapping_rules("RULE:^CN=([^,]*),O=(.*)$/$2-$1/, RULE:^x$/y/")
    assert len(mapper.rules) == 2
    assert mapper.principal("CN=alice,O=keg") == "User:keg-alice"
    assert parse_mapping_rules(None).name("CN=a,O=b") == "CN=a,O=b"
    assert parse_mapping_rules("  ").name("CN=a") == "CN=a"


def test_no_matching_rule_refuses_like_kafka() -> None:
    with pytest.raises(NoMatchingRule, match=r"no ssl\.principal\.mapping\.rules rule applies"):
        parse_mapping_rules("RULE:^CN=(.*),OU=svc$/$1/").name("CN=bob,OU=people")


def test_a_group_the_pattern_lacks_stays_literal_and_escapes_are_literal() -> None:
    mapper = parse_mapping_rules(r"RULE:^CN=(.*)$/$1-$2-\$1/")
    assert mapper.name("CN=alice") == "alice-$2-$1"


@pytest.mark.parametrize("text", ["RULE:x/y/Z", "FOO", "RULE:(/x/", "RULE:a/b/L extra",
                                  r"RULE:(a)\1/x/"])
def test_bad_rules_are_refused_with_the_rule(text: str) -> None:
    with pytest.raises(MappingRuleError, match=r"ssl\.principal\.mapping\.rules"):
        parse_mapping_rules(text)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> DevCa:
    return DevCa(tmp_path_factory.mktemp("ca"))


def test_secrets_hold_the_files_and_listeners_and_clusters_name_them(ca: DevCa) -> None:
    server = ca.server("gateway")
    client = ca.client("keg-client", "keg")
    tls = TlsMaterial(ListenerTls(server.cert, server.key, ca.cert_file, "RULE:^CN=(.*?),.*$/$1/"),
                      UpstreamTls(ca.cert_file, client.cert, client.key))
    assert set(tls.secrets) == {LISTENER_CERT, LISTENER_CLIENT_CA, UPSTREAM_CA, UPSTREAM_CERT}
    cert = tls.secrets[LISTENER_CERT].tls_certificate
    assert cert.certificate_chain.inline_bytes == server.cert.read_bytes()
    assert cert.private_key.inline_bytes == server.key.read_bytes()
    plan = GatewayPlan(routes=(BrokerRoute(1, "kafka-1.example", 9093, 19092),
                               BrokerRoute(2, "10.0.0.2", 9093, 19093)),
                       listen_host="0.0.0.0", advertised_host="gw.example",
                       ext_proc_host="127.0.0.1", ext_proc_port=50051)
    snapshot = compile_snapshot(plan, tls=tls)
    assert set(snapshot.resources[SECRET]) == set(tls.secrets)
    chain = snapshot.resources[LISTENER]["kafka_broker_1"].filter_chains[0]
    downstream = tls_pb2.DownstreamTlsContext()
    chain.transport_socket.typed_config.Unpack(downstream)
    assert downstream.require_client_certificate.value
    assert [s.name for s in downstream.common_tls_context.tls_certificate_sds_secret_configs] \
        == [LISTENER_CERT]
    assert downstream.common_tls_context.validation_context_sds_secret_config.name \
        == LISTENER_CLIENT_CA
    # The data path learns the client certificate's names and the mapping rules.
    ext_proc = ext_proc_pb2.NetworkExternalProcessor()
    chain.filters[0].typed_config.Unpack(ext_proc)
    metadata = {h.key: h.value for h in ext_proc.grpc_service.initial_metadata}
    assert metadata["x-keg-peer-subject"] == "%DOWNSTREAM_PEER_SUBJECT%"
    info = ConnectionInfo.from_metadata([*metadata.items()])
    assert info.tls and info.principal_rules == "RULE:^CN=(.*?),.*$/$1/"
    # Brokers: SNI and the verified name are the host each advertises; IPs get no SNI.
    for name, san_type, sni in (("kafka_broker_1", common_pb2.SubjectAltNameMatcher.DNS,
                                 "kafka-1.example"),
                                ("kafka_broker_2", common_pb2.SubjectAltNameMatcher.IP_ADDRESS,
                                 "")):
        upstream = tls_pb2.UpstreamTlsContext()
        snapshot.resources[CLUSTER][name].transport_socket.typed_config.Unpack(upstream)
        assert upstream.sni == sni
        combined = upstream.common_tls_context.combined_validation_context
        matcher = combined.default_validation_context.match_typed_subject_alt_names[0]
        assert matcher.san_type == san_type
        assert combined.validation_context_sds_secret_config.name == UPSTREAM_CA
        assert [s.name for s in upstream.common_tls_context.tls_certificate_sds_secret_configs] \
            == [UPSTREAM_CERT]
    # The ext_proc cluster stays plaintext (loopback, inside the gateway).
    assert not snapshot.resources[CLUSTER]["keg_ext_proc"].HasField("transport_socket")


def test_hostname_verification_can_be_turned_off_only_explicitly(ca: DevCa) -> None:
    tls = TlsMaterial(upstream=UpstreamTls(ca.cert_file, verify_hostname=False))
    context = tls.upstream_context("kafka-1")
    assert context is not None
    validation = context.common_tls_context.combined_validation_context
    assert not validation.default_validation_context.match_typed_subject_alt_names


def test_bad_files_are_named_never_quoted(ca: DevCa, tmp_path: Path) -> None:
    server, other = ca.server("a"), ca.server("b")
    with pytest.raises(TlsConfigError, match="does not belong to the certificate"):
        TlsMaterial(ListenerTls(server.cert, other.key))
    garbage = tmp_path / "key.pem"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nc2VjcmV0LXZhbHVl\n-----END PRIVATE KEY-----\n")
    with pytest.raises(TlsConfigError) as err:
        TlsMaterial(ListenerTls(server.cert, garbage))
    assert "c2VjcmV0" not in str(err.value) and str(garbage) in str(err.value)
    with pytest.raises(TlsConfigError, match="no PEM certificate"):
        TlsMaterial(ListenerTls(garbage, server.key))
    with pytest.raises(TlsConfigError, match="both a certificate and a key"):
        UpstreamTls(ca.cert_file, cert_file=server.cert)


def test_rotation_keeps_the_last_good_files_until_both_halves_match(ca: DevCa,
                                                                     tmp_path: Path) -> None:
    first, second = ca.server("first"), ca.server("second")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    tls = TlsMaterial(ListenerTls(cert, key))
    before = tls.secrets[LISTENER_CERT]
    assert not tls.reload()
    shutil.copy(second.cert, cert)  # the key is not there yet: keep serving the first pair
    assert not tls.reload() and tls.secrets[LISTENER_CERT] is before
    shutil.copy(second.key, key)
    assert tls.reload()
    assert tls.secrets[LISTENER_CERT].tls_certificate.certificate_chain.inline_bytes \
        == second.cert.read_bytes()


def test_certificate_principal_from_subject_or_uri_san() -> None:
    conn = ConnectionInfo(tls=True, peer_subject="CN=alice,OU=eng,O=keg",
                          peer_uri_san="spiffe://keg/ns/eng/sa/alice",
                          principal_rules="RULE:^CN=(.*?),.*$/$1/")
    assert certificate_principal(conn) == "User:alice"
    spiffe = ConnectionInfo(tls=True, peer_subject="CN=alice,O=keg",
                            peer_uri_san="spiffe://keg/ns/eng/sa/alice",
                            # A '/' inside a pattern is escaped, as in Kafka.
                            principal_rules=r"RULE:^spiffe:\/\/keg\/ns\/(.*)\/sa\/(.*)$/$2.$1/",
                            principal_from="uri_san")
    assert certificate_principal(spiffe) == "User:alice.eng"
    assert certificate_principal(ConnectionInfo(tls=True)) is None
    metadata = [("x-keg-tls", "1"), ("x-keg-peer-subject", "-"), ("x-keg-peer-uri-san", "")]
    assert certificate_principal(ConnectionInfo.from_metadata(metadata)) is None


def test_the_certificate_principal_holds_until_sasl_names_another() -> None:
    identity = IdentityTracker(tls=True, certificate_principal="User:alice")
    assert identity.principal == "User:alice" and identity.principal_known
    assert identity.security_protocol == "SSL"
    identity.observe_request(ApiKey.SASL_HANDSHAKE, 1, {"Mechanism": "PLAIN"})
    identity.observe_request(ApiKey.SASL_AUTHENTICATE, 1, {"AuthBytes": b"\0bob\0pw"})
    identity.observe_response(ApiKey.SASL_AUTHENTICATE, 1, {"ErrorCode": 0})
    assert identity.principal == "User:bob" and identity.security_protocol == "SASL_SSL"
