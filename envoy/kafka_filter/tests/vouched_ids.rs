//! Vouched schema ids (`core::vouch`): a Produce (a Fetch answer) of topics that only
//! ids-only schema rules act on passes without a hand-off once the service vouched for
//! every record's id; anything the walk cannot vouch for is handed off as before.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, FetchResponse, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::topics::TopicSelector;
use keg_kafka_filter::core::payload::{PayloadSchema, MAX_VALIDATED};
use keg_kafka_filter::core::vouch::{fetch_passes, fetch_verdict, FetchVerdict, fetch_request_passes, produce_passes, records_pass, Allowed, Budget, Tail, Vouch, Vouched, Vouching};
use keg_kafka_filter::core::handoff::{Failure, NOT_LEADER_OR_FOLLOWER};
use keg_kafka_filter::core::{Direction, Disposition, Output, RequestPolicy, Requester, Resolution, Session, SessionLimits};

/// Rules may act on `s.*`; only schema-id rules on all but `s.masked`.
fn vouching() -> Arc<Vouching> {
    let selector = TopicSelector::parse(serde_json::json!({"prefix": ["s."]})).unwrap();
    let unvouched = TopicSelector::parse(serde_json::json!({"exact": ["s.masked"]})).unwrap();
    Arc::new(Vouching { selector: Arc::new(selector), unvouched: Arc::new(unvouched) })
}

fn framed(id: u32, payload: &[u8]) -> Option<Bytes> {
    let mut v = vec![0u8];
    v.extend(id.to_be_bytes());
    v.extend_from_slice(payload);
    Some(Bytes::from(v))
}

fn record(offset: i64, value: Option<Bytes>, control: bool) -> Record {
    Record {
        transactional: control,
        control,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: if control { 9 } else { -1 },
        producer_epoch: if control { 0 } else { -1 },
        timestamp_type: TimestampType::Creation,
        offset,
        // kafka-protocol batches records whose offset - sequence is the same.
        sequence: if control { -1 } else { offset as i32 },
        timestamp: 1_700_000_000_000,
        key: Some(Bytes::from_static(b"k")),
        value,
        headers: Default::default(),
    }
}

/// One batch (magic 2, uncompressed) of these values.
fn batch(values: &[Option<Bytes>]) -> Vec<u8> {
    batch_with(values, Compression::None)
}

fn batch_with(values: &[Option<Bytes>], compression: Compression) -> Vec<u8> {
    let records: Vec<Record> = values.iter().enumerate().map(|(i, v)| record(i as i64, v.clone(), false)).collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
    buf.to_vec()
}

/// Where the last batch of `records` starts.
fn last_batch(records: &[u8]) -> usize {
    let (mut pos, mut last) = (0, 0);
    while pos < records.len() {
        last = pos;
        pos += 12 + i32::from_be_bytes(records[pos + 8..pos + 12].try_into().unwrap()) as usize;
    }
    last
}

fn budget() -> Budget {
    Budget::frame()
}

fn control_batch() -> Vec<u8> {
    let marker = record(5, Some(Bytes::from_static(&[0, 0, 0, 0, 0, 0])), true);
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, [&marker], &RecordEncodeOptions { version: 2, compression: Compression::None }).unwrap();
    buf.to_vec()
}

fn produce(version: i16, topics: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(0).with_request_api_version(version).with_correlation_id(11)
        .with_client_id(Some(StrBytes::from_static_str("t")))
        .encode(&mut buf, ApiKey::Produce.request_header_version(version)).unwrap();
    let data = topics.iter().map(|(name, records)| {
        let topic = TopicProduceData::default().with_partition_data(vec![
            PartitionProduceData::default().with_index(0).with_records(Some(Bytes::from(records.clone()))),
            PartitionProduceData::default().with_index(1).with_records(Some(Bytes::from(records.clone()))),
        ]);
        if version >= 13 {
            topic.with_topic_id(topic_id(name))
        } else {
            topic.with_name(TopicName(StrBytes::from_string(name.to_string())))
        }
    }).collect();
    ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(data).encode(&mut buf, version).unwrap();
    sized(&buf)
}

fn fetch(version: i16, topics: &[(&str, Vec<u8>)], error_partition: bool) -> Vec<u8> {
    fetch_answer(11, version, topics, error_partition)
}

fn vouched(under: &Arc<Vouching>, topic: &str, ids: &[u32], ttl_ms: u64) -> Vouched {
    let mut v = Vouched::default();
    v.learn(vec![Vouch { topic: topic.into(), ids: ids.to_vec(), ttl_ms, schemas: vec![] }], under, Instant::now());
    v
}

