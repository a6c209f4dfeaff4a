use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, FetchRequest, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use uuid::Uuid;

use super::*;

fn selector(json: serde_json::Value) -> TopicSelector {
    TopicSelector::parse(json).unwrap()
}

fn payments() -> TopicSelector {
    selector(serde_json::json!({"exact": ["payments"], "prefix": ["secret."], "regex": [r"pii\.[a-z]+"]}))
}

fn frame(key: ApiKey, version: i16, message: &impl Encodable) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(key as i16).with_request_api_version(version)
        .with_correlation_id(7).with_client_id(Some(StrBytes::from_static_str("app")))
        .encode(&mut buf, key.request_header_version(version)).unwrap();
    message.encode(&mut buf, version).unwrap();
    let mut frame = (buf.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    frame
}

/// A Produce request naming `topics` (ids from v13), each with two partitions of records.
fn produce(version: i16, topics: &[(&str, Uuid)]) -> Vec<u8> {
    let data = topics.iter().map(|(name, id)| {
        let mut topic = TopicProduceData::default().with_partition_data(vec![
            PartitionProduceData::default().with_index(0).with_records(Some(Bytes::from(vec![0xab; 300]))),
            PartitionProduceData::default().with_index(1).with_records(None),
        ]);
        if version >= 13 {
            topic = topic.with_topic_id(*id);
        } else {
            topic = topic.with_name(TopicName(StrBytes::from_string(name.to_string())));
        }
        topic
    }).collect();
    let request = ProduceRequest::default().with_acks(-1).with_timeout_ms(1000)
        .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(StrBytes::from_static_str("tx-1")))).with_topic_data(data);
    frame(ApiKey::Produce, version, &request)
}

fn fetch(version: i16, epoch: i32, topics: &[(&str, Uuid)]) -> Vec<u8> {
    let data = topics.iter().map(|(name, id)| {
        let topic = FetchTopic::default().with_partitions(vec![FetchPartition::default().with_partition(0),
                                                                FetchPartition::default().with_partition(1)]);
        if version >= 13 { topic.with_topic_id(*id) } else { topic.with_topic(TopicName(StrBytes::from_string(name.to_string()))) }
    }).collect();
    let mut request = FetchRequest::default().with_max_wait_ms(500).with_topics(data);
    if version >= 7 {
        request = request.with_session_id(if epoch == -1 { 0 } else { 42 }).with_session_epoch(epoch);
    }
    frame(ApiKey::Fetch, version, &request)
}

fn decide(api_key: i16, version: i16, frame: &[u8], selector: &TopicSelector) -> Selection {
    select(api_key, version, frame, frame.len(), selector)
}

/// An id no other test uses (the map is process-wide and tests run in parallel).
fn fresh_id() -> Uuid {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    Uuid::from_u64_pair(0x6b65_675f_7465_7374, NEXT.fetch_add(1, Ordering::Relaxed))
}

fn known(name: &str) -> Uuid {
    let id = fresh_id();
    learn_topic_id(*id.as_bytes(), name);
    id
}

#[test]
fn selectors_match_exact_names_prefixes_and_whole_patterns() {
    let s = payments();
    assert!(s.selects(b"payments") && s.selects(b"secret.x") && s.selects(b"pii.emails"));
    assert!(!s.selects(b"payments2") && !s.selects(b"orders") && !s.selects(b"xpii.a"));
    assert!(!s.selects(b"pii.a.b"), "a pattern matches the whole name");
    assert!(s.selects(&[0xff, 0xfe]), "a name that is not UTF-8 is handed off");
    assert!(s.selects("ordérs".as_bytes()), "nor is one that is not ASCII (no valid topic is)");
    let none = selector(serde_json::json!({}));
    assert!(!none.selects(b"payments"));
}

