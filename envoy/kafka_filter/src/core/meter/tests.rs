use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, MetadataRequest, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;
use uuid::Uuid;

use super::*;
use crate::core::head::{parse_request_head, Parsed, RequestHead};

fn frame(key: ApiKey, version: i16, client_id: Option<&'static str>, message: &impl Encodable) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(key as i16).with_request_api_version(version)
        .with_correlation_id(7).with_client_id(client_id.map(StrBytes::from_static_str))
        .encode(&mut buf, key.request_header_version(version)).unwrap();
    message.encode(&mut buf, version).unwrap();
    let mut frame = (buf.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    frame
}

/// A Produce request: per topic, partitions of `sizes` record bytes (None: null records).
fn produce(version: i16, topics: &[(&str, &[Option<usize>])]) -> Vec<u8> {
    let data = topics.iter().map(|(name, sizes)| {
        let partitions = sizes.iter().enumerate().map(|(i, size)| {
            PartitionProduceData::default().with_index(i as i32).with_records(size.map(|n| Bytes::from(vec![0xab; n])))
        }).collect();
        let topic = TopicProduceData::default().with_partition_data(partitions);
        if version >= 13 {
            topic.with_topic_id(id_of(name))
        } else {
            topic.with_name(TopicName(StrBytes::from_string(name.to_string())))
        }
    }).collect();
    let request = ProduceRequest::default().with_acks(-1).with_timeout_ms(1000).with_topic_data(data);
    frame(ApiKey::Produce, version, Some("billing"), &request)
}

fn id_of(name: &str) -> Uuid {
    let mut bytes = [0u8; 16];
    for (i, b) in name.bytes().enumerate() {
        bytes[i % 16] ^= b.wrapping_add(i as u8);
    }
    Uuid::from_bytes(bytes)
}

#[derive(Default, Debug, PartialEq)]
struct Recorded {
    requests: Vec<(i16, i16, String, String, u64)>,
    topics: Vec<(TopicKey, String, String, u64, u64)>,
}

impl MeterSink for Recorded {
    fn requests(&mut self, api_key: i16, api_version: i16, client_id: &str, principal: &str, count: u64) {
        self.requests.push((api_key, api_version, client_id.into(), principal.into(), count));
        self.requests.sort();
    }

    fn topic(&mut self, topic: &TopicKey, client_id: &str, principal: &str, requests: u64, record_bytes: u64) {
        self.topics.push((topic.clone(), client_id.into(), principal.into(), requests, record_bytes));
        self.topics.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    }
}

fn head(frame: &[u8]) -> RequestHead {
    match parse_request_head(frame, usize::MAX) {
        Ok(Parsed::Head(head)) => head,
        other => panic!("no head: {other:?}"),
    }
}

fn head_len(frame: &[u8]) -> usize {
    head(frame).head_len
}

/// The client id of a request's first bytes, as the session reads it for the meter.
fn client_id(prefix: &[u8]) -> ClientId<'_> {
    ClientId::read(head(prefix).client_id, prefix)
}

/// Meters `frames` as they would arrive cut at `cuts` (offsets into their concatenation),
/// drained once at the end.
fn meter(frames: &[Vec<u8>], cuts: &[usize]) -> Recorded {
    meter_draining(frames, cuts, false)
}

/// As `meter`; `every_read`: drained after each read too (as the filter does after each
/// Envoy callback), the counts of each topic summed.
fn meter_draining(frames: &[Vec<u8>], cuts: &[usize], every_read: bool) -> Recorded {
    let mut recorded = Recorded::default();
    let mut meter = Meter::new(true);
    meter.principal(1, || "User:alice".into());
    let stream: Vec<u8> = frames.concat();
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < stream.len()).collect();
    bounds.push(stream.len());
    bounds.sort();
    let mut start;
    let mut frame_at = 0;
    for frame in frames {
        let (head, end) = (head_len(frame), frame_at + frame.len());
        // The head arrives with whatever the read it ends in carries of the frame.
        let read_end = *bounds.iter().find(|&&b| b >= frame_at + head).unwrap();
        let seen = read_end.min(end);
        meter.request(ApiKey::Produce as i16, i16::from_be_bytes([frame[6], frame[7]]),
                      client_id(&stream[frame_at..seen]), frame.len() - head);
        start = frame_at + head;
        while start < end {
            let next = (*bounds.iter().find(|&&b| b > start).unwrap()).min(end);
            meter.body(&stream[start..next]);
            if every_read && bounds.contains(&next) {
                meter.drain(&mut recorded);
            }
            start = next;
        }
        frame_at = end;
    }
    meter.drain(&mut recorded);
    assert!(meter.is_empty());
    recorded.topics = summed(&recorded.topics);
    recorded
}

