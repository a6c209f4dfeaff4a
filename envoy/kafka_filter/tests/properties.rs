//! Property tests: random and mutated frames, split anywhere, never panic the core; a
//! stream of pass-through frames comes out as it went in.
//!
//! `cargo test --release --test properties -- --ignored` runs the 1M-input campaign.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::*;
use kafka_protocol::messages::{describe_configs_response as cfg, fetch_response as fr, share_fetch_response as sfr, ApiKey, BrokerId};
use kafka_protocol::protocol::StrBytes;
use keg_kafka_filter::core::handoff::Failure;
use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::meter::Meter;
use keg_kafka_filter::core::rewrite::Routes;
use keg_kafka_filter::core::topics::TopicSelector;
use keg_kafka_filter::core::payload::PayloadSchema;
use keg_kafka_filter::core::vouch::{Vouch, Vouching};
use keg_kafka_filter::core::{Disposition, Output, RequestPolicy, Requester, Resolution, Session, SessionLimits};
use proptest::prelude::*;

/// Requests whose responses the core examines, and a few it passes.
const ASKED: [(i16, i16); 9] = [(3, 12), (1, 16), (1, 17), (0, 11), (10, 4), (10, 2), (60, 1), (32, 4), (55, 2)];

fn valid_responses() -> Vec<Vec<u8>> {
    let s = |t: &str| StrBytes::from_string(t.to_string());
    let fetch = fr::FetchResponse::default()
        .with_responses(vec![fr::FetchableTopicResponse::default().with_partitions(vec![
            fr::PartitionData::default().with_records(Some(vec![1u8; 64].into()))])])
        .with_node_endpoints(vec![fr::NodeEndpoint::default().with_node_id(BrokerId(1)).with_host(s("kafka-1")).with_port(9092)]);
    let configs = cfg::DescribeConfigsResponse::default().with_results(vec![cfg::DescribeConfigsResult::default()
        .with_resource_type(4).with_configs(vec![cfg::DescribeConfigsResourceResult::default()
            .with_name(s("advertised.listeners")).with_value(Some(s("PLAINTEXT://kafka-1:9092")))])]);
    let share = sfr::ShareFetchResponse::default()
        .with_responses(vec![sfr::ShareFetchableTopicResponse::default().with_topic_id(topic_id("logs")).with_partitions(vec![
            sfr::PartitionData::default().with_records(Some(vec![1u8; 64].into()))
                .with_acquired_records(vec![sfr::AcquiredRecords::default().with_last_offset(3)])])])
        .with_node_endpoints(vec![sfr::NodeEndpoint::default().with_node_id(BrokerId(1)).with_host(s("kafka-1")).with_port(9092)]);
    vec![
        metadata_response(12, 1),
        // As the answer to `share_request` (correlation id 1 too).
        encode_response(ApiKey::ShareFetch, 1, 1, &share),
        encode_response(ApiKey::Fetch, 16, 2, &fetch),
        encode_response(ApiKey::Fetch, 17, 3, &fetch),
        encode_response(ApiKey::DescribeConfigs, 4, 4, &configs),
    ]
}

/// A ShareFetch in a share session (epoch 3) naming an unselected topic: with a
/// selector, its answer (the mutated response) is judged by the module.
fn share_request() -> Vec<u8> {
    use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{RequestHeader, ShareFetchRequest};
    use kafka_protocol::protocol::Encodable;
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default().with_request_api_key(78).with_request_api_version(1).with_correlation_id(1)
        .encode(&mut buf, ApiKey::ShareFetch.request_header_version(1)).unwrap();
    ShareFetchRequest::default().with_share_session_epoch(3).with_topics(vec![FetchTopic::default()
        .with_topic_id(topic_id("logs")).with_partitions(vec![FetchPartition::default()])])
        .encode(&mut buf, 1).unwrap();
    sized(&buf)
}

fn asked_requests() -> Vec<u8> {
    ASKED.iter().enumerate().map(|(i, (k, v))| request(*k, *v, i as i32 + 1, &[0; 3])).collect::<Vec<_>>().concat()
}

/// Feeds `requests` then `responses`, each cut at `cuts`; Err on a protocol error.
fn drive(requests: &[u8], responses: &[u8], cuts: &[usize], routes: &Routes) -> Result<(Vec<u8>, Vec<u8>), ()> {
    let mut session = Session::new(SessionLimits { max_frame_size: 1 << 20 });
    session.meter = Some(Meter::new(true)); // read-only: every property holds with it
    let mut forwarded = Vec::new();
    for chunk in split(requests, cuts) {
        let mut out = Output::default();
        session.feed_requests(chunk, &mut out).map_err(|_| ())?;
        forwarded.extend(bytes_of(chunk, &out));
    }
    let mut to_client = Vec::new();
    for chunk in split(responses, cuts) {
        let mut out = Output::default();
        session.feed_responses(chunk, view(routes), &mut out).map_err(|_| ())?;
        to_client.extend(bytes_of(chunk, &out));
    }
    Ok((forwarded, to_client))
}

