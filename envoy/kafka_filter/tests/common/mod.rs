//! Frames for the tests, built with kafka-protocol (an independent encoder).
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use std::sync::Arc;

use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::topics::{learn_topic_id, TopicSelector};
use keg_kafka_filter::core::rewrite::{Endpoint, RouteView, Routes};
use keg_kafka_filter::core::{Disposition, HandOff, Output, Piece, RequestPolicy, Requester, Session};

pub const GATEWAY_HOST: &str = "gateway.test";

pub fn routes() -> Routes {
    let mut routes = Routes::default();
    for node in 1..=3 {
        routes.gateway.insert(node, Endpoint { host: GATEWAY_HOST.into(), port: 19091 + node });
        routes.broker.insert(Endpoint { host: format!("kafka-{node}"), port: 9092 }, node);
    }
    routes
}

pub fn view(routes: &Routes) -> RouteView<'_> {
    RouteView { routes, own_listener: None }
}

pub fn sized(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// A request frame: header v1 (client id "t"), then `body`.
pub fn request(api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(api_key.to_be_bytes());
    b.extend(version.to_be_bytes());
    b.extend(correlation_id.to_be_bytes());
    b.extend(1i16.to_be_bytes());
    b.push(b't');
    b.extend_from_slice(body);
    sized(&b)
}

/// A Produce v7 request (header v1) with `acks` and `payload` bytes of "records".
pub fn produce_request(correlation_id: i32, acks: i16, payload: usize) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend((-1i16).to_be_bytes()); // no transactional id
    body.extend(acks.to_be_bytes());
    body.extend(30_000i32.to_be_bytes());
    body.extend(std::iter::repeat_n(0xab, payload));
    request(0, 7, correlation_id, &body)
}

/// A response frame whose body is opaque bytes (header v0).
pub fn opaque_response(correlation_id: i32, body: &[u8]) -> Vec<u8> {
    let mut b = correlation_id.to_be_bytes().to_vec();
    b.extend_from_slice(body);
    sized(&b)
}

pub fn encode_response<M: Encodable>(key: ApiKey, version: i16, correlation_id: i32, message: &M) -> Vec<u8> {
    let mut buf = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, key.response_header_version(version))
        .unwrap();
    message.encode(&mut buf, version).unwrap();
    sized(&buf)
}

pub fn decode_response<M: Decodable>(key: ApiKey, version: i16, frame: &[u8]) -> (i32, M) {
    let size = i32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
    assert_eq!(size, frame.len() - 4, "size prefix");
    let mut buf = Bytes::copy_from_slice(&frame[4..]);
    let header = ResponseHeader::decode(&mut buf, key.response_header_version(version)).unwrap();
    let message = M::decode(&mut buf, version).unwrap();
    assert!(buf.is_empty(), "trailing bytes");
    (header.correlation_id, message)
}

pub fn metadata_response(version: i16, correlation_id: i32) -> Vec<u8> {
    use kafka_protocol::messages::metadata_response::{MetadataResponse, MetadataResponseBroker};
    let brokers = (1..=2)
        .map(|node| MetadataResponseBroker::default()
            .with_node_id(BrokerId(node))
            .with_host(StrBytes::from_string(format!("kafka-{node}")))
            .with_port(9092))
        .collect();
    let message = MetadataResponse::default().with_brokers(brokers).with_controller_id(BrokerId(1));
    encode_response(ApiKey::Metadata, version, correlation_id, &message)
}

/// The bytes an output stands for.
pub fn bytes_of(input: &[u8], out: &Output) -> Vec<u8> {
    let mut v = Vec::new();
    for piece in &out.pieces {
        match piece {
            Piece::Input(r) => v.extend_from_slice(&input[r.clone()]),
            Piece::Owned(b) => v.extend_from_slice(b),
            Piece::HandOff(id) => panic!("hand-off {id} escaped the session"),
        }
    }
    v
}

/// Splits `stream` into frames by their size prefixes.
pub fn frames(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < stream.len() {
        let size = i32::from_be_bytes(stream[pos..pos + 4].try_into().unwrap()) as usize;
        out.push(stream[pos..pos + 4 + size].to_vec());
        pos += 4 + size;
    }
    out
}

/// A topic id, learned as the module learns it from Metadata answers.
pub fn topic_id(name: &str) -> uuid::Uuid {
    let mut bytes = [7u8; 16];
    bytes[..name.len().min(16)].copy_from_slice(&name.as_bytes()[..name.len().min(16)]);
    learn_topic_id(bytes, name);
    uuid::Uuid::from_bytes(bytes)
}