#[test]
fn the_python_sides_portable_patterns_compile() {
    // The escapes and forms ext_proc.filters.portable_regex lets through.
    for pattern in [r"a\.b", r"a\-b", r"a\_b", r"a\\b", r"\*\+\?\(\)\[\]\{\}\|\^\$\/", r"\d+\w*\D\W",
                    r"(?i)pay.*", r"(?i:x)y", r"(?:a|b){2,10}", r"[]a]", r"[^]a]", r"[a\]b]", r"x{0,100}"] {
        assert!(TopicSelector::parse(serde_json::json!({"regex": [pattern]})).is_ok(), "{pattern}");
    }
    let s = selector(serde_json::json!({"regex": [r"(?i)PAY.*", r"orders-\d+"]}));
    assert!(s.selects(b"payments") && s.selects(b"orders-12") && !s.selects(b"orders-x"));
}

#[test]
fn a_pattern_that_does_not_compile_refuses_the_table() {
    let err = TopicSelector::parse(serde_json::json!({"regex": [r"\Qa.b\E"]})).unwrap_err();
    assert!(err.contains("does not compile"), "{err}");
    let err = TopicSelector::parse(serde_json::json!({"regex": ["(a"]})).unwrap_err();
    assert!(err.contains("does not compile"), "{err}");
    let err = TopicSelector::parse(serde_json::json!({"exact": ["a"], "topics": []})).unwrap_err();
    assert!(err.contains("unknown field"), "{err}");
    assert!(TopicSelector::parse(serde_json::json!({"exact": "a"})).is_err());
}

#[test]
fn produce_requests_are_handed_off_when_a_topic_is_selected() {
    let s = payments();
    for version in 3..=12 {
        let nil = Uuid::nil();
        assert_eq!(decide(0, version, &produce(version, &[("orders", nil)]), &s), Selection::Pass, "v{version}");
        assert_eq!(decide(0, version, &produce(version, &[("payments", nil)]), &s), Selection::HandOff, "v{version}");
        assert_eq!(decide(0, version, &produce(version, &[("orders", nil), ("logs", nil), ("secret.k", nil)]), &s),
                   Selection::HandOff, "v{version}: the last of three");
        assert_eq!(decide(0, version, &produce(version, &[("orders", nil), ("logs", nil)]), &s), Selection::Pass);
        assert_eq!(decide(0, version, &produce(version, &[]), &s), Selection::Pass, "no topics");
    }
}

#[test]
fn produce_v13_names_topics_by_the_ids_metadata_taught() {
    let s = payments();
    let (orders, pay) = (known("orders"), known("payments"));
    assert_eq!(decide(0, 13, &produce(13, &[("", orders)]), &s), Selection::Pass);
    assert_eq!(decide(0, 13, &produce(13, &[("", orders), ("", pay)]), &s), Selection::HandOff);
    assert_eq!(decide(0, 13, &produce(13, &[("", fresh_id())]), &s), Selection::HandOff, "an id never seen");
    assert_eq!(decide(0, 13, &produce(13, &[("", orders), ("", fresh_id())]), &s), Selection::HandOff);
}

#[test]
fn fetch_requests_pass_when_full_and_are_judged_by_their_answer_when_incremental() {
    let s = payments();
    let (orders, pay) = (known("orders"), known("payments"));
    for version in 4..=18 {
        let (o, p) = (("orders", orders), ("payments", pay));
        assert_eq!(decide(1, version, &fetch(version, -1, &[o]), &s), Selection::Pass, "v{version}");
        assert_eq!(decide(1, version, &fetch(version, -1, &[o, p]), &s), Selection::HandOff, "v{version}");
        if version >= 7 {
            assert_eq!(decide(1, version, &fetch(version, 0, &[o]), &s), Selection::Pass, "v{version}: a new session");
            // An incremental fetch is answered with records of partitions it need not
            // name: one naming no selected topic goes on, and its answer decides.
            assert_eq!(decide(1, version, &fetch(version, 3, &[o]), &s), Selection::ByAnswer, "v{version}");
            assert_eq!(decide(1, version, &fetch(version, 3, &[]), &s), Selection::ByAnswer, "v{version}");
            assert_eq!(decide(1, version, &fetch(version, 3, &[o, p]), &s), Selection::HandOff, "v{version}");
        }
    }
    assert_eq!(decide(1, 13, &fetch(13, -1, &[("", fresh_id())]), &s), Selection::HandOff);
}