#[test]
fn records_pass_only_with_every_value_framed_with_a_vouched_id() {
    let good = batch(&[framed(7, b"{}"), framed(7, b"{\"a\":1}"), framed(3, b"")]);
    assert!(records_pass(&good, &Allowed::ids(&[3, 7]), &mut budget(), Tail::Malformed));
    assert!(records_pass(&[good.clone(), control_batch(), good.clone()].concat(), &Allowed::ids(&[3, 7]), &mut budget(), Tail::Malformed));
    assert!(!records_pass(&good, &Allowed::ids(&[7]), &mut budget(), Tail::Malformed), "id 3 was not vouched for");
    for bad in [None, Some(Bytes::from_static(b"{}")), Some(Bytes::from_static(&[0, 0, 0, 7])),
                Some(Bytes::from_static(&[1, 0, 0, 0, 7, b'x']))] {
        let mixed = batch(&[framed(7, b"{}"), bad.clone()]);
        assert!(!records_pass(&mixed, &Allowed::ids(&[7]), &mut budget(), Tail::Malformed), "{bad:?}");
    }
    let mut compressed = good.clone();
    compressed[22] |= 0x03; // attributes: lz4, but the records are not
    assert!(!records_pass(&compressed, &Allowed::ids(&[3, 7]), &mut budget(), Tail::Malformed));
    let mut old_magic = good.clone();
    old_magic[16] = 1;
    assert!(!records_pass(&old_magic, &Allowed::ids(&[3, 7]), &mut budget(), Tail::Malformed));
    let first = 12 + i32::from_be_bytes(good[8..12].try_into().unwrap()) as usize;
    for cut in 1..first {
        assert!(!records_pass(&good[..cut], &Allowed::ids(&[3, 7]), &mut budget(), Tail::Malformed), "cut at {cut}");
    }
    let mut more = good.clone();
    more[60] += 1; // records_count one more than the batch holds
    assert!(!records_pass(&more, &Allowed::ids(&[3, 7]), &mut budget(), Tail::Malformed));
}

const ORDER: &str = r#"{"type": "object", "required": ["id"], "properties": {"id": {"type": "integer", "minimum": 1}}}"#;

fn order_schema() -> Arc<PayloadSchema> {
    Arc::new(PayloadSchema::compile(ORDER).unwrap())
}

