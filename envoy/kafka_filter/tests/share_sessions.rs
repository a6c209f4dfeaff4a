//! ShareFetch requests (KIP-932 share sessions) in the core: one opening a share session
//! (epoch 0) is decided by the topic ids it names; one in a session naming no selected
//! topic goes to the broker at once and its answer decides, as incremental Fetches do.

mod common;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::messages::share_fetch_request::{AcknowledgementBatch, FetchPartition, FetchTopic};
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, NodeEndpoint, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::{ApiKey, BrokerId, GroupId, RequestHeader, ShareFetchRequest, ShareFetchResponse};
use kafka_protocol::protocol::{Encodable, StrBytes};
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::topics::{answer_named_ids, named_ids, select, Selection, TopicSelector, SHARE_FETCH};
use keg_kafka_filter::core::vouch::answer_unselected;
use keg_kafka_filter::core::{Direction, Session, SessionLimits};

const VERSION: i16 = 1;

/// ShareFetch by topic (`s.*` selected).
fn session() -> Session<SelectS> {
    Session::with_policy(SessionLimits::default(), SelectS::new(SHARE_FETCH))
}

fn selector() -> Arc<TopicSelector> {
    SelectS::new(SHARE_FETCH).selector
}

/// A ShareFetch of partitions 0 and 1 of `topics` in share session epoch `epoch`, with
/// an acknowledgement batch on each partition.
fn share_fetch(correlation_id: i32, epoch: i32, topics: &[&str]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(SHARE_FETCH).with_request_api_version(VERSION)
        .with_correlation_id(correlation_id).with_client_id(Some(StrBytes::from_static_str("share")))
        .encode(&mut buf, ApiKey::ShareFetch.request_header_version(VERSION)).unwrap();
    let acks = vec![AcknowledgementBatch::default().with_first_offset(0).with_last_offset(4).with_acknowledge_types(vec![1, 1, 2])];
    let topics = topics.iter().map(|name| FetchTopic::default().with_topic_id(topic_id(name)).with_partitions(vec![
        FetchPartition::default().with_partition_index(0).with_acknowledgement_batches(acks.clone()),
        FetchPartition::default().with_partition_index(1),
    ])).collect();
    ShareFetchRequest::default().with_group_id(Some(GroupId(StrBytes::from_static_str("g"))))
        .with_member_id(Some(StrBytes::from_static_str("m-1"))).with_share_session_epoch(epoch)
        .with_max_records(500).with_batch_size(500).with_topics(topics)
        .encode(&mut buf, VERSION).unwrap();
    sized(&buf)
}

/// A ShareFetch answer: partition 0 of each topic with records and acquired offsets;
/// broker 1 at `host:port`.
fn share_answer_at(correlation_id: i32, topics: &[&str], host: &'static str, port: i32) -> Vec<u8> {
    let responses = topics.iter().map(|name| ShareFetchableTopicResponse::default().with_topic_id(topic_id(name))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)
            .with_records(Some(Bytes::from_static(b"records")))
            .with_acquired_records(vec![AcquiredRecords::default().with_first_offset(0).with_last_offset(9).with_delivery_count(1)])]))
        .collect();
    let answer = ShareFetchResponse::default().with_acquisition_lock_timeout_ms(30_000).with_responses(responses)
        .with_node_endpoints(vec![NodeEndpoint::default().with_node_id(BrokerId(1))
            .with_host(StrBytes::from_static_str(host)).with_port(port)]);
    encode_response(ApiKey::ShareFetch, VERSION, correlation_id, &answer)
}

/// A broker's answer, as the broker sends it.
fn share_answer(correlation_id: i32, topics: &[&str]) -> Vec<u8> {
    share_answer_at(correlation_id, topics, "broker", 9092)
}

/// The same answer as the client gets it: broker 1's endpoint rewritten to the gateway's.
fn as_rewritten(correlation_id: i32, topics: &[&str]) -> Vec<u8> {
    share_answer_at(correlation_id, topics, "gateway.test", 19092)
}

