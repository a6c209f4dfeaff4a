//! Every response field that carries a broker address, through a session.

mod common;

use bytes::Bytes;
use common::*;
use kafka_protocol::messages::{describe_cluster_response as dc, describe_configs_response as cfg,
    describe_quorum_response as dq, fetch_response as fr, find_coordinator_response as fc,
    produce_response as pr, share_fetch_response as sf, ApiKey, BrokerId};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use keg_kafka_filter::core::rewrite::Endpoint;
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::{Output, Session, SessionLimits};

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// Sends a request of (key, version) and then `response`; returns what the client gets.
fn through(key: ApiKey, version: i16, response: &[u8]) -> (Vec<u8>, Session) {
    let mut session = Session::new(SessionLimits::default());
    let mut out = Output::default();
    let body: &[u8] = if key == ApiKey::Produce { &[0xff, 0xff, 0, 1] } else { &[] };
    let mut frame = request(key as i16, version, 42, body);
    if key == ApiKey::Produce && version >= 9 {
        // header v2 + compact transactional id
        frame = sized(&[&(key as i16).to_be_bytes()[..], &version.to_be_bytes(), &42i32.to_be_bytes(),
                        &[0, 1, b't', 0, 0], &1i16.to_be_bytes()].concat());
    }
    session.feed_requests(&frame, &mut out).unwrap();
    let routes = routes();
    let mut out = Output::default();
    session.feed_responses(response, view(&routes), &mut out).unwrap();
    (bytes_of(response, &out), session)
}

fn endpoint(node: i32, host: &str, port: i32) -> (i32, String, i32) {
    (node, host.to_string(), port)
}

#[test]
fn find_coordinator_single_and_batched() {
    for version in 0..=3 {
        let message = fc::FindCoordinatorResponse::default()
            .with_node_id(BrokerId(2)).with_host(s("kafka-2")).with_port(9092);
        let (out, _) = through(ApiKey::FindCoordinator, version, &encode_response(ApiKey::FindCoordinator, version, 42, &message));
        let (_, got): (i32, fc::FindCoordinatorResponse) = decode_response(ApiKey::FindCoordinator, version, &out);
        assert_eq!((got.host.as_str(), got.port), (GATEWAY_HOST, 19093), "v{version}");
    }
    for version in 4..=6 {
        let message = fc::FindCoordinatorResponse::default().with_coordinators(vec![
            fc::Coordinator::default().with_key(s("g")).with_node_id(BrokerId(1)).with_host(s("kafka-1")).with_port(9092),
            fc::Coordinator::default().with_key(s("h")).with_node_id(BrokerId(-1)).with_error_code(15),
        ]);
        let (out, _) = through(ApiKey::FindCoordinator, version, &encode_response(ApiKey::FindCoordinator, version, 42, &message));
        let (_, got): (i32, fc::FindCoordinatorResponse) = decode_response(ApiKey::FindCoordinator, version, &out);
        assert_eq!(endpoint(got.coordinators[0].node_id.0, &got.coordinators[0].host, got.coordinators[0].port),
                   endpoint(1, GATEWAY_HOST, 19092));
        assert_eq!(got.coordinators[1].host.as_str(), "", "an error entry carries no address");
    }
}

#[test]
fn describe_cluster_brokers() {
    for version in 0..=2 {
        let message = dc::DescribeClusterResponse::default().with_brokers(vec![
            dc::DescribeClusterBroker::default().with_broker_id(BrokerId(3)).with_host(s("kafka-3")).with_port(9092)]);
        let (out, _) = through(ApiKey::DescribeCluster, version, &encode_response(ApiKey::DescribeCluster, version, 42, &message));
        let (_, got): (i32, dc::DescribeClusterResponse) = decode_response(ApiKey::DescribeCluster, version, &out);
        assert_eq!((got.brokers[0].host.as_str(), got.brokers[0].port), (GATEWAY_HOST, 19094));
    }
}