fn split<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.sort_unstable();
    let mut chunks = Vec::new();
    let mut last = 0;
    for p in points {
        chunks.push(&data[last..p]);
        last = p;
    }
    chunks.push(&data[last..]);
    chunks
}

/// A pass-through request of a random API (never one whose response is examined).
fn passing_request() -> impl Strategy<Value = Vec<u8>> {
    (any::<i16>(), 0i16..20, any::<i32>(), proptest::collection::vec(any::<u8>(), 0..200)).prop_map(|(key, version, corr, body)| {
        let key = match key.rem_euclid(100) {
            0 => 8, 1 => 9, 3 => 2, 10 | 32 | 55 | 60 | 78 | 79 | 17 => 12,
            k => k,
        };
        request(key, version, corr, &body)
    })
}

/// Hands off the APIs whose bit is set in the mask (the key modulo 64); with bit 62 set,
/// Produce, Fetch and ShareFetch by their topics (the random frames' topics, read or not, decide).
struct HandOffSome(u64);

fn selector() -> std::sync::Arc<TopicSelector> {
    std::sync::Arc::new(TopicSelector::parse(serde_json::json!({"exact": ["orders"], "regex": ["x.*"]})).unwrap())
}

impl RequestPolicy for HandOffSome {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if (self.0 >> head.api_key.rem_euclid(64)) & 1 == 1 {
            if matches!(head.api_key, 0 | 1 | 78) && (self.0 >> 62) & 1 == 1 {
                // Bit 61: the selected topics' records may pass on vouched schema ids.
                let vouching = ((self.0 >> 61) & 1 == 1).then(vouching);
                return Disposition::Select { fail_open: self.0 & 1 == 0, selector: selector(), vouching };
            }
            Disposition::HandOff { fail_open: self.0 & 1 == 0 }
        } else {
            Disposition::Forward
        }
    }
}

fn vouching() -> std::sync::Arc<Vouching> {
    let unvouched = TopicSelector::parse(serde_json::json!({"exact": ["x-other"]})).unwrap();
    std::sync::Arc::new(Vouching { selector: selector(), unvouched: std::sync::Arc::new(unvouched) })
}