#[test]
fn versions_the_walk_does_not_know_are_handed_off() {
    let s = payments();
    let frame = produce(9, &[("orders", Uuid::nil())]);
    for version in [0, 2, 14, 200] {
        assert_eq!(decide(0, version, &frame, &s), Selection::HandOff, "v{version}");
    }
    assert_eq!(decide(1, 3, &frame, &s), Selection::HandOff);
    assert_eq!(decide(3, 9, &frame, &s), Selection::HandOff, "another API");
    assert!(readable(0, 3) && readable(0, 13) && !readable(0, 14) && readable(1, 18) && !readable(1, 19));
}

#[test]
fn a_frame_split_anywhere_needs_more_until_it_can_decide_and_never_passes_early() {
    let s = payments();
    let ids = [("", known("orders")), ("", known("payments"))];
    let cases = [
        (0, 9, produce(9, &[("orders", Uuid::nil()), ("payments", Uuid::nil())]), Selection::HandOff),
        (0, 8, produce(8, &[("orders", Uuid::nil()), ("logs", Uuid::nil())]), Selection::Pass),
        (0, 13, produce(13, &ids), Selection::HandOff),
        (1, 12, fetch(12, -1, &[("orders", Uuid::nil()), ("logs", Uuid::nil())]), Selection::Pass),
        (1, 16, fetch(16, 0, &ids), Selection::HandOff),
        (1, 17, fetch(17, 5, &[("", known("orders")), ("", known("logs"))]), Selection::ByAnswer),
        (1, 11, fetch(11, 5, &[("orders", Uuid::nil()), ("logs", Uuid::nil())]), Selection::ByAnswer),
    ];
    for (key, version, frame, whole) in cases {
        assert_eq!(decide(key, version, &frame, &s), whole);
        let mut decided = false;
        for cut in 0..frame.len() {
            match select(key, version, &frame[..cut], frame.len(), &s) {
                Selection::NeedMore => assert!(!decided, "v{version}: undecided again at {cut}"),
                found => {
                    assert_eq!(found, whole, "{key} v{version} cut at {cut}");
                    decided = true;
                }
            }
        }
    }
}

#[test]
fn truncated_or_garbage_frames_are_handed_off_never_a_panic() {
    let s = payments();
    let frame = produce(9, &[("orders", Uuid::nil()), ("logs", Uuid::nil())]);
    for cut in 0..frame.len() {
        // The size prefix says the frame ends here: short means malformed.
        let truncated = &frame[..cut];
        assert_ne!(select(0, 9, truncated, truncated.len(), &s), Selection::NeedMore);
        // Cut before the last name ends: no decision but a hand-off. (Cut after it, the
        // frame passes: the broker refuses what it cannot read, no record is written.)
        let last_name_ends = frame.windows(4).rposition(|w| w == b"logs").unwrap() + 4;
        if cut < last_name_ends {
            assert_eq!(select(0, 9, truncated, truncated.len(), &s), Selection::HandOff, "cut at {cut}");
        }
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 200) as usize;
        let garbage: Vec<u8> = (0..len).map(|i| (seed >> (i % 56)) as u8).collect();
        for (key, version) in [(0, 3), (0, 9), (0, 13), (1, 4), (1, 12), (1, 17)] {
            let _ = select(key, version, &garbage, garbage.len() + (seed % 3) as usize, &s);
        }
    }
    // A null topic array, a negative string length, a huge varint: handed off.
    let mut null_topics = produce(7, &[]);
    let at = null_topics.len() - 4;
    null_topics[at..].copy_from_slice(&(-1i32).to_be_bytes());
    assert_eq!(decide(0, 7, &null_topics, &s), Selection::HandOff);
    let mut huge = produce(9, &[]);
    huge.truncate(huge.len() - 2); // the compact topic count and the tagged fields
    huge.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0x00]);
    assert_eq!(decide(0, 9, &huge, &s), Selection::HandOff);
}

