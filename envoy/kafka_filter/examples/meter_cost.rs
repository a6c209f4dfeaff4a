//! What the labelled metrics cost the request path, side by side in one run: a session
//! fed the same stream of Produce requests in 64 KiB reads, without a meter, with one
//! that reads topics and with one that does not (`KEG_METRICS_TOPICS=false`), drained
//! into an exporter after every read (what the filter does after each callback).
//!
//!     cargo run --release --example meter_cost [requests] [rounds]
//!
//! Prints one JSON line (benchmarks/native_meter.py runs it and keeps the results).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use keg_kafka_filter::core::meter::Meter;
use keg_kafka_filter::core::{Output, Session, SessionLimits};
use std::sync::Arc;

use keg_kafka_filter::metrics::{ConnectionCounters, Exporter, MetricsConfig};

const READ: usize = 64 << 10;

/// A librdkafka-like Produce v9: one topic, one partition, a batch of `records` 1 KiB.
fn produce(correlation_id: i32, records: usize) -> Vec<u8> {
    let batch = Bytes::from(vec![0x5a; records * 1024]);
    let topic = TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_static_str("orders")))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch))]);
    let request = ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(vec![topic]);
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(ApiKey::Produce as i16).with_request_api_version(9)
        .with_correlation_id(correlation_id).with_client_id(Some(StrBytes::from_static_str("rdkafka")))
        .encode(&mut buf, ApiKey::Produce.request_header_version(9)).unwrap();
    request.encode(&mut buf, 9).unwrap();
    let mut frame = (buf.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    frame
}

/// Seconds to feed `stream` through a fresh session.
fn run(stream: &[u8], exporter: Option<&Arc<Exporter>>, topics: bool) -> f64 {
    let mut session = Session::new(SessionLimits::default());
    session.meter = exporter.map(|_| Meter::new(topics));
    let mut counters = exporter.map(|e| ConnectionCounters::new(Arc::clone(e)));
    let mut out = Output::default();
    let start = Instant::now();
    for read in stream.chunks(READ) {
        out.clear();
        session.feed_requests(read, &mut out).unwrap();
        if let (Some(meter), Some(counters)) = (session.meter.as_mut(), counters.as_mut()) {
            meter.drain(counters);
        }
        std::hint::black_box(&out);
    }
    start.elapsed().as_secs_f64()
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let requests = args.next().unwrap_or(200_000);
    let rounds = args.next().unwrap_or(5);
    let exporter = Arc::new(Exporter::new(MetricsConfig {
        address: "127.0.0.1:0".into(), topics: true, max_topics: 1000, max_clients: 1000, max_principals: 1000,
        max_series: 10_000,
    }));
    let mut results = Vec::new();
    for records in [1usize, 16] {
        let stream: Vec<u8> = (0..requests as i32).flat_map(|i| produce(i, records)).collect();
        let (mut plain, mut metered, mut no_topics) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            plain.push(run(&stream, None, false));
            metered.push(run(&stream, Some(&exporter), true));
            no_topics.push(run(&stream, Some(&exporter), false));
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (plain, metered, no_topics) = (median(&mut plain), median(&mut metered), median(&mut no_topics));
        let per = |s: f64| s * 1e9 / requests as f64;
        results.push(format!(
            concat!(r#"{{"records_per_request": {}, "request_bytes": {}, "ns_per_request_plain": {:.1}, "#,
                    r#""ns_per_request_metered": {:.1}, "ns_per_request_metered_no_topics": {:.1}, "#,
                    r#""metered_vs_plain": {:.3}, "no_topics_vs_plain": {:.3}}}"#),
            records, stream.len() / requests, per(plain), per(metered), per(no_topics), metered / plain,
            no_topics / plain));
    }
    println!(r#"{{"requests": {requests}, "rounds": {rounds}, "read_bytes": {READ}, "cases": [{}]}}"#, results.join(", "));
}