/// Vouches for the topics the random frames name (ids 0-3, small and large ttls).
fn object_schema() -> std::sync::Arc<PayloadSchema> {
    static SCHEMA: std::sync::OnceLock<std::sync::Arc<PayloadSchema>> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| std::sync::Arc::new(PayloadSchema::compile(r#"{"type": "object"}"#).unwrap())).clone()
}

fn vouches(pick: u8) -> Vec<Vouch> {
    if pick & 16 == 0 {
        return Vec::new();
    }
    ["orders", "x1", "x-other"].iter().map(|topic| Vouch {
        topic: topic.to_string(), ids: vec![0, 1, 2, u32::from(pick & 3)], ttl_ms: if pick & 32 == 0 { 1 } else { 60_000 },
        // Sometimes payloads of id 0 are checked too (any JSON object passes).
        schemas: if pick & 64 == 0 { vec![] } else { vec![(0, object_schema())] },
    }).collect()
}

/// An answer the service (or its absence) might give, chosen by `pick`.
fn resolution(pick: u8, frame: &[u8], noise: &[u8]) -> Resolution {
    match pick % 7 {
        0 => Resolution::Request { forward: frame.to_vec(), answer: None, want_response: pick & 8 != 0, vouched: vouches(pick) },
        1 => Resolution::Request { forward: vec![], answer: Some(noise.to_vec()), want_response: false, vouched: vec![] },
        2 => Resolution::Request { forward: noise.to_vec(), answer: None, want_response: true, vouched: vec![] },
        3 => Resolution::Response { answer: noise.to_vec(), vouched: vouches(pick) },
        4 => Resolution::Failed(Failure::Timeout),
        5 => Resolution::Close,
        _ => Resolution::Request { forward: vec![], answer: None, want_response: false, vouched: vec![] },
    }
}

/// Feeds `requests` and `responses` with hand-offs resolved by `picks` (eagerly or
/// after both directions, by `eager`); what reached the broker, or Err.
fn drive_handoffs(mask: u64, requests: &[u8], responses: &[u8], cuts: &[usize], picks: &[u8], eager: bool,
                  routes: &Routes) -> Result<Vec<u8>, ()> {
    let mut session = Session::with_policy(SessionLimits { max_frame_size: 1 << 20 }, HandOffSome(mask));
    session.meter = Some(Meter::new(true));
    let (mut forwarded, mut deferred, mut n) = (Vec::new(), Vec::new(), 0);
    let mut settle = |session: &mut Session<HandOffSome>, deferred: &mut Vec<_>, forwarded: &mut Vec<u8>, now: bool| -> Result<(), ()> {
        deferred.extend(session.take_handoffs());
        if now {
            for h in deferred.drain(..) {
                let h: keg_kafka_filter::core::HandOff = h;
                let pick = picks.get(n % picks.len().max(1)).copied().unwrap_or(0);
                n += 1;
                session.resolve(h.id, resolution(pick, &h.frame, &h.frame[..h.frame.len() / 2])).map_err(|_| ())?;
                // A second answer to the same hand-off changes nothing.
                session.resolve(h.id, Resolution::Close).map_err(|_| ())?;
            }
        }
        let mut out = Output::default();
        session.ready_requests(&mut out);
        forwarded.extend(bytes_of(&[], &out));
        let mut out = Output::default();
        session.ready_responses(&mut out);
        Ok(())
    };
    for chunk in split(requests, cuts) {
        let mut out = Output::default();
        session.feed_requests(chunk, &mut out).map_err(|_| ())?;
        forwarded.extend(bytes_of(chunk, &out));
        settle(&mut session, &mut deferred, &mut forwarded, eager)?;
    }
    for chunk in split(responses, cuts) {
        let mut out = Output::default();
        session.feed_responses(chunk, view(routes), &mut out).map_err(|_| ())?;
        settle(&mut session, &mut deferred, &mut forwarded, eager)?;
    }
    settle(&mut session, &mut deferred, &mut forwarded, true)?;
    Ok(forwarded)
}

/// A Produce request (kafka-protocol's encoding) of `version` naming `topics`.
fn produce_request_of(version: i16, correlation_id: i32, topics: &[&str], flips: &[(usize, u8)]) -> Vec<u8> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default().with_request_api_key(0).with_request_api_version(version)
        .with_correlation_id(correlation_id).with_client_id(Some(StrBytes::from_static_str("p")))
        .encode(&mut buf, ApiKey::Produce.request_header_version(version)).unwrap();
    let data = topics.iter().map(|t| TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(t.to_string())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0)
            .with_records(Some(bytes::Bytes::from(vec![7u8; 30])))])).collect();
    ProduceRequest::default().with_acks(1).with_topic_data(data).encode(&mut buf, version).unwrap();
    let mut frame = sized(&buf);
    for &(at, byte) in flips {
        // Never the size prefix: the frame keeps its length, its contents go wrong.
        let at = 4 + at % (frame.len() - 4);
        frame[at] = byte;
    }
    frame
}