#[test]
fn unknown_brokers_go_to_the_clients_own_listener() {
    let message = dc::DescribeClusterResponse::default().with_brokers(vec![
        dc::DescribeClusterBroker::default().with_broker_id(BrokerId(9)).with_host(s("kafka-9")).with_port(9092)]);
    let frame = encode_response(ApiKey::DescribeCluster, 1, 42, &message);
    let mut session = Session::new(SessionLimits::default());
    let mut out = Output::default();
    session.feed_requests(&request(60, 1, 42, &[]), &mut out).unwrap();
    let routes = routes();
    let own = Endpoint { host: "own".into(), port: 1 };
    let mut out = Output::default();
    session.feed_responses(&frame, keg_kafka_filter::core::rewrite::RouteView { routes: &routes, own_listener: Some(&own) }, &mut out).unwrap();
    let (_, got): (i32, dc::DescribeClusterResponse) = decode_response(ApiKey::DescribeCluster, 1, &bytes_of(&frame, &out));
    assert_eq!((got.brokers[0].host.as_str(), got.brokers[0].port), ("own", 1));
    assert_eq!(session.stats.get(Counter::UnknownBrokers), 1);
}

fn fetch_response(version: i16, endpoints: bool) -> fr::FetchResponse {
    let partition = fr::PartitionData::default().with_partition_index(0).with_high_watermark(10)
        .with_records(Some(Bytes::from(vec![7u8; 3000])))
        .with_aborted_transactions(Some(vec![fr::AbortedTransaction::default().with_producer_id(kafka_protocol::messages::ProducerId(5))]));
    let topic = fr::FetchableTopicResponse::default().with_partitions(vec![partition.clone(), partition.with_partition_index(1)]);
    let mut message = fr::FetchResponse::default().with_responses(vec![topic]);
    if endpoints && version >= 16 {
        message.node_endpoints = vec![fr::NodeEndpoint::default().with_node_id(BrokerId(2)).with_host(s("kafka-2")).with_port(9092)];
    }
    message
}

#[test]
fn fetch_node_endpoints_rewritten_and_plain_fetches_untouched() {
    for version in 16..=18 {
        let plain = encode_response(ApiKey::Fetch, version, 42, &fetch_response(version, false));
        let (out, session) = through(ApiKey::Fetch, version, &plain);
        assert_eq!(out, plain, "v{version}: no NodeEndpoints, the bytes that arrived");
        assert_eq!(session.stats.get(Counter::ResponsesUntouched), 1);
        let hinted = encode_response(ApiKey::Fetch, version, 42, &fetch_response(version, true));
        let (out, _) = through(ApiKey::Fetch, version, &hinted);
        let (_, got): (i32, fr::FetchResponse) = decode_response(ApiKey::Fetch, version, &out);
        assert_eq!((got.node_endpoints[0].host.as_str(), got.node_endpoints[0].port), (GATEWAY_HOST, 19093));
        assert_eq!(got.responses, fetch_response(version, true).responses, "records untouched");
    }
    // Before v16 a Fetch response passes as it arrives, never held.
    let old = encode_response(ApiKey::Fetch, 12, 42, &fetch_response(12, false));
    let (out, session) = through(ApiKey::Fetch, 12, &old);
    assert_eq!(out, old);
    assert_eq!(session.stats.get(Counter::ResponsesExamined), 0);
}

#[test]
fn produce_node_endpoints() {
    for version in 10..=13 {
        let mut message = pr::ProduceResponse::default().with_responses(vec![pr::TopicProduceResponse::default()
            .with_name(kafka_protocol::messages::TopicName(s("t"))).with_partition_responses(vec![pr::PartitionProduceResponse::default()])]);
        let plain = encode_response(ApiKey::Produce, version, 42, &message);
        let (out, _) = through(ApiKey::Produce, version, &plain);
        assert_eq!(out, plain, "v{version}");
        message.node_endpoints = vec![pr::NodeEndpoint::default().with_node_id(BrokerId(1)).with_host(s("kafka-1")).with_port(9092)];
        let (out, _) = through(ApiKey::Produce, version, &encode_response(ApiKey::Produce, version, 42, &message));
        let (_, got): (i32, pr::ProduceResponse) = decode_response(ApiKey::Produce, version, &out);
        assert_eq!(got.node_endpoints[0].host.as_str(), GATEWAY_HOST, "v{version}");
    }
}

#[test]
fn share_fetch_node_endpoints() {
    let message = sf::ShareFetchResponse::default().with_node_endpoints(vec![
        sf::NodeEndpoint::default().with_node_id(BrokerId(3)).with_host(s("kafka-3")).with_port(9092)]);
    let (out, _) = through(ApiKey::ShareFetch, 1, &encode_response(ApiKey::ShareFetch, 1, 42, &message));
    let (_, got): (i32, sf::ShareFetchResponse) = decode_response(ApiKey::ShareFetch, 1, &out);
    assert_eq!((got.node_endpoints[0].host.as_str(), got.node_endpoints[0].port), (GATEWAY_HOST, 19094));
}

