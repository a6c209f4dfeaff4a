//! What the vouched-ids walk costs an Envoy worker per Fetch answer: a partition's 1 MiB
//! of compressed 1 KiB JSON records (a consumer's default max.partition.fetch.bytes),
//! decompressed and walked, per codec; and the budget's worst case (a frame that
//! decompresses to `MAX_INFLATED`). Then the same with each payload checked against a
//! JSON Schema (ids vouched with their schema, `core::payload`), up to `MAX_VALIDATED`.
//!
//!     cargo run --release --example inflate_cost

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use keg_kafka_filter::core::inflate::GZIP_WEIGHT;
use keg_kafka_filter::core::payload::{PayloadSchema, MAX_VALIDATED};
use keg_kafka_filter::core::vouch::{records_pass, Allowed, Budget, Tail, MAX_INFLATED};

const ORDER: &str = r#"{"type": "object", "required": ["id", "amount", "customer", "note"],
    "properties": {"id": {"type": "integer", "minimum": 0}, "amount": {"type": "number"},
                   "customer": {"type": "object", "required": ["email"],
                                "properties": {"email": {"type": "string", "format": "email"}}},
                   "note": {"type": "string", "maxLength": 2000}}}"#;

fn value(i: usize) -> Bytes {
    let mut v = vec![0, 0, 0, 0, 7];
    let doc = format!("{{\"id\":{i},\"amount\":{},\"customer\":{{\"email\":\"user{i}@example.com\"}},\"note\":\"", i % 500);
    v.extend(doc.as_bytes());
    v.resize(1021, b'x');
    v.extend(b"\"}");
    Bytes::from(v)
}

fn batch(count: usize, compression: Compression) -> Vec<u8> {
    let records: Vec<Record> = (0..count).map(|i| Record {
        transactional: false, control: false, delete_horizon: false, partition_leader_epoch: 0,
        producer_id: -1, producer_epoch: -1, timestamp_type: TimestampType::Creation,
        offset: i as i64, sequence: i as i32, timestamp: 1_700_000_000_000, key: None,
        value: Some(value(i)), headers: Default::default(),
    }).collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
    buf.to_vec()
}

fn main() {
    let plain = Allowed::ids(&[7]);
    let schema = Allowed::of(vec![(7, Some(std::sync::Arc::new(PayloadSchema::compile(ORDER).unwrap())))]);
    for (allowed, what) in [(&plain, "ids"), (&schema, "ids + JSON Schema")] {
        println!("{what}:");
        walk(allowed, if what == "ids" { MAX_INFLATED } else { MAX_VALIDATED });
    }
}

fn walk(allowed: &Allowed, cap: usize) {
    for (name, codec) in [("none", Compression::None), ("lz4", Compression::Lz4), ("zstd", Compression::Zstd),
                          ("snappy", Compression::Snappy), ("gzip", Compression::Gzip)] {
        // Batches of 1,000 records until 1 MiB of them on the wire (at most MAX_INFLATED).
        let one = batch(1000, codec);
        let mut records = Vec::new();
        let mut decompressed = 0usize;
        let most = if name == "gzip" { cap.min(MAX_INFLATED / GZIP_WEIGHT) } else { cap };
        while records.len() + one.len() <= 1 << 20 && decompressed + 1_024_000 <= most {
            records.extend_from_slice(&one);
            decompressed += 1_024_000;
        }
        let rounds = 20;
        let started = Instant::now();
        for _ in 0..rounds {
            assert!(records_pass(&records, allowed, &mut Budget::frame(), Tail::Dropped));
        }
        let per = started.elapsed() / rounds;
        println!("{name:>6}: {:>8} bytes on the wire, {:>9} records bytes: {:>7.2} ms per answer ({:.0} MB/s of records)",
                 records.len(), decompressed, per.as_secs_f64() * 1e3, decompressed as f64 / per.as_secs_f64() / 1e6);
    }
}