#[test]
fn records_of_an_id_vouched_with_its_schema_pass_when_every_payload_is_valid() {
    let allowed = Allowed::of(vec![(7, Some(order_schema())), (3, None)]);
    let good = batch(&[framed(7, br#"{"id": 1}"#), framed(3, b"anything"), framed(7, br#"{"id": 2, "x": []}"#)]);
    assert!(records_pass(&good, &allowed, &mut budget(), Tail::Malformed));
    for codec in [Compression::Lz4, Compression::Zstd, Compression::Snappy, Compression::Gzip] {
        let compressed = batch_with(&[framed(7, br#"{"id": 1}"#), framed(7, br#"{"id": 5}"#)], codec);
        assert!(records_pass(&compressed, &allowed, &mut budget(), Tail::Malformed), "{codec:?}");
        let bad = batch_with(&[framed(7, br#"{"id": 1}"#), framed(7, br#"{"id": 0}"#)], codec);
        assert!(!records_pass(&bad, &allowed, &mut budget(), Tail::Malformed), "{codec:?}: id 0 is below the minimum");
    }
    for bad in [framed(7, br#"{"id": 0}"#), framed(7, br#"{}"#), framed(7, br#"{"id": "1"}"#), framed(7, b"{\"id\": 1"),
                framed(7, b""), framed(7, b"\xff\xfe"), framed(8, br#"{"id": 1}"#), None] {
        let mixed = batch(&[framed(7, br#"{"id": 1}"#), bad.clone()]);
        assert!(!records_pass(&mixed, &allowed, &mut budget(), Tail::Malformed), "{bad:?}");
    }
    // The bytes validated are charged: past MAX_VALIDATED the frame is handed off.
    let mut left = budget();
    assert!(records_pass(&good, &allowed, &mut left, Tail::Malformed));
    assert_eq!(budget().validated - left.validated, br#"{"id": 1}"#.len() + br#"{"id": 2, "x": []}"#.len());
    let big = format!(r#"{{"id": 1, "pad": "{}"}}"#, "x".repeat(1 << 20));
    let many: Vec<Option<Bytes>> = (0..=MAX_VALIDATED >> 20).map(|_| framed(7, big.as_bytes())).collect();
    assert!(!records_pass(&batch(&many), &allowed, &mut budget(), Tail::Malformed));
    assert!(records_pass(&batch(&many[..4]), &allowed, &mut budget(), Tail::Malformed));
}

#[test]
fn a_produce_passes_on_a_vouch_with_a_schema_only_when_its_payloads_are_valid() {
    let under = vouching();
    let mut known = Vouched::default();
    known.learn(vec![Vouch { topic: "s.orders".into(), ids: vec![7], ttl_ms: 60_000, schemas: vec![(7, order_schema())] }],
                &under, Instant::now());
    for version in [3, 9, 13] {
        let good = produce(version, &[("s.orders", batch(&[framed(7, br#"{"id": 1}"#)]))]);
        assert!(produce_passes(&good, version, &under, &known, Instant::now()), "v{version}");
        let bad = produce(version, &[("s.orders", batch(&[framed(7, br#"{"id": -1}"#)]))]);
        assert!(!produce_passes(&bad, version, &under, &known, Instant::now()), "v{version}");
        let good_answer = fetch(version + 4, &[("s.orders", batch(&[framed(7, br#"{"id": 1}"#)]))], false);
        let mut answers = Vouched::default();
        answers.learn(vec![Vouch { topic: "s.orders".into(), ids: vec![7], ttl_ms: 60_000, schemas: vec![(7, order_schema())] }],
                      &under, Instant::now());
        assert!(fetch_passes(&good_answer, version + 4, &under, &answers, Instant::now()), "fetch v{}", version + 4);
        let bad_answer = fetch(version + 4, &[("s.orders", batch(&[framed(7, b"[]")]))], false);
        assert!(!fetch_passes(&bad_answer, version + 4, &under, &answers, Instant::now()), "fetch v{}", version + 4);
    }
}

/// The records of each topic's partition 0 in a Fetch answer (size prefix included).
fn fetched_records(frame: &[u8], version: i16) -> Vec<(String, Vec<u8>)> {
    use kafka_protocol::protocol::Decodable;
    let mut body = Bytes::copy_from_slice(&frame[4..]);
    let header_version = ApiKey::Fetch.response_header_version(version);
    kafka_protocol::messages::ResponseHeader::decode(&mut body, header_version).unwrap();
    let answer = FetchResponse::decode(&mut body, version).unwrap();
    assert!(body.is_empty(), "the whole frame is one answer");
    answer.responses.iter().map(|t| {
        let name = if version >= 13 { format!("{}", t.topic_id) } else { t.topic.0.to_string() };
        (name, t.partitions[0].records.clone().unwrap_or_default().to_vec())
    }).collect()
}

#[test]
fn a_fetch_answer_past_what_a_frame_may_validate_is_cut_at_a_batch_boundary() {
    let under = vouching();
    let mut known = Vouched::default();
    let schema = vec![(7, order_schema())];
    known.learn(vec![Vouch { topic: "s.orders".into(), ids: vec![7], ttl_ms: 60_000, schemas: schema.clone() },
                     Vouch { topic: "s.more".into(), ids: vec![7], ttl_ms: 60_000, schemas: schema }],
                &under, Instant::now());
    // Batches of one 1 MiB valid order each: twelve of them are past the 8 MiB.
    let big = |id: u32| framed(7, format!(r#"{{"id": {id}, "pad": "{}"}}"#, "x".repeat(1 << 20)).as_bytes());
    let one: Vec<Vec<u8>> = (1..=12).map(|i| batch(&[big(i)])).collect();
    let mut last = one.clone();
    last[11] = batch(&[framed(7, br#"{"id": -1}"#)]); // invalid, but past the cut: not read
    for version in [11, 12, 17] {
        let records = last.concat();
        let answer = fetch(version, &[("s.orders", records.clone()), ("logs", one[0].clone()), ("s.more", one[0].clone())], false);
        let FetchVerdict::Cut(shorter) = fetch_verdict(&answer, version, &under, &known, Instant::now()) else {
            panic!("v{version}: cut expected")
        };
        let got = fetched_records(&shorter, version);
        let kept = &got[0].1;
        let whole = (1..12).find(|&n| kept.len() == one[..n].concat().len()).expect("whole batches kept");
        assert!((4..=8).contains(&whole), "v{version}: {whole} batches of 1 MiB within 8 MiB");
        assert_eq!(kept, &records[..kept.len()]);
        assert_eq!(got[1].1, one[0], "v{version}: an unchecked topic keeps its records");
        assert!(got[2].1.is_empty(), "v{version}: a checked partition after the cut waits for the next fetch");
        assert_eq!(fetch_verdict(&shorter, version, &under, &known, Instant::now()), FetchVerdict::Pass, "v{version}");
        // What comes next (the consumer fetches from the cut) is read the same way, and
        // the invalid record then goes to the service.
        let rest = fetch(version, &[("s.orders", records[kept.len()..].to_vec())], false);
        assert_ne!(fetch_verdict(&rest, version, &under, &known, Instant::now()), FetchVerdict::Pass, "v{version}");
        let valid_rest = fetch(version, &[("s.orders", one[whole..11].concat())], false);
        assert_eq!(fetch_verdict(&valid_rest, version, &under, &known, Instant::now()), FetchVerdict::Pass, "v{version}");
        // An invalid record before the cut: the service reads the answer.
        let mut early = one.clone();
        early[0] = batch(&[framed(7, br#"{"id": 0}"#)]);
        let answer = fetch(version, &[("s.orders", early.concat())], false);
        assert_eq!(fetch_verdict(&answer, version, &under, &known, Instant::now()), FetchVerdict::HandOff, "v{version}");
    }
    // A first batch alone past the budget: cut there, the consumer would never get on.
    let huge = batch(&[framed(7, format!(r#"{{"id": 1, "pad": "{}"}}"#, "x".repeat(MAX_VALIDATED)).as_bytes())]);
    let answer = fetch(12, &[("s.orders", huge)], false);
    assert_eq!(fetch_verdict(&answer, 12, &under, &known, Instant::now()), FetchVerdict::HandOff);
    // A Produce is never cut.
    let produce = produce(9, &[("s.orders", one.concat())]);
    assert!(!produce_passes(&produce, 9, &under, &known, Instant::now()));
}

#[test]
fn a_produce_passes_when_its_vouchable_topics_are_vouched_for_every_version() {
    let good = batch(&[framed(7, b"{}"), framed(7, b"{}")]);
    let bad = batch(&[framed(7, b"{}"), framed(8, b"{}")]);
    let v = vouching();
    let now = Instant::now();
    for version in 3..=13 {
        let known = vouched(&v, "s.orders", &[7], 60_000);
        let frame = produce(version, &[("s.orders", good.clone()), ("logs", bad.clone())]);
        assert!(produce_passes(&frame, version, &v, &known, now), "v{version}: logs is no rule's");
        let frame = produce(version, &[("s.orders", bad.clone())]);
        assert!(!produce_passes(&frame, version, &v, &known, now), "v{version}: id 8");
        let frame = produce(version, &[("s.orders", good.clone()), ("s.masked", good.clone())]);
        assert!(!produce_passes(&frame, version, &v, &known, now), "v{version}: another rule acts on s.masked");
        let frame = produce(version, &[("s.payments", good.clone())]);
        assert!(!produce_passes(&frame, version, &v, &known, now), "v{version}: nothing vouched for s.payments");
        let frame = produce(version, &[("s.orders", good.clone())]);
        assert!(!produce_passes(&frame, version, &v, &known, now + Duration::from_secs(61)), "v{version}: expired");
        for cut in 0..frame.len() {
            assert!(!produce_passes(&frame[..cut], version, &v, &known, now), "v{version} cut at {cut}");
        }
        let mut longer = frame.clone();
        longer.push(0);
        assert!(!produce_passes(&longer, version, &v, &known, now), "v{version}: trailing bytes");
    }
}

#[test]
fn a_fetch_answer_passes_when_every_fetched_record_is_vouched_for() {
    let good = [batch(&[framed(7, b"{}")]), control_batch()].concat();
    let bad = batch(&[framed(8, b"{}")]);
    let v = vouching();
    let now = Instant::now();
    let known = vouched(&v, "s.orders", &[7], 60_000);
    for version in 4..=18 {
        let frame = fetch(version, &[("s.orders", good.clone()), ("logs", bad.clone())], true);
        assert!(fetch_passes(&frame, version, &v, &known, now), "v{version}");
        let frame = fetch(version, &[("s.orders", bad.clone())], false);
        assert!(!fetch_passes(&frame, version, &v, &known, now), "v{version}: id 8");
        let frame = fetch(version, &[("s.masked", good.clone())], false);
        assert!(!fetch_passes(&frame, version, &v, &known, now), "v{version}: s.masked");
        // The broker slices the log by bytes: a last batch cut short is dropped by the
        // consumer (and fetched again whole), so it passes; a Produce's would not.
        let sliced = [good.clone(), batch(&[framed(8, b"{}")])[..70].to_vec()].concat();
        let frame = fetch(version, &[("s.orders", sliced.clone())], false);
        assert!(fetch_passes(&frame, version, &v, &known, now), "v{version}: a cut last batch");
        let frame = produce(version.min(13), &[("s.orders", sliced)]);
        assert!(!produce_passes(&frame, version.min(13), &v, &known, now), "v{version}: a cut Produce batch");
        let frame = fetch(version, &[("s.orders", good.clone())], false);
        for cut in 0..frame.len() {
            assert!(!fetch_passes(&frame[..cut], version, &v, &known, now), "v{version} cut at {cut}");
        }
    }
}

#[test]
fn vouches_are_bounded_and_capped_in_time() {
    let mut known = Vouched::default();
    let now = Instant::now();
    let many: Vec<Vouch> = (0..1000).map(|i| Vouch { topic: format!("s.t{i}"), ids: (0..500).collect(), ttl_ms: u64::MAX, schemas: vec![] }).collect();
    let v = vouching();
    known.learn(many, &v, now);
    let good = batch(&[framed(7, b"{}")]);
    let frame = produce(9, &[("s.t999", good.clone())]);
    assert!(produce_passes(&frame, 9, &v, &known, now), "the latest vouches are kept");
    assert!(!produce_passes(&frame, 9, &v, &known, now + Duration::from_secs(6)), "5 s at most, whatever the service says");
    let beyond = batch(&[framed(100, b"{}")]);
    assert!(!produce_passes(&produce(9, &[("s.t999", beyond)]), 9, &v, &known, now), "64 ids a topic at most");
}

/// Produce of `s.*`: selected, with vouching; everything else forwarded.
struct Schemas(Arc<Vouching>);

impl RequestPolicy for Schemas {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key == 0 {
            Disposition::Select { fail_open: false, selector: self.0.selector.clone(), vouching: Some(self.0.clone()) }
        } else {
            Disposition::Forward
        }
    }
}

#[test]
fn a_session_hands_off_until_the_service_vouches_then_forwards_what_it_vouched_for() {
    let mut s = Session::with_policy(SessionLimits::default(), Schemas(vouching()));
    let good = produce(9, &[("s.orders", batch(&[framed(7, b"{}")]))]);
    let other_id = produce(9, &[("s.orders", batch(&[framed(9, b"{}")]))]);
    // First: handed off; the service forwards it and vouches for id 7.
    let mut out = Output::default();
    s.feed_requests(&good, &mut out).unwrap();
    let handoffs = s.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].direction, Direction::Request);
    s.resolve(handoffs[0].id, Resolution::Request {
        forward: good.clone(), answer: None, want_response: false,
        vouched: vec![Vouch { topic: "s.orders".into(), ids: vec![7], ttl_ms: 60_000, schemas: vec![] }],
    }).unwrap();
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert_eq!(bytes_of(&[], &out), good);
    // Then: the same ids pass without a hand-off, byte for byte, in order.
    for split in [1, 50, good.len() - 1] {
        let mut forwarded = Vec::new();
        for chunk in [&good[..split], &good[split..]] {
            let mut out = Output::default();
            s.feed_requests(chunk, &mut out).unwrap();
            forwarded.extend(bytes_of(chunk, &out));
        }
        assert_eq!(forwarded, good, "split at {split}");
        assert!(s.take_handoffs().is_empty());
    }
    assert_eq!(s.stats.get(Counter::HandoffVouched), 3);
    // Another id: handed off again (the service decides).
    let mut out = Output::default();
    s.feed_requests(&other_id, &mut out).unwrap();
    assert_eq!(s.take_handoffs().len(), 1);
    assert!(out.is_empty());
}


fn vouch_for(ids: &[u32]) -> Vec<Vouch> {
    vec![Vouch { topic: "s.orders".into(), ids: ids.to_vec(), ttl_ms: 60_000, schemas: vec![] }]
}

/// `count` Produce requests to `s.orders`, each one record of id 7 (payloads differ).
fn id_7_produces(count: usize) -> Vec<Vec<u8>> {
    (0..count).map(|i| produce(9, &[("s.orders", batch(&[framed(7, format!("{i}").as_bytes())]))])).collect()
}

/// Feeds `frames` in one go: none may leave yet (they wait behind a hand-off).
fn feed_waiting(s: &mut Session<Schemas>, frames: &[&Vec<u8>]) {
    for frame in frames {
        let mut out = Output::default();
        s.feed_requests(frame, &mut out).unwrap();
        assert!(bytes_of(frame, &out).is_empty(), "nothing overtakes the handed-off request");
    }
}

#[test]
fn produce_requests_behind_a_handed_off_one_wait_for_its_vouches_instead_of_crossing_too() {
    let mut s = Session::with_policy(SessionLimits::default(), Schemas(vouching()));
    let first = produce(9, &[("s.orders", batch(&[framed(7, b"{\"a\":1}")]))]);
    let second = produce(9, &[("s.orders", batch(&[framed(7, b"{\"a\":2}")]))]);
    let third = produce(9, &[("s.orders", batch(&[framed(7, b"{\"a\":3}")]))]);
    let other_id = produce(9, &[("s.orders", batch(&[framed(9, b"{}")]))]);
    let mut out = Output::default();
    s.feed_requests(&first, &mut out).unwrap();
    let handoffs = s.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    // Pipelined behind it before its answer (a new topic, or a vouch that just expired):
    // they wait for that answer rather than cross to the service too.
    feed_waiting(&mut s, &[&second, &third, &other_id]);
    assert!(s.take_handoffs().is_empty());
    assert!(s.handoff_bytes_awaiting_answers() >= first.len() + second.len() + third.len() + other_id.len());
    s.resolve(handoffs[0].id, Resolution::Request {
        forward: first.clone(), answer: None, want_response: false, vouched: vouch_for(&[7]),
    }).unwrap();
    // The vouch passes two of them; the third has another id: the service decides it.
    let later = s.take_handoffs();
    assert_eq!(later.len(), 1);
    assert_eq!(later[0].frame.as_ref(), other_id.as_slice());
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert_eq!(bytes_of(&[], &out), [first.clone(), second.clone(), third.clone()].concat());
    s.resolve(later[0].id, Resolution::Request {
        forward: other_id.clone(), answer: None, want_response: false, vouched: vec![],
    }).unwrap();
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert_eq!(bytes_of(&[], &out), other_id);
    assert_eq!((s.stats.get(Counter::HandoffRequests), s.stats.get(Counter::HandoffVouched)), (2, 2));
    assert_eq!(s.handoff_bytes_awaiting_answers(), 0);
}

#[test]
fn requests_that_waited_for_an_answer_that_failed_are_handed_off_in_order() {
    let mut s = Session::with_policy(SessionLimits::default(), Schemas(vouching()));
    let frames = id_7_produces(3);
    let mut out = Output::default();
    s.feed_requests(&frames[0], &mut out).unwrap();
    let first = s.take_handoffs();
    feed_waiting(&mut s, &[&frames[1], &frames[2]]);
    s.resolve(first[0].id, Resolution::Failed(Failure::Timeout)).unwrap();
    // Fail-closed: the first is answered with a retriable error; the others go to the
    // service, in order, as they would have without waiting.
    let later = s.take_handoffs();
    assert_eq!(later.iter().map(|h| h.frame.to_vec()).collect::<Vec<_>>(), frames[1..].to_vec());
    assert!(later[0].id < later[1].id);
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert!(bytes_of(&[], &out).is_empty(), "the failed request never reaches the broker");
    for (h, frame) in later.iter().zip(&frames[1..]) {
        s.resolve(h.id, Resolution::Request { forward: frame.clone(), answer: None, want_response: false, vouched: vec![] })
            .unwrap();
    }
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert_eq!(bytes_of(&[], &out), frames[1..].concat());
}

#[test]
fn once_an_answer_vouches_for_nothing_requests_are_handed_off_as_they_come() {
    let mut s = Session::with_policy(SessionLimits::default(), Schemas(vouching()));
    let frames = id_7_produces(4);
    let mut out = Output::default();
    s.feed_requests(&frames[0], &mut out).unwrap();
    let first = s.take_handoffs();
    feed_waiting(&mut s, &[&frames[1]]);
    // Its payload kind is not one keg's filter checks (Avro, say): no vouch comes.
    s.resolve(first[0].id, Resolution::Request { forward: frames[0].clone(), answer: None, want_response: false, vouched: vec![] })
        .unwrap();
    assert_eq!(s.take_handoffs().len(), 1, "the one that waited goes to the service");
    // From then on requests are pipelined to the service, none waits for an answer.
    feed_waiting(&mut s, &[&frames[2], &frames[3]]);
    assert_eq!(s.take_handoffs().len(), 2);
}

#[test]
fn compressed_batches_are_read_with_every_codec_within_the_budget() {
    let values: Vec<Option<Bytes>> = (0..50).map(|i| framed(7, format!("{{\"order\":{i}}}").as_bytes())).collect();
    let mut bad = values.clone();
    bad[49] = framed(8, b"{}");
    for codec in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
        let good = batch_with(&values, codec);
        assert_eq!(good[22] & 7, codec as u8, "{codec:?}");
        let mut left = budget();
        assert!(records_pass(&good, &Allowed::ids(&[7]), &mut left, Tail::Malformed), "{codec:?}");
        assert!(left.inflated < budget().inflated, "{codec:?}: the budget pays for what was decompressed");
        assert!(!records_pass(&batch_with(&bad, codec), &Allowed::ids(&[7]), &mut budget(), Tail::Malformed), "{codec:?}: id 8");
        assert!(!records_pass(&good, &Allowed::ids(&[7]), &mut Budget { inflated: 100, ..Budget::frame() }, Tail::Malformed), "{codec:?}: past the budget");
        let mut corrupt = good.clone();
        let last = corrupt.len() - 3;
        corrupt[last] ^= 0x55;
        corrupt[70] ^= 0x55;
        // A payload that does not decompress is not read (gzip checks a CRC); one that
        // decompresses to other bytes is read as those (the broker checks the batch CRC).
        let read = records_pass(&corrupt, &Allowed::ids(&[7]), &mut budget(), Tail::Malformed);
        assert!(!read || codec != Compression::Gzip, "{codec:?}: corrupt");
        // The last batch's payload cut short (its length says so): not read.
        let last = last_batch(&good);
        let mut cut = good.clone();
        cut.truncate(good.len() - 20);
        let length = (cut.len() - last - 12) as i32;
        cut[last + 8..last + 12].copy_from_slice(&length.to_be_bytes());
        assert!(!records_pass(&cut, &Allowed::ids(&[7]), &mut budget(), Tail::Malformed), "{codec:?}: cut short");
    }
    // Raw snappy (librdkafka's framing; kafka-protocol writes xerial's).
    let plain = batch(&values);
    let raw = snap::raw::Encoder::new().compress_vec(&plain[61..]).unwrap();
    let mut librdkafka = plain[..61].to_vec();
    librdkafka[22] |= Compression::Snappy as u8;
    librdkafka.extend(raw);
    let length = (librdkafka.len() - 12) as i32;
    librdkafka[8..12].copy_from_slice(&length.to_be_bytes());
    assert!(records_pass(&librdkafka, &Allowed::ids(&[7]), &mut budget(), Tail::Malformed));
}

#[test]
fn a_decompression_bomb_costs_the_budget_and_is_handed_off() {
    // One record whose value is zeros past the budget: magic 0, schema id 0, then zeros.
    let bomb = batch_with(&[Some(Bytes::from(vec![0u8; budget().inflated + (1 << 20)]))], Compression::Zstd);
    assert!(bomb.len() < 100_000, "{} bytes", bomb.len());
    assert!(!records_pass(&bomb, &Allowed::ids(&[0]), &mut budget(), Tail::Malformed));
    let small = batch_with(&[Some(Bytes::from(vec![0u8; 1 << 20]))], Compression::Zstd);
    assert!(records_pass(&small, &Allowed::ids(&[0]), &mut budget(), Tail::Malformed));
}

/// Fetch of `s.*`: selected, with vouching.
struct FetchSchemas(Arc<Vouching>);

impl RequestPolicy for FetchSchemas {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key == 1 {
            Disposition::Select { fail_open: false, selector: self.0.selector.clone(), vouching: Some(self.0.clone()) }
        } else {
            Disposition::Forward
        }
    }
}

fn fetch_request_of(correlation_id: i32, version: i16, topics: &[&str]) -> Vec<u8> {
    fetch_request_in(correlation_id, version, -1, topics)
}

fn fetch_request(correlation_id: i32) -> Vec<u8> {
    fetch_request_of(correlation_id, 12, &["s.orders"])
}

#[test]
fn a_fetch_request_passes_when_every_selected_topic_is_vouched_for_every_version() {
    let v = vouching();
    let known = vouched(&v, "s.orders", &[7], 60_000);
    let now = Instant::now();
    for version in 4..=18 {
        let passes = |topics: &[&str]| fetch_request_passes(&fetch_request_of(1, version, topics), version, &v, &known, now);
        assert!(passes(&["s.orders"]), "v{version}");
        assert!(passes(&["logs", "s.orders"]), "v{version}: logs is no rule's");
        assert!(!passes(&["s.orders", "s.payments"]), "v{version}: nothing vouched for s.payments");
        assert!(!passes(&["s.masked"]), "v{version}: another rule acts on s.masked");
        let frame = fetch_request_of(1, version, &["s.orders"]);
        assert!(!fetch_request_passes(&frame, version, &v, &known, now + Duration::from_secs(61)), "v{version}: expired");
        assert!(!fetch_request_passes(&frame, version, &vouching(), &known, now), "v{version}: another table");
        // Cut inside its topics (what follows them, forgotten topics and rack id, at most
        // 6 bytes here, is not read).
        for cut in 0..frame.len() - 6 {
            assert!(!fetch_request_passes(&frame[..cut], version, &v, &known, now), "v{version} cut at {cut}");
        }
    }
}

/// Feeds one Fetch request and returns what reached the broker; a hand-off of it is
/// answered "forward, and hand me the answer". Whether it was handed off.
fn fetch_round(s: &mut Session<FetchSchemas>, correlation_id: i32) -> bool {
    let request = fetch_request(correlation_id);
    let mut out = Output::default();
    s.feed_requests(&request, &mut out).unwrap();
    let mut forwarded = bytes_of(&request, &out);
    let handoffs = s.take_handoffs();
    for h in &handoffs {
        s.resolve(h.id, Resolution::Request { forward: request.clone(), answer: None, want_response: true, vouched: vec![] })
            .unwrap();
        let mut out = Output::default();
        s.ready_requests(&mut out);
        forwarded.extend(bytes_of(&[], &out));
    }
    assert_eq!(forwarded, request, "the request reaches the broker once, unchanged");
    !handoffs.is_empty()
}

fn fetch_answer_of(correlation_id: i32, ids: &[u32]) -> Vec<u8> {
    let values: Vec<_> = ids.iter().map(|&id| framed(id, b"{}")).collect();
    fetch_answer(correlation_id, 12, &[("s.orders", batch(&values))], false)
}

/// Feeds a broker answer; returns what reached the client at once, and the hand-offs.
fn answer_round(s: &mut Session<FetchSchemas>, answer: &[u8]) -> (Vec<u8>, Vec<keg_kafka_filter::core::HandOff>) {
    let routes = routes();
    let mut out = Output::default();
    s.feed_responses(answer, view(&routes), &mut out).unwrap();
    (bytes_of(answer, &out), s.take_handoffs())
}

fn drain_responses(s: &mut Session<FetchSchemas>) -> Vec<u8> {
    let mut out = Output::default();
    s.ready_responses(&mut out);
    bytes_of(&[], &out)
}

#[test]
fn a_session_passes_fetches_and_answers_whose_ids_the_service_vouched_for() {
    let mut s = Session::with_policy(SessionLimits::default(), FetchSchemas(vouching()));
    // First: the request and its answer go to the service, which vouches for id 7.
    assert!(fetch_round(&mut s, 21));
    let first = fetch_answer_of(21, &[7, 7]);
    let (now, handoffs) = answer_round(&mut s, &first);
    assert!(now.is_empty());
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].direction, Direction::Response);
    s.resolve(handoffs[0].id, Resolution::Response {
        answer: first.clone(), vouched: vec![Vouch { topic: "s.orders".into(), ids: vec![7], ttl_ms: 60_000, schemas: vec![] }],
    }).unwrap();
    assert_eq!(drain_responses(&mut s), first);
    // Second: neither the request nor its answer leaves Envoy.
    assert!(!fetch_round(&mut s, 22), "a Fetch of vouched topics goes to the broker at once");
    let second = fetch_answer_of(22, &[7]);
    let (now, handoffs) = answer_round(&mut s, &second);
    assert!(handoffs.is_empty());
    assert_eq!(now, second);
    assert_eq!(s.stats.get(Counter::HandoffVouched), 2);
}

#[test]
fn an_answer_that_does_not_pass_goes_to_the_service_after_its_replayed_request() {
    let mut s = Session::with_policy(SessionLimits::default(), FetchSchemas(vouching()));
    assert!(fetch_round(&mut s, 1));
    let (_, handoffs) = answer_round(&mut s, &fetch_answer_of(1, &[7]));
    s.resolve(handoffs[0].id, Resolution::Response {
        answer: fetch_answer_of(1, &[7]), vouched: vec![Vouch { topic: "s.orders".into(), ids: vec![7], ttl_ms: 60_000, schemas: vec![] }],
    }).unwrap();
    drain_responses(&mut s);
    let replayed = |s: &mut Session<FetchSchemas>, cid: i32| {
        assert!(!fetch_round(s, cid));
        let (now, handoffs) = answer_round(s, &fetch_answer_of(cid, &[7, 8]));
        assert!(now.is_empty(), "the answer keeps its place");
        assert_eq!(handoffs.len(), 1, "the request first");
        assert_eq!(handoffs[0].direction, Direction::Request);
        assert_eq!(&handoffs[0].frame[..], &fetch_request(cid)[..]);
        handoffs[0].id
    };
    // The reply asks for the answer: it is handed off, and the service's goes out.
    let id = replayed(&mut s, 2);
    s.resolve(id, Resolution::Request { forward: fetch_request(2), answer: None, want_response: true, vouched: vec![] }).unwrap();
    let handoffs = s.take_handoffs();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0].direction, Direction::Response);
    assert_eq!(&handoffs[0].frame[..], &fetch_answer_of(2, &[7, 8])[..]);
    assert!(drain_responses(&mut s).is_empty());
    let filtered = fetch_answer_of(2, &[7]);
    s.resolve(handoffs[0].id, Resolution::Response { answer: filtered.clone(), vouched: vec![] }).unwrap();
    assert_eq!(drain_responses(&mut s), filtered);
    // The reply does not ask for it (the rules changed): the broker's answer goes as it came.
    let id = replayed(&mut s, 3);
    s.resolve(id, Resolution::Request { forward: fetch_request(3), answer: None, want_response: false, vouched: vec![] }).unwrap();
    assert!(s.take_handoffs().is_empty());
    assert_eq!(drain_responses(&mut s), fetch_answer_of(3, &[7, 8]));
    // The service answers the request itself (a rule refuses it now): that answer goes.
    let id = replayed(&mut s, 4);
    let own = fetch_answer(4, 12, &[], false);
    s.resolve(id, Resolution::Request { forward: vec![], answer: Some(own.clone()), want_response: false, vouched: vec![] }).unwrap();
    assert_eq!(drain_responses(&mut s), own);
    assert_eq!(s.in_flight(), 0);
    // No reply, fail-closed: the broker's answer goes without its records, each partition
    // NOT_LEADER_OR_FOLLOWER (the consumer fetches again), and no fetch session.
    let id = replayed(&mut s, 5);
    s.resolve(id, Resolution::Failed(Failure::Timeout)).unwrap();
    let (correlation, refused): (i32, FetchResponse) = decode_response(ApiKey::Fetch, 12, &drain_responses(&mut s));
    assert_eq!((correlation, refused.session_id), (5, 0));
    let partitions: Vec<_> = refused.responses.iter().flat_map(|t| &t.partitions).collect();
    assert!(!partitions.is_empty());
    assert!(partitions.iter().all(|p| p.error_code == NOT_LEADER_OR_FOLLOWER
        && p.records.as_ref().is_some_and(|r| r.is_empty())));
    assert_eq!(s.stats.get(Counter::HandoffRetriableErrors), 1);
}

#[test]
fn a_new_interest_table_drops_every_vouch() {
    let v = vouching();
    let known = vouched(&v, "s.orders", &[7], 60_000);
    let frame = produce(9, &[("s.orders", batch(&[framed(7, b"{}")]))]);
    let now = Instant::now();
    assert!(produce_passes(&frame, 9, &v, &known, now));
    // The same selectors in a new table (a rule changed elsewhere): the old rules' word
    // does not carry over.
    assert!(!produce_passes(&frame, 9, &vouching(), &known, now));
    let mut known = known;
    let newer = vouching();
    known.learn(vec![Vouch { topic: "s.payments".into(), ids: vec![7], ttl_ms: 60_000, schemas: vec![] }], &newer, now);
    assert!(!produce_passes(&frame, 9, &newer, &known, now), "s.orders was vouched under the old table");
}

#[test]
fn hand_off_messages_name_topic_ids_and_replies_carry_vouches() {
    use keg_kafka_filter::handoff::proto::{message, resolution, ProcessingResponse, NAMESPACE};
    use prost_types::value::Kind;
    use prost_types::{ListValue, Struct, Value};
    let id = topic_id("s.named");
    for (api_key, frame) in [(0, produce(13, &[("s.named", batch(&[framed(7, b"{}")]))])),
                             (1, fetch_request_of(1, 13, &["s.named", "logs"]))] {
        let h = keg_kafka_filter::core::HandOff {
            id: 1, direction: Direction::Request, frame: Bytes::from(frame), api_key, api_version: 13,
            principal: None, security_protocol: "PLAINTEXT",
        };
        let m = message(&h);
        let keg = &m.metadata.unwrap().filter_metadata[NAMESPACE];
        let Some(Kind::StructValue(ids)) = &keg.fields["topic_ids"].kind else { panic!("{keg:?}") };
        let hex: String = id.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(ids.fields[&hex].kind, Some(Kind::StringValue("s.named".into())), "api {api_key}");
    }
    // keg.vouched in a reply: well-formed entries kept, the others left out.
    let text = |s: &str| Value { kind: Some(Kind::StringValue(s.into())) };
    let number = |n: f64| Value { kind: Some(Kind::NumberValue(n)) };
    let list = |v: Vec<Value>| Value { kind: Some(Kind::ListValue(ListValue { values: v })) };
    let object = |f: Vec<(&str, Value)>| Value { kind: Some(Kind::StructValue(Struct {
        fields: f.into_iter().map(|(k, v)| (k.to_string(), v)).collect() })) };
    let vouched = list(vec![
        object(vec![("topic", text("s.a")), ("ids", list(vec![number(7.0), number(9.0)])), ("ttl_ms", number(800.0))]),
        object(vec![("topic", text("s.b")), ("ids", list(vec![number(-1.0)])), ("ttl_ms", number(800.0))]),
        object(vec![("topic", text("s.c")), ("ids", list(vec![number(1.5)])), ("ttl_ms", number(800.0))]),
        object(vec![("topic", text("s.d")), ("ttl_ms", number(800.0))]),
        object(vec![("topic", text("s.e")), ("ids", list(vec![number(7.0), number(8.0), number(9.0)])), ("ttl_ms", number(800.0)),
                    ("json_schemas", object(vec![("7", text(ORDER)), ("8", text(r#"{"type": 5}"#)), ("x", text(ORDER))]))]),
        text("not an object"),
    ]);
    let reply = ProcessingResponse {
        dynamic_metadata: Some(Struct { fields: [(NAMESPACE.to_string(), object(vec![("vouched", vouched)]))].into_iter().collect() }),
        ..Default::default()
    };
    let Resolution::Response { vouched, .. } = resolution(Direction::Response, reply) else { panic!() };
    assert_eq!(vouched, vec![
        Vouch { topic: "s.a".into(), ids: vec![7, 9], ttl_ms: 800, schemas: vec![] },
        // Id 8's schema does not compile: the id is left out, not passed on its id alone.
        Vouch { topic: "s.e".into(), ids: vec![7, 9], ttl_ms: 800, schemas: vec![(7, order_schema())] },
    ]);
}