/// A Fetch answer: partition 0 of each topic (by id from v13) with `records`, and with
/// `error_partition` a partition 1 answered with an error.
pub fn fetch_answer(correlation_id: i32, version: i16, topics: &[(&str, Vec<u8>)], error_partition: bool) -> Vec<u8> {
    let responses = topics.iter().map(|(name, records)| {
        let mut partitions = vec![PartitionData::default().with_partition_index(0).with_high_watermark(10)
            .with_aborted_transactions(Some(vec![AbortedTransaction::default().with_producer_id(kafka_protocol::messages::ProducerId(9)).with_first_offset(0)]))
            .with_records(Some(Bytes::from(records.clone())))];
        if error_partition {
            // An error answer: its records are not read (none reach the consumer).
            partitions.push(PartitionData::default().with_partition_index(1).with_error_code(6)
                .with_records(Some(Bytes::from_static(b"not records"))));
        }
        let topic = FetchableTopicResponse::default().with_partitions(partitions);
        if version >= 13 {
            topic.with_topic_id(topic_id(name))
        } else {
            topic.with_topic(TopicName(StrBytes::from_string(name.to_string())))
        }
    }).collect();
    encode_response(ApiKey::Fetch, version, correlation_id, &FetchResponse::default().with_responses(responses))
}

/// A Fetch request of partitions 0 and 1 of `topics` (by id from v13) in session epoch
/// `epoch` (-1: no session; above 0: incremental, session 42), asking for 1 MiB (within
/// `HANDOFF_FETCH_MAX_BYTES`: the module passes it unchanged).
pub fn fetch_request_in(correlation_id: i32, version: i16, epoch: i32, topics: &[&str]) -> Vec<u8> {
    fetch_request_asking(correlation_id, version, epoch, topics, 1 << 20)
}

/// [`fetch_request_in`] asking for `max_bytes`.
pub fn fetch_request_asking(correlation_id: i32, version: i16, epoch: i32, topics: &[&str], max_bytes: i32) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default().with_request_api_key(1).with_request_api_version(version).with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("t")))
        .encode(&mut buf, ApiKey::Fetch.request_header_version(version)).unwrap();
    let topics = topics.iter().map(|name| {
        let topic = FetchTopic::default().with_partitions(vec![FetchPartition::default().with_partition(0),
                                                               FetchPartition::default().with_partition(1)]);
        if version >= 13 {
            topic.with_topic_id(topic_id(name))
        } else {
            topic.with_topic(TopicName(StrBytes::from_string(name.to_string())))
        }
    }).collect();
    FetchRequest::default().with_max_bytes(max_bytes).with_session_id(if epoch > 0 { 42 } else { 0 }).with_session_epoch(epoch)
        .with_topics(topics).encode(&mut buf, version).unwrap();
    sized(&buf)
}

/// Requests of one API by topic (`s.*` selected, e.g. a consume-time mask rule); the
/// rest are forwarded.
pub struct SelectS {
    pub api_key: i16,
    pub selector: Arc<TopicSelector>,
}

impl SelectS {
    pub fn new(api_key: i16) -> SelectS {
        SelectS { api_key, selector: Arc::new(TopicSelector::parse(serde_json::json!({"prefix": ["s."]})).unwrap()) }
    }
}

impl RequestPolicy for SelectS {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key == self.api_key {
            Disposition::Select { fail_open: false, selector: self.selector.clone(), vouching: None }
        } else {
            Disposition::Forward
        }
    }
}

/// Feeds a request: what reached the broker at once, and the hand-offs.
pub fn request_round<P: RequestPolicy>(s: &mut Session<P>, request: &[u8]) -> (Vec<u8>, Vec<HandOff>) {
    let mut out = Output::default();
    s.feed_requests(request, &mut out).unwrap();
    (bytes_of(request, &out), s.take_handoffs())
}

/// Feeds `stream` in two reads, cut at `cut`: what reached the broker, and the hand-offs.
pub fn requests_cut_at<P: RequestPolicy>(s: &mut Session<P>, stream: &[u8], cut: usize) -> (Vec<u8>, Vec<HandOff>) {
    let (mut forwarded, mut handed) = request_round(s, &stream[..cut]);
    let (later, more) = request_round(s, &stream[cut..]);
    forwarded.extend(later);
    handed.extend(more);
    (forwarded, handed)
}

/// Feeds a broker answer: what reached the client at once, and the hand-offs.
pub fn answer_round<P: RequestPolicy>(s: &mut Session<P>, answer: &[u8]) -> (Vec<u8>, Vec<HandOff>) {
    let routes = routes();
    let mut out = Output::default();
    s.feed_responses(answer, view(&routes), &mut out).unwrap();
    (bytes_of(answer, &out), s.take_handoffs())
}
