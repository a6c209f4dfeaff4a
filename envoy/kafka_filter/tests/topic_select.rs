//! Topic-selective hand-off in the core: a Produce of a range with a topic selector is
//! handed off only when it names a selected topic, decided before any of its bytes
//! pass, whatever the chunks; the others go on unchanged, in order, zero copy when
//! decided from the chunk at hand.

mod common;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use keg_kafka_filter::core::handoff::Failure;
use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::interest::{Interest, Want};
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::topics::TopicSelector;
use keg_kafka_filter::core::{Direction, Disposition, Output, RequestPolicy, Requester, Resolution, Session, SessionLimits};

/// Produce: by topic (`payments` selected); everything else forwarded.
struct SelectPayments(Arc<TopicSelector>);

impl RequestPolicy for SelectPayments {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key == 0 {
            Disposition::Select { fail_open: false, selector: self.0.clone(), vouching: None }
        } else {
            Disposition::Forward
        }
    }
}

fn session() -> Session<SelectPayments> {
    let selector = TopicSelector::parse(serde_json::json!({"exact": ["payments"]})).unwrap();
    Session::with_policy(SessionLimits::default(), SelectPayments(Arc::new(selector)))
}

fn produce(correlation_id: i32, acks: i16, topics: &[&str], payload: usize) -> Vec<u8> {
    let version = 9;
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(0).with_request_api_version(version)
        .with_correlation_id(correlation_id).with_client_id(Some(StrBytes::from_static_str("t")))
        .encode(&mut buf, ApiKey::Produce.request_header_version(version)).unwrap();
    let data = topics.iter().map(|name| TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(name.to_string())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0)
            .with_records(Some(Bytes::from(vec![0x5a; payload])))])).collect();
    ProduceRequest::default().with_acks(acks).with_timeout_ms(30_000).with_topic_data(data)
        .encode(&mut buf, version).unwrap();
    sized(&buf)
}

/// Feeds `stream` in `chunks`; hand-offs are answered with their frame reversed in its
/// last byte (a "masked" record). Returns what reached the broker and the hand-offs.
fn feed(s: &mut Session<SelectPayments>, stream: &[u8], cuts: &[usize]) -> (Vec<u8>, usize) {
    let mut forwarded = Vec::new();
    let mut handed = 0;
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&stream.len())) {
        let chunk = &stream[start..end.max(start)];
        start = end.max(start);
        let mut out = Output::default();
        s.feed_requests(chunk, &mut out).unwrap();
        forwarded.extend(bytes_of(chunk, &out));
        for h in s.take_handoffs() {
            assert_eq!(h.direction, Direction::Request);
            handed += 1;
            let mut frame = h.frame.to_vec();
            *frame.last_mut().unwrap() ^= 0xff;
            s.resolve(h.id, Resolution::Request { forward: frame, answer: None, want_response: false, vouched: vec![] }).unwrap();
        }
        let mut out = Output::default();
        s.ready_requests(&mut out);
        forwarded.extend(bytes_of(&[], &out));
    }
    (forwarded, handed)
}

fn masked(frame: &[u8]) -> Vec<u8> {
    let mut frame = frame.to_vec();
    *frame.last_mut().unwrap() ^= 0xff;
    frame
}

#[test]
fn only_requests_naming_a_selected_topic_are_handed_off_split_anywhere() {
    let orders = produce(1, 1, &["orders"], 40);
    let pay = produce(2, 1, &["payments"], 40);
    let both = produce(3, -1, &["orders", "payments"], 40);
    let none = produce(4, 0, &["logs", "orders"], 40);
    let metadata = request(3, 1, 5, &[0, 0, 0, 0]);
    let stream = [orders.clone(), pay.clone(), both.clone(), none.clone(), metadata.clone()].concat();
    let expected = [orders, masked(&pay), masked(&both), none, metadata].concat();
    for a in 0..=stream.len() {
        for b in [a, a + 1, a + 7, a + 60].into_iter().filter(|&b| b <= stream.len()) {
            let mut s = session();
            let (forwarded, handed) = feed(&mut s, &stream, &[a, b]);
            assert_eq!(forwarded, expected, "cut at {a} and {b}");
            assert_eq!(handed, 2, "payments, and orders+payments");
            assert_eq!(s.stats.get(Counter::HandoffNotSelected), 2);
            assert_eq!(s.in_flight(), 4, "every request but the acks=0 one awaits the broker");
            assert_eq!(s.handoff_bytes(), 0);
        }
    }
    // Byte by byte.
    let mut s = session();
    let cuts: Vec<usize> = (1..stream.len()).collect();
    assert_eq!(feed(&mut s, &stream, &cuts).0, expected);
}