#[test]
fn describe_quorum_controller_endpoints_are_removed() {
    let message = dq::DescribeQuorumResponse::default().with_nodes(vec![dq::Node::default()
        .with_node_id(BrokerId(1)).with_listeners(vec![dq::Listener::default().with_name(s("CONTROLLER")).with_host(s("kafka-1")).with_port(9093)])]);
    let (out, session) = through(ApiKey::DescribeQuorum, 2, &encode_response(ApiKey::DescribeQuorum, 2, 42, &message));
    let (_, got): (i32, dq::DescribeQuorumResponse) = decode_response(ApiKey::DescribeQuorum, 2, &out);
    assert!(got.nodes[0].listeners.is_empty());
    assert_eq!(session.stats.get(Counter::EndpointsRedacted), 1);
}

#[test]
fn describe_configs_broker_addresses() {
    let entry = |name: &str, value: &str| cfg::DescribeConfigsResourceResult::default()
        .with_name(s(name)).with_value(Some(s(value)))
        .with_synonyms(vec![cfg::DescribeConfigsSynonym::default().with_name(s(name)).with_value(Some(s(value)))]);
    let message = cfg::DescribeConfigsResponse::default().with_results(vec![
        cfg::DescribeConfigsResult::default().with_resource_type(4).with_resource_name(s("1")).with_configs(vec![
            entry("advertised.listeners", "PLAINTEXT://kafka-1:9092,INTERNAL://10.0.0.1:9094"),
            entry("listeners", "PLAINTEXT://:9092,CONTROLLER://:9093"),
            entry("controller.quorum.voters", "1@kafka-1:9093"),
            entry("controller.quorum.bootstrap.servers", "kafka-1:9092,kafka-2:9093"),
            entry("log.retention.hours", "168"),
        ]),
        cfg::DescribeConfigsResult::default().with_resource_type(2).with_resource_name(s("topic")).with_configs(vec![
            entry("advertised.listeners", "PLAINTEXT://kafka-1:9092")]),
    ]);
    for version in 1..=4 {
        let (out, _) = through(ApiKey::DescribeConfigs, version, &encode_response(ApiKey::DescribeConfigs, version, 42, &message));
        let (_, got): (i32, cfg::DescribeConfigsResponse) = decode_response(ApiKey::DescribeConfigs, version, &out);
        let values: Vec<&str> = got.results[0].configs.iter().map(|c| c.value.as_ref().unwrap().as_str()).collect();
        assert_eq!(values, [
            "PLAINTEXT://gateway.test:19092,INTERNAL://redacted:0",
            "PLAINTEXT://redacted:0,CONTROLLER://redacted:0",
            "1@redacted:0",
            "gateway.test:19092,redacted:0",
            "168",
        ], "v{version}");
        if version >= 1 {
            assert_eq!(got.results[0].configs[0].synonyms[0].value.as_ref().unwrap().as_str(),
                       "PLAINTEXT://gateway.test:19092,INTERNAL://redacted:0");
        }
        assert_eq!(got.results[1].configs[0].value.as_ref().unwrap().as_str(), "PLAINTEXT://kafka-1:9092",
                   "only broker resources are rewritten");
    }
}