#[test]
fn a_share_fetch_is_decided_by_its_topic_ids_at_every_split() {
    let s = selector();
    for (epoch, topics, whole) in [
        (0, vec!["logs", "audit"], Selection::Pass),
        (0, vec!["logs", "s.cards"], Selection::HandOff),
        (0, vec![], Selection::Pass),
        (4, vec!["logs"], Selection::ByAnswer),
        (4, vec![], Selection::ByAnswer),
        (-1, vec!["logs"], Selection::ByAnswer),
        (4, vec!["s.cards"], Selection::HandOff),
    ] {
        let frame = share_fetch(1, epoch, &topics);
        assert_eq!(select(SHARE_FETCH, VERSION, &frame, frame.len(), &s), whole, "epoch {epoch} {topics:?}");
        for cut in 0..frame.len() {
            let decision = select(SHARE_FETCH, VERSION, &frame[..cut], frame.len(), &s);
            assert!(decision == Selection::NeedMore || decision == whole, "epoch {epoch} {topics:?} cut at {cut}: {decision:?}");
        }
    }
    let unknown = {
        let mut frame = share_fetch(1, 0, &["logs"]);
        let at = frame.windows(4).position(|w| w == b"logs").unwrap();
        frame[at] ^= 0xff; // an id the module never saw named
        frame
    };
    assert_eq!(select(SHARE_FETCH, VERSION, &unknown, unknown.len(), &s), Selection::HandOff);
    let v0 = share_fetch(1, 0, &["logs"]);
    assert_eq!(select(SHARE_FETCH, 0, &v0, v0.len(), &s), Selection::HandOff, "a version the walk does not read");
}

#[test]
fn a_share_answer_is_read_whole_for_its_topics_and_names_their_ids() {
    let s = selector();
    let whole = share_answer(1, &["logs", "audit"]);
    assert!(answer_unselected(SHARE_FETCH, &whole, VERSION, &s));
    assert!(!answer_unselected(SHARE_FETCH, &share_answer(1, &["logs", "s.x"]), VERSION, &s));
    for cut in 8..whole.len() {
        let mut short = whole[..cut].to_vec();
        short[..4].copy_from_slice(&((cut - 4) as i32).to_be_bytes());
        assert!(!answer_unselected(SHARE_FETCH, &short, VERSION, &s), "cut at {cut}");
    }
    let mut longer = whole.clone();
    longer.push(0);
    assert!(!answer_unselected(SHARE_FETCH, &longer, VERSION, &s), "trailing bytes");
    assert!(!answer_unselected(SHARE_FETCH, &whole, 2, &s), "a version the walk does not know");
    let names: Vec<String> = answer_named_ids(SHARE_FETCH, VERSION, &whole).into_iter().map(|(_, n)| n.to_string()).collect();
    assert_eq!(names, ["logs", "audit"]);
    let named: Vec<String> = named_ids(SHARE_FETCH, VERSION, &share_fetch(1, 0, &["logs", "s.a"]))
        .into_iter().map(|(_, n)| n.to_string()).collect();
    assert_eq!(named, ["logs", "s.a"]);
}

#[test]
fn a_share_session_stays_in_the_module_until_an_answer_names_a_selected_topic() {
    let mut s = session();
    // Opening the session on unselected topics: forwarded, the answer passes.
    let open = share_fetch(1, 0, &["logs"]);
    let (forwarded, handoffs) = request_round(&mut s, &open);
    assert_eq!(forwarded, open);
    assert!(handoffs.is_empty());
    let broker = share_answer(1, &["logs"]);
    assert_eq!(answer_round(&mut s, &broker).0, as_rewritten(1, &["logs"]));
    assert_eq!(s.stats.get(Counter::HandoffNotSelected), 1);

    // In the session: forwarded at once, judged by its answer.
    let next = share_fetch(2, 1, &["logs"]);
    let (forwarded, handoffs) = request_round(&mut s, &next);
    assert_eq!(forwarded, next);
    assert!(handoffs.is_empty());
    let broker = share_answer(2, &["logs", "audit"]);
    let (sent, handoffs) = answer_round(&mut s, &broker);
    assert_eq!(sent, as_rewritten(2, &["logs", "audit"]), "an answer of unselected topics goes on, only rewritten");
    assert!(handoffs.is_empty());
    assert_eq!(s.stats.get(Counter::HandoffByAnswer), 1);
    assert_eq!(s.stats.get(Counter::HandoffAnswerNotSelected), 1);

    // Another partition joined the session elsewhere: the answer names a selected topic.
    let later = share_fetch(3, 2, &[]);
    assert_eq!(request_round(&mut s, &later).0, later);
    let (sent, handoffs) = answer_round(&mut s, &share_answer(3, &["logs", "s.cards"]));
    assert!(sent.is_empty(), "nothing of it reaches the client before the service read it");
    assert_eq!(handoffs.len(), 1, "the request goes to the service first, replayed");
    assert_eq!(handoffs[0].direction, Direction::Request);
    assert_eq!(handoffs[0].frame.as_ref(), later.as_slice());
}