#[test]
fn an_unselected_request_decided_from_its_chunk_is_not_copied() {
    let mut s = session();
    let frame = produce(1, 1, &["orders"], 100_000);
    // Its first bytes decide: the rest passes as it arrives.
    let mut out = Output::default();
    s.feed_requests(&frame[..200], &mut out).unwrap();
    assert!(out.is_whole(200), "{out:?}");
    let mut out = Output::default();
    s.feed_requests(&frame[200..], &mut out).unwrap();
    assert!(out.is_whole(frame.len() - 200));
    assert_eq!(s.stats.get(Counter::HandoffNotSelected), 1);
    assert!(s.take_handoffs().is_empty());
    // The broker's answer goes to the client as it is.
    let answer = opaque_response(1, &[0; 12]);
    let mut out = Output::default();
    s.feed_responses(&answer, view(&routes()), &mut out).unwrap();
    assert!(out.is_whole(answer.len()));
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn an_unselected_request_waits_behind_an_earlier_hand_off() {
    let mut s = session();
    let pay = produce(1, 1, &["payments"], 10);
    let orders = produce(2, 1, &["orders"], 10);
    let mut out = Output::default();
    s.feed_requests(&[pay.clone(), orders.clone()].concat(), &mut out).unwrap();
    assert!(out.is_empty(), "nothing overtakes the hand-off");
    let handed = s.take_handoffs();
    assert_eq!(handed.len(), 1);
    s.resolve(handed[0].id, Resolution::Request { forward: pay.clone(), answer: None, want_response: false, vouched: vec![] }).unwrap();
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert_eq!(bytes_of(&[], &out), [pay, orders].concat());
}

#[test]
fn a_request_whose_topics_cannot_be_read_is_handed_off() {
    let mut s = session();
    let mut frame = produce(1, 1, &["orders"], 10);
    // The topic count says two: the second name runs past the frame's end.
    let at = frame.windows(6).position(|w| w == b"orders").unwrap() - 2;
    frame[at] = 3;
    let mut out = Output::default();
    s.feed_requests(&frame, &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(s.take_handoffs().len(), 1);
    assert_eq!(s.stats.get(Counter::HandoffNotSelected), 0);
}

/// Produce as an interest table says: handed off by its selector, failing as it says.
struct ByInterest(Interest);

impl RequestPolicy for ByInterest {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        match self.0.want(head.api_key, head.api_version) {
            Want::Topics(selector, vouching) => {
                Disposition::Select { fail_open: self.0.fails_open(head.api_key, head.api_version), selector, vouching }
            }
            _ => Disposition::Forward,
        }
    }

    fn fails_open_for(&mut self, api_key: i16, api_version: i16, frame: &[u8]) -> bool {
        self.0.fails_open_for(api_key, api_version, frame)
    }
}

#[test]
fn a_produce_only_dry_runs_act_on_fails_open_and_one_naming_an_enforced_topic_fails_closed() {
    // `draft` has a dry-run rule, `secret` an enforced one: both are handed off.
    let interest = Interest::parse(serde_json::json!({
        "requests": [[0, 0, 13, {"exact": ["draft", "secret"]}]],
        "fail_open": [[0, 0, 13, {"exact": ["secret"]}]], "endpoints": ["h:1"]})).unwrap();
    let mut s = Session::with_policy(SessionLimits::default(), ByInterest(interest));
    let fail = |s: &mut Session<ByInterest>, frame: &[u8]| {
        let mut out = Output::default();
        s.feed_requests(frame, &mut out).unwrap();
        assert!(bytes_of(frame, &out).is_empty(), "held for the service");
        let handed = s.take_handoffs();
        assert_eq!(handed.len(), 1);
        s.resolve(handed[0].id, Resolution::Failed(Failure::Unavailable)).unwrap();
        let mut out = Output::default();
        s.ready_requests(&mut out);
        bytes_of(&[], &out)
    };
    let drafts = produce(1, 1, &["orders", "draft"], 10);
    assert_eq!(fail(&mut s, &drafts), drafts, "forwarded as it came");
    assert_eq!(s.stats.get(Counter::HandoffFailedOpen), 1);
    let secrets = produce(2, 1, &["draft", "secret"], 10);
    assert!(fail(&mut s, &secrets).is_empty(), "answered with a retriable error instead");
    assert_eq!(s.stats.get(Counter::HandoffRetriableErrors), 1);
    // Other APIs take no selector there: a Fetch's answer may name topics its request does not.
    let fetch = serde_json::json!({"fail_open": [[1, 0, 17, {"exact": ["secret"]}]]});
    assert!(Interest::parse(fetch).unwrap_err().contains("Produce only"));
}