/// The topic entries of several drains, one per topic and label pair.
fn summed(topics: &[(TopicKey, String, String, u64, u64)]) -> Vec<(TopicKey, String, String, u64, u64)> {
    let mut out: Vec<(TopicKey, String, String, u64, u64)> = Vec::new();
    for (topic, client, principal, requests, bytes) in topics {
        match out.iter_mut().find(|e| (&e.0, &e.1, &e.2) == (topic, client, principal)) {
            Some(entry) => {
                entry.3 += requests;
                entry.4 += bytes;
            }
            None => out.push((topic.clone(), client.clone(), principal.clone(), *requests, *bytes)),
        }
    }
    out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    out
}

fn name(topic: &str) -> TopicKey {
    TopicKey::Name(topic.into())
}

#[test]
fn every_version_counts_each_topic_once_per_request_and_its_record_bytes() {
    for version in [3, 7, 8, 9, 11, 12, 13] {
        let request = produce(version, &[("orders", &[Some(300), None, Some(5)]), ("audit", &[Some(40)])]);
        let got = meter(&[request.clone(), request], &[]);
        let key = |t: &str| if version >= 13 { TopicKey::Id(*id_of(t).as_bytes()) } else { name(t) };
        let mut want = vec![(key("audit"), "billing".into(), "User:alice".into(), 2, 80),
                            (key("orders"), "billing".into(), "User:alice".into(), 2, 610)];
        want.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        assert_eq!(got.topics, want, "Produce v{version}");
    }
}

#[test]
fn a_request_cut_at_every_offset_counts_the_same() {
    for version in [8, 9, 13] {
        let frames = [produce(version, &[("orders", &[Some(70), Some(3)]), ("a", &[None])]),
                      produce(version, &[("b", &[Some(1)])])];
        let whole = meter(&frames, &[]);
        let total: usize = frames.iter().map(Vec::len).sum();
        for cut in 1..total {
            assert_eq!(meter(&frames, &[cut]), whole, "v{version} cut at {cut}");
        }
        for step in [1, 2, 3, 7] {
            let cuts: Vec<usize> = (0..total).step_by(step).collect();
            assert_eq!(meter(&frames, &cuts), whole, "v{version} in reads of {step}");
        }
    }
}

/// The filter drains after every Envoy callback: a Produce whose partitions arrive in
/// several reads still counts all of its record bytes (the bytes of the partitions after
/// a drain were lost).
#[test]
fn draining_between_reads_loses_no_record_bytes() {
    for version in [8, 9, 13] {
        let frames = [produce(version, &[("orders", &[Some(700), Some(300), None, Some(90)]), ("b", &[Some(5)])])];
        let whole = meter(&frames, &[]);
        for cut in 1..frames[0].len() {
            assert_eq!(meter_draining(&frames, &[cut], true).topics, whole.topics, "v{version} cut at {cut}");
        }
        let reads: Vec<usize> = (0..frames[0].len()).step_by(50).collect();
        assert_eq!(meter_draining(&frames, &reads, true).topics, whole.topics, "v{version} reads of 50");
    }
}

