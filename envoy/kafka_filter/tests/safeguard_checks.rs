//! Safeguards the module checks itself (`core::safeguard`): a Produce that keeps every
//! check of its range's safeguards passes natively; one that may break one, or that the
//! walk cannot read whole, is handed off for the Python chain to refuse.

mod common;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName, TransactionalId};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::safeguard::ProduceChecks;
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::topics::TopicSelector;
use keg_kafka_filter::core::{Disposition, Output, RequestPolicy, Requester, Session, SessionLimits};
use serde_json::json;

/// What a hygiene rule set says: acks, idempotence, lz4 or zstd (uncompressed batches
/// below 200 bytes pass), batches of at most 64 KiB.
fn hygiene() -> ProduceChecks {
    ProduceChecks::read(json!({"acks_not_zero": true, "idempotent": true, "max_batch_bytes": 65536,
                               "compression": [{"refused": [0, 1, 2], "uncompressed_below": 200}]})).unwrap()
}

/// One batch of `count` 100-byte records (incompressible: a batch's size is its records').
fn batch(count: usize, compression: Compression, producer_id: i64) -> Vec<u8> {
    let records: Vec<Record> = (0..count).map(|i| Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id,
        producer_epoch: if producer_id < 0 { -1 } else { 0 },
        timestamp_type: TimestampType::Creation,
        offset: i as i64,
        sequence: if producer_id < 0 { -1 } else { i as i32 },
        timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from(noise(i as u64, 100))),
        headers: Default::default(),
    }).collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
    buf.to_vec()
}

/// `len` pseudo-random bytes (xorshift from `seed`).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }).collect()
}

fn produce(version: i16, acks: i16, transactional_id: Option<&str>, topics: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(0).with_request_api_version(version).with_correlation_id(5)
        .with_client_id(Some(StrBytes::from_static_str("t")))
        .encode(&mut buf, ApiKey::Produce.request_header_version(version)).unwrap();
    let data = topics.iter().map(|(name, records)| {
        let topic = TopicProduceData::default().with_partition_data(vec![
            PartitionProduceData::default().with_index(0).with_records(Some(Bytes::from(records.clone()))),
            PartitionProduceData::default().with_index(1).with_records(None),
        ]);
        if version >= 13 {
            topic.with_topic_id(topic_id(name))
        } else {
            topic.with_name(TopicName(StrBytes::from_string(name.to_string())))
        }
    }).collect();
    ProduceRequest::default()
        .with_transactional_id(transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_string()))))
        .with_acks(acks).with_timeout_ms(30_000).with_topic_data(data).encode(&mut buf, version).unwrap();
    sized(&buf)
}

const VERSIONS: [i16; 6] = [3, 7, 8, 9, 12, 13];

#[test]
fn a_request_keeping_every_check_passes_in_every_version_the_module_walks() {
    let good = [batch(10, Compression::Lz4, 7), batch(3, Compression::Zstd, 7), batch(1, Compression::None, 7)].concat();
    for version in VERSIONS {
        let frame = produce(version, -1, None, &[("orders", good.clone()), ("audit", batch(5, Compression::Lz4, 7))]);
        assert!(hygiene().passes(&frame, version), "v{version}");
        for cut in 0..frame.len() {
            assert!(!hygiene().passes(&frame[..cut], version), "v{version} cut at {cut}: malformed");
        }
        let mut longer = frame.clone();
        longer.push(0);
        assert!(!hygiene().passes(&longer, version), "trailing bytes");
    }
    assert!(!hygiene().passes(&produce(9, -1, None, &[("orders", good.clone())]), 2), "a version not walked");
    assert!(ProduceChecks::default().passes(&produce(9, 0, None, &[("orders", batch(1, Compression::Gzip, -1))]), 9),
            "no checks: anything readable passes");
}