#[test]
fn too_many_topics_are_handed_off_instead_of_walked() {
    let s = payments();
    let names: Vec<String> = (0..=MAX_TOPICS).map(|i| format!("t{i}")).collect();
    let topics: Vec<(&str, Uuid)> = names.iter().map(|n| (n.as_str(), Uuid::nil())).collect();
    assert_eq!(decide(0, 9, &produce(9, &topics), &s), Selection::HandOff);
    assert_eq!(decide(0, 9, &produce(9, &topics[..10]), &s), Selection::Pass);
}

#[test]
fn the_topic_id_map_keeps_what_it_learned_and_ignores_nil_ids() {
    learn_topic_id([0; 16], "nil");
    assert!(topic_name(&[0; 16]).is_none());
    let id = *fresh_id().as_bytes();
    learn_topic_id(id, "first");
    learn_topic_id(id, "second");
    assert_eq!(topic_name(&id).as_deref(), Some("first"));
}

#[test]
fn only_bounded_produce_requests_are_for_kafka_protocol_to_decode() {
    for version in 3..=13 {
        assert!(produce_is_bounded(&produce(version, &[("a", fresh_id()), ("b", fresh_id())]), version), "v{version}");
    }
    let mut forged = produce(9, &[]);
    forged.truncate(forged.len() - 2);
    forged.extend([0xfe, 0xff, 0xff, 0xff, 0x07, 0x00]); // 2^31 topics
    assert!(!produce_is_bounded(&forged, 9));
    let mut forged = produce(7, &[("a", Uuid::nil())]);
    let at = forged.windows(1).rposition(|w| w == b"a").unwrap() + 1;
    forged[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes()); // partitions of "a"
    assert!(!produce_is_bounded(&forged, 7));
    let whole = produce(9, &[("a", Uuid::nil())]);
    assert!(!produce_is_bounded(&whole[..whole.len() - 20], 9), "records past the end");
    assert!(crate::core::handoff::retriable_answer(crate::core::Direction::Request, PRODUCE, 7, &forged).is_none());
}

#[test]
#[ignore] // a probe for the Python side's pattern subset: KEG_PATTERNS=<file of a JSON
          // [patterns, names]> cargo test --lib probe -- --ignored --nocapture prints, per
          // pattern, null (refused) or the names it selects.
fn probe_patterns() {
    let text = std::fs::read_to_string(std::env::var("KEG_PATTERNS").unwrap()).unwrap();
    let (patterns, names): (Vec<String>, Vec<String>) = serde_json::from_str(&text).unwrap();
    let results: Vec<Option<Vec<&String>>> = patterns.iter().map(|p| {
        TopicSelector::parse(serde_json::json!({"regex": [p]})).ok()
            .map(|s| names.iter().filter(|n| s.selects(n.as_bytes())).collect())
    }).collect();
    println!("PROBE {}", serde_json::to_string(&results).unwrap());
}