#[test]
fn client_ids_come_from_each_header_and_a_cut_one_keeps_the_previous() {
    let mut meter = Meter::new(false);
    meter.principal(1, || "User:ANONYMOUS".into());
    let first = frame(ApiKey::Metadata, 9, Some("app-1"), &MetadataRequest::default());
    let null = frame(ApiKey::Metadata, 9, None, &MetadataRequest::default());
    meter.request(3, 9, client_id(&first), 0);
    meter.request(3, 9, ClientId::Unknown, 0); // the id unread: still app-1
    meter.request(3, 9, client_id(&null), 0);
    meter.principal(2, || "User:bob".into());
    meter.request(3, 9, client_id(&null), 0);
    let mut got = Recorded::default();
    meter.drain(&mut got);
    assert_eq!(got.requests, vec![(3, 9, "".into(), "User:ANONYMOUS".into(), 1), (3, 9, "".into(), "User:bob".into(), 1),
                                  (3, 9, "app-1".into(), "User:ANONYMOUS".into(), 2)]);
    assert!(got.topics.is_empty(), "topics off: Produce is not read");
}

#[test]
fn a_structure_longer_than_the_carry_stops_the_topic_count_not_the_request_count() {
    let long = "t".repeat(MAX_CARRY + 10);
    let request = produce(9, &[(&long, &[Some(1)])]);
    let cuts: Vec<usize> = (0..request.len()).step_by(1000).collect();
    let got = meter(&[request], &cuts);
    assert_eq!(got.requests.len(), 1);
    assert!(got.topics.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever a client sends as a Produce body, the skim never panics and never reads
    /// past the frame.
    #[test]
    fn arbitrary_bodies_never_panic(version in 0i16..14, body in proptest::collection::vec(any::<u8>(), 0..200),
                                    cut in 0usize..200) {
        let mut skim = ProduceSkim::new(version, body.len());
        let mut topics = TopicCounts::new();
        let cut = cut.min(body.len());
        skim.feed(&body[..cut], &mut topics);
        skim.feed(&body[cut..], &mut topics);
        skim.feed(b"more than the frame", &mut topics);
        prop_assert!(skim.finished());
    }
}

/// Through a whole session (what the filter runs): cut anywhere, the same counts, and
/// the bytes forwarded are the bytes that came.
#[test]
fn a_session_counts_the_same_whatever_the_reads() {
    use crate::core::{Output, Session, SessionLimits};
    let frames = [produce(9, &[("orders", &[Some(90)])]),
                  frame(ApiKey::Metadata, 12, Some("app"), &MetadataRequest::default()),
                  produce(13, &[("x", &[Some(2), None])])];
    let stream = frames.concat();
    let run = |cuts: &[usize]| {
        let mut session = Session::new(SessionLimits::default());
        session.meter = Some(Meter::new(true));
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c > 0 && c < stream.len()).collect();
        bounds.push(stream.len());
        let mut start = 0;
        let mut forwarded = Vec::new();
        for end in bounds {
            let mut out = Output::default();
            session.feed_requests(&stream[start..end], &mut out).unwrap();
            out.write_to(&stream[start..end], &mut forwarded);
            start = end;
        }
        assert_eq!(forwarded, stream);
        let mut got = Recorded::default();
        session.meter.as_mut().unwrap().drain(&mut got);
        got
    };
    let whole = run(&[]);
    assert_eq!(whole.requests, vec![(0, 9, "billing".into(), "User:ANONYMOUS".into(), 1),
                                    (0, 13, "billing".into(), "User:ANONYMOUS".into(), 1),
                                    (3, 12, "app".into(), "User:ANONYMOUS".into(), 1)]);
    assert_eq!(whole.topics.len(), 2);
    // A cut inside a header's client id leaves the connection's previous one (documented).
    let metadata_at = frames[0].len();
    let client_id_bytes = metadata_at + 12..metadata_at + 12 + 2 + "app".len();
    for cut in 1..stream.len() {
        let got = run(&[cut]);
        if client_id_bytes.contains(&cut) {
            assert_eq!(got.topics, whole.topics, "cut at {cut}");
            assert_eq!(got.requests[2].4, 1, "cut at {cut}");
        } else {
            assert_eq!(got, whole, "cut at {cut}");
        }
    }
    assert_eq!(run(&(0..stream.len()).collect::<Vec<_>>()).topics, whole.topics, "a byte at a time");
}