#[test]
fn kafkas_built_in_default_is_no_address_of_the_cluster() {
    // `listeners`' DEFAULT_CONFIG synonym (PLAINTEXT://:9092 on every Kafka) read
    // `PLAINTEXT://redacted:0` through the gateway: lossy, and no address to hide.
    const STATIC_BROKER_CONFIG: i8 = 4;
    const DEFAULT_CONFIG: i8 = 5;
    let synonym = |value: &str, source: i8| cfg::DescribeConfigsSynonym::default()
        .with_name(s("listeners")).with_value(Some(s(value))).with_source(source);
    let message = cfg::DescribeConfigsResponse::default().with_results(vec![
        cfg::DescribeConfigsResult::default().with_resource_type(4).with_resource_name(s("1")).with_configs(vec![
            cfg::DescribeConfigsResourceResult::default().with_name(s("listeners"))
                .with_value(Some(s("PLAINTEXT://kafka-1:9092"))).with_config_source(STATIC_BROKER_CONFIG)
                .with_synonyms(vec![synonym("PLAINTEXT://kafka-1:9092", STATIC_BROKER_CONFIG),
                                    synonym("PLAINTEXT://:9092", DEFAULT_CONFIG)]),
            cfg::DescribeConfigsResourceResult::default().with_name(s("advertised.listeners"))
                .with_value(Some(s("PLAINTEXT://:9092"))).with_config_source(DEFAULT_CONFIG),
        ]),
    ]);
    for version in 1..=4 {
        let (out, _) = through(ApiKey::DescribeConfigs, version, &encode_response(ApiKey::DescribeConfigs, version, 42, &message));
        let (_, got): (i32, cfg::DescribeConfigsResponse) = decode_response(ApiKey::DescribeConfigs, version, &out);
        let listeners = &got.results[0].configs[0];
        let synonyms: Vec<&str> = listeners.synonyms.iter().map(|s| s.value.as_ref().unwrap().as_str()).collect();
        assert_eq!(synonyms, ["PLAINTEXT://gateway.test:19092", "PLAINTEXT://:9092"], "v{version}");
        assert_eq!(got.results[0].configs[1].value.as_ref().unwrap().as_str(), "PLAINTEXT://:9092", "v{version}");
    }
}

#[test]
fn metadata_in_every_version() {
    for version in 0..=13 {
        let (out, session) = through(ApiKey::Metadata, version, &metadata_response(version, 42));
        let (_, got): (i32, kafka_protocol::messages::MetadataResponse) = decode_response(ApiKey::Metadata, version, &out);
        assert!(got.brokers.iter().all(|b| b.host.as_str() == GATEWAY_HOST), "v{version}");
        assert_eq!(session.stats.get(Counter::AddressesRewritten), 2);
    }
}

/// The skimmer and kafka-protocol's decoder agree on where NodeEndpoints is.
#[test]
fn skim_agrees_with_the_decoder() {
    use keg_kafka_filter::core::skim::fetch_has_node_endpoints;
    for version in 16..=18 {
        for endpoints in [false, true] {
            let frame = encode_response(ApiKey::Fetch, version, 1, &fetch_response(version, endpoints));
            assert_eq!(fetch_has_node_endpoints(&frame), Ok(endpoints));
            let _ = fr::FetchResponse::decode(&mut Bytes::copy_from_slice(&frame[9..]), version).unwrap();
        }
    }
    let mut buf = bytes::BytesMut::new();
    fetch_response(16, false).encode(&mut buf, 16).unwrap();
}

/// How to examine a Fetch v16+ response, measured: skim to the tagged fields vs decode
/// with kafka-protocol, per response of 3 topics x 4 partitions x 64 KiB of records.
/// `cargo test --release --test rewrite -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: run in release mode"]
fn measure_skim_against_decode() {
    use keg_kafka_filter::core::skim::fetch_has_node_endpoints;
    use std::time::Instant;
    let partition = |i| fr::PartitionData::default().with_partition_index(i)
        .with_records(Some(Bytes::from(vec![7u8; 64 * 1024])));
    let topic = fr::FetchableTopicResponse::default().with_partitions((0..4).map(partition).collect());
    let message = fr::FetchResponse::default().with_responses(vec![topic; 3]);
    let frame = encode_response(ApiKey::Fetch, 17, 1, &message);
    let shared = Bytes::from(frame.clone());
    let rounds = 20_000;
    let started = Instant::now();
    for _ in 0..rounds {
        assert!(!fetch_has_node_endpoints(std::hint::black_box(&frame)).unwrap());
    }
    let skim = started.elapsed().as_nanos() as f64 / rounds as f64;
    let started = Instant::now();
    for _ in 0..rounds {
        let mut buf = shared.slice(9..);
        let decoded = fr::FetchResponse::decode(&mut buf, 17).unwrap();
        assert!(std::hint::black_box(decoded).node_endpoints.is_empty());
    }
    let decode = started.elapsed().as_nanos() as f64 / rounds as f64;
    let started = Instant::now();
    for _ in 0..rounds {
        let copy = std::hint::black_box(frame.clone());
        assert_eq!(copy.len(), frame.len());
    }
    let copy = started.elapsed().as_nanos() as f64 / rounds as f64;
    println!("Fetch v17 response of {} bytes, 12 partitions: skim {skim:.0} ns, kafka-protocol decode (zero-copy records) {decode:.0} ns, one copy of the frame {copy:.0} ns", frame.len());
}