#[test]
fn a_fetch_request_is_decodable_only_whole_and_within_bounds() {
    for version in [4, 7, 11, 12, 13, 16, 17] {
        let whole = fetch(version, 3, &[("a", fresh_id()), ("b", fresh_id())]);
        assert!(fetch_is_bounded(&whole, version), "v{version}");
        assert!(!fetch_is_bounded(&whole[..whole.len() - 1], version), "v{version} cut short");
    }
    // A topic count past the frame: kafka-protocol would reserve room for all of them.
    let version = 11;
    let mut forged = fetch(version, 3, &[("a", Uuid::nil())]);
    let at = forged.windows(1).rposition(|w| w == b"a").unwrap() - 2 - 4; // the count before "a"'s length
    forged[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(!fetch_is_bounded(&forged, version));
    assert!(crate::core::handoff::retriable_answer(crate::core::Direction::Request, FETCH, version, &forged).is_none());
    let whole = fetch(version, 3, &[("a", Uuid::nil())]);
    let at = whole.windows(1).rposition(|w| w == b"a").unwrap() + 1; // "a"'s partition count
    let mut forged = whole.clone();
    forged[at..at + 4].copy_from_slice(&(MAX_PARTITIONS as i32 + 1).to_be_bytes());
    assert!(!fetch_is_bounded(&forged, version));
}

/// A ConsumerGroupHeartbeat request (v1, flexible) whose owned partitions name `ids`.
fn heartbeat(ids: &[Uuid]) -> Vec<u8> {
    use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
    use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, GroupId, RequestHeader};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default().with_request_api_key(68).with_request_api_version(1).with_correlation_id(7)
        .encode(&mut buf, 2).unwrap();
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_member_id(StrBytes::from_static_str("m"))
        .with_topic_partitions(Some(ids.iter().map(|id| TopicPartitions::default().with_topic_id(*id).with_partitions(vec![0, 1])).collect()))
        .encode(&mut buf, 1).unwrap();
    let mut frame = (buf.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    frame
}

#[test]
fn a_heartbeat_names_the_topic_ids_the_module_knows() {
    let (orders, payments, unknown) = (known("orders"), known("payments"), fresh_id());
    let frame = heartbeat(&[orders, unknown, payments, orders]);
    let named: Vec<_> = scanned_ids(68, &frame).into_iter().map(|(id, name)| (Uuid::from_bytes(id), name.to_string())).collect();
    assert_eq!(named, [(orders, "orders".to_string()), (payments, "payments".to_string())]);
    assert!(scanned_ids(18, &frame).is_empty(), "only APIs whose schemas carry topic ids are searched");
}

#[test]
fn a_fetch_asking_for_more_than_the_cap_asks_for_the_cap_and_nothing_else_changes() {
    use kafka_protocol::messages::RequestHeader as Header;
    use kafka_protocol::protocol::Decodable;
    for version in [4, 7, 11, 12, 13, 15, 16, 17, 18] {
        let names = [("orders", known("orders")), ("s.cards", known("s.cards"))];
        let original = fetch(version, 3, &names);
        let mut asked = FetchRequest::default();
        let mut buf = Bytes::copy_from_slice(&original[4..]);
        Header::decode(&mut buf, ApiKey::Fetch.request_header_version(version)).unwrap();
        asked = FetchRequest::decode(&mut buf, version).unwrap_or(asked);
        assert_eq!(asked.max_bytes, i32::MAX, "v{version}: kafka-protocol's default, Kafka's");

        let mut frame = original.clone();
        assert!(cap_fetch_max_bytes(&mut frame, version, 4 << 20), "v{version}");
        let mut buf = Bytes::copy_from_slice(&frame[4..]);
        let header = Header::decode(&mut buf, ApiKey::Fetch.request_header_version(version)).unwrap();
        let capped = FetchRequest::decode(&mut buf, version).unwrap();
        assert_eq!((header.correlation_id, capped.max_bytes), (7, 4 << 20), "v{version}");
        assert_eq!(capped.clone().with_max_bytes(i32::MAX), asked, "v{version}: only max_bytes moved");
        assert_eq!(frame.len(), original.len());

        // Asking for less already, or cut short before the field: left as it is.
        let mut again = frame.clone();
        assert!(!cap_fetch_max_bytes(&mut again, version, 8 << 20), "v{version}");
        assert_eq!(again, frame);
        let mut short = original[..20].to_vec();
        assert!(!cap_fetch_max_bytes(&mut short, version, 4 << 20), "v{version}");
        assert_eq!(short, original[..20]);
    }
}