#[test]
fn a_request_that_may_break_a_check_does_not() {
    let lz4 = |producer_id| batch(10, Compression::Lz4, producer_id);
    let breaking: [(&str, Vec<u8>, i16, Option<&str>); 6] = [
        ("acks=0", lz4(7), 0, None),
        ("no producer id", lz4(-1), -1, None),
        ("gzip", batch(10, Compression::Gzip, 7), -1, None),
        ("uncompressed, 200 bytes and more", batch(3, Compression::None, 7), -1, None),
        ("a batch over 64 KiB", batch(700, Compression::Lz4, 7), -1, None),
        ("one good batch, one gzip", [lz4(7), batch(2, Compression::Gzip, 7)].concat(), -1, None),
    ];
    for version in VERSIONS {
        for (what, records, acks, transactional_id) in &breaking {
            let frame = produce(version, *acks, *transactional_id, &[("orders", lz4(7)), ("audit", records.clone())]);
            assert!(!hygiene().passes(&frame, version), "v{version}: {what}");
        }
        let transactional = ProduceChecks::read(json!({"transactional": true})).unwrap();
        assert!(!transactional.passes(&produce(version, -1, None, &[("orders", lz4(7))]), version));
        assert!(transactional.passes(&produce(version, -1, Some("tx-1"), &[("orders", lz4(7))]), version));
    }
    let mut old_magic = produce(9, -1, None, &[("orders", lz4(7))]);
    let at = old_magic.windows(4).position(|w| w == [0, 0, 0, 0]).unwrap(); // a batch's base offset
    let magic = (at..old_magic.len() - 17).find(|&i| old_magic[i + 16] == 2).unwrap();
    old_magic[magic + 16] = 1;
    assert!(!hygiene().passes(&old_magic, 9), "a batch of an older magic is not read");
}

/// Decides every Produce as `Checked` with the hygiene checks (and `selector`).
struct Hygiene {
    selector: Option<Arc<TopicSelector>>,
}

impl RequestPolicy for Hygiene {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key != 0 {
            return Disposition::Forward;
        }
        Disposition::Checked { fail_open: false, selector: self.selector.clone(), checks: Arc::new(hygiene()) }
    }
}

#[test]
fn only_requests_that_may_break_a_check_are_handed_off_wherever_the_stream_is_cut() {
    let kept = produce(9, -1, None, &[("orders", batch(10, Compression::Lz4, 7))]);
    let broken = produce(9, -1, None, &[("orders", batch(10, Compression::Gzip, 7))]);
    let elsewhere = produce(9, 0, None, &[("logs", batch(10, Compression::Gzip, -1))]);
    let stream = [kept.clone(), broken.clone(), kept.clone()].concat();
    for selector in [None, Some(Arc::new(TopicSelector::parse(json!({"exact": ["orders"]})).unwrap()))] {
        for cut in 0..=stream.len() {
            let mut s = Session::with_policy(SessionLimits::default(), Hygiene { selector: selector.clone() });
            let (forwarded, handed) = requests_cut_at(&mut s, &stream, cut);
            assert_eq!(handed.len(), 1, "cut at {cut}");
            assert_eq!(&handed[0].frame[..], &broken[..], "cut at {cut}");
            assert_eq!(forwarded, kept, "cut at {cut}: the first passes, the third waits behind the hand-off");
            assert_eq!(s.stats.get(Counter::HandoffSafeguardsKept), 2, "cut at {cut}");
        }
        // A topic the selector does not name passes unread whatever it breaks.
        let mut s = Session::with_policy(SessionLimits::default(), Hygiene { selector: selector.clone() });
        let mut out = Output::default();
        s.feed_requests(&elsewhere, &mut out).unwrap();
        assert_eq!(s.take_handoffs().len(), usize::from(selector.is_none()), "selector {selector:?}");
    }
}

mod mutated {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any byte of a valid request changed, or bytes cut or added: the walk never
        /// panics.
        #[test]
        fn the_walk_never_panics_on_mutated_requests(version in prop::sample::select(VERSIONS.to_vec()),
                                                     flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
                                                     cut in any::<usize>(), tail in prop::collection::vec(any::<u8>(), 0..3)) {
            let mut frame = produce(version, -1, None, &[("orders", batch(4, Compression::Lz4, 7)),
                                                         ("audit", batch(2, Compression::None, 7))]);
            for (at, byte) in flips {
                let at = at % frame.len();
                frame[at] ^= byte;
            }
            frame.truncate(frame.len() - cut % 8);
            frame.extend(tail);
            let _ = hygiene().passes(&frame, version);
            let _ = ProduceChecks::default().passes(&frame, version);
        }
    }
}