fn cases() -> u32 {
    std::env::var("KEG_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn pass_through_requests_are_the_identity(frames in proptest::collection::vec(passing_request(), 1..8),
                                              cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let stream = frames.concat();
        let routes = routes();
        let (forwarded, _) = drive(&stream, &[], &cuts, &routes).expect("valid requests");
        prop_assert_eq!(forwarded, stream);
    }

    #[test]
    fn handed_off_requests_answered_unchanged_are_the_identity(
            frames in proptest::collection::vec(passing_request(), 1..8), mask in any::<u64>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..6), eager in any::<bool>()) {
        let stream = frames.concat();
        let routes = routes();
        let forwarded = drive_handoffs(mask, &stream, &[], &cuts, &[0], eager, &routes).expect("valid requests");
        prop_assert_eq!(forwarded, stream);
    }

    #[test]
    fn topic_selected_produce_requests_answered_unchanged_are_the_identity(
            frames in proptest::collection::vec((3i16..=12, proptest::collection::vec(0usize..4, 0..4)), 1..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..6), eager in any::<bool>()) {
        const NAMES: [&str; 4] = ["orders", "payments", "xy", "logs"];
        let stream: Vec<u8> = frames.iter().enumerate().map(|(i, (version, topics))| {
            let names: Vec<&str> = topics.iter().map(|&t| NAMES[t]).collect();
            produce_request_of(*version, i as i32, &names, &[])
        }).collect::<Vec<_>>().concat();
        let routes = routes();
        let forwarded = drive_handoffs(1 | (1 << 62), &stream, &[], &cuts, &[0], eager, &routes).expect("valid requests");
        prop_assert_eq!(forwarded, stream);
    }

    #[test]
    fn mutated_produce_requests_under_a_topic_selector_never_panic(
            version in 3i16..=13, topics in proptest::collection::vec(0usize..3, 0..4),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            picks in proptest::collection::vec(any::<u8>(), 1..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..6), eager in any::<bool>()) {
        let names: Vec<&str> = topics.iter().map(|&t| ["orders", "logs", "xz"][t]).collect();
        let frame = produce_request_of(version.min(12), 1, &names, &flips);
        let routes = routes();
        let _ = drive_handoffs(3 | (1 << 62), &frame, &[], &cuts, &picks, eager, &routes);
    }

    #[test]
    fn any_answer_to_any_handoff_never_panics(
            requests in proptest::collection::vec(any::<u8>(), 0..300), mask in any::<u64>(),
            responses in proptest::collection::vec(any::<u8>(), 0..300), picks in proptest::collection::vec(any::<u8>(), 1..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..6), eager in any::<bool>()) {
        let routes = routes();
        let _ = drive_handoffs(mask, &requests, &responses, &cuts, &picks, eager, &routes);
        let _ = drive_handoffs(mask | 0b10, &asked_requests(), &responses, &cuts, &picks, eager, &routes);
    }

    #[test]
    fn random_bytes_never_panic(requests in proptest::collection::vec(any::<u8>(), 0..300),
                                responses in proptest::collection::vec(any::<u8>(), 0..300),
                                cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
        let routes = routes();
        let _ = drive(&requests, &responses, &cuts, &routes);
        let _ = drive(&asked_requests(), &responses, &cuts, &routes);
    }

    #[test]
    fn mutated_responses_never_panic(which in 0usize..4, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
                                     cut_end in any::<usize>(), cuts in proptest::collection::vec(any::<usize>(), 0..4)) {
        let routes = routes();
        let responses = valid_responses();
        let mut frame = responses[which].clone();
        for (at, value) in flips {
            let at = at % frame.len();
            frame[at] = value;
        }
        frame.truncate(cut_end % (frame.len() + 1));
        // Every asked request, so whichever correlation id survives finds a slot.
        let requests: Vec<u8> = (1..=4).map(|i| request(ASKED[i - 1].0, ASKED[i - 1].1, i as i32, &[0; 3])).collect::<Vec<_>>().concat();
        let _ = drive(&requests, &frame, &cuts, &routes);
    }
}

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One generated input: random bytes, a mutated valid response, or a valid stream with
/// mutated sizes; fed in both directions with random cuts. Returns whether it panicked.
fn one_input(rng: &mut Rng, routes: &Routes, valid: &[Vec<u8>], asked: &[u8], share: &[u8]) -> bool {
    let kind = rng.below(3);
    let mut data: Vec<u8> = match kind {
        0 => (0..rng.below(400)).map(|_| rng.next() as u8).collect(),
        _ => valid[rng.below(valid.len())].clone(),
    };
    if kind >= 1 && !data.is_empty() {
        for _ in 0..1 + rng.below(4) {
            let at = if kind == 2 { rng.below(4.min(data.len())) } else { rng.below(data.len()) };
            data[at] = rng.next() as u8;
        }
        let keep = data.len() - rng.below(data.len() / 4 + 1);
        data.truncate(keep);
    }
    let cuts: Vec<usize> = (0..rng.below(5)).map(|_| rng.next() as usize).collect();
    let (mask, picks) = (rng.next(), rng.next().to_le_bytes());
    let eager = rng.below(2) == 0;
    catch_unwind(AssertUnwindSafe(|| {
        let _ = drive(&data, &[], &cuts, routes);
        let _ = drive(asked, &data, &cuts, routes);
        let _ = drive_handoffs(mask, &data, &[], &cuts, &picks, eager, routes);
        let _ = drive_handoffs(mask, asked, &data, &cuts, &picks, eager, routes);
        // The answer to a ShareFetch in a session, judged by the module (key 78: bit 14).
        let _ = drive_handoffs(mask | 1 << 62 | 1 << 14, share, &data, &cuts, &picks, eager, routes);
    }))
    .is_err()
}

fn campaign(inputs: usize, seed: u64) -> usize {
    let routes = routes();
    let valid = valid_responses();
    let asked = asked_requests();
    let share = share_request();
    let mut rng = Rng(seed);
    (0..inputs).filter(|_| one_input(&mut rng, &routes, &valid, &asked, &share)).count()
}

#[test]
fn ten_thousand_generated_inputs_never_panic() {
    assert_eq!(campaign(10_000, 0x6b65_6721), 0);
}

#[test]
#[ignore = "the 1M-input campaign: cargo test --release --test properties -- --ignored"]
fn a_million_generated_inputs_never_panic() {
    let inputs = std::env::var("KEG_FUZZ_INPUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let panics = campaign(inputs, 0x6b65_6722);
    println!("{inputs} inputs, {panics} panics");
    assert_eq!(panics, 0);
}
