//! Frames handed to the Python service and what its answers (or their absence) mean,
//! without I/O: the session makes [`HandOff`]s, the caller delivers them and brings
//! each one's [`Resolution`] back (see `docs/native.md` and the hand-off protocol).

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable};

use super::head::PRODUCE;
use super::topics::FETCH;
use super::vouch::Vouch;

/// Kafka's REQUEST_TIMED_OUT: retriable, the producer sends the batch again.
pub const REQUEST_TIMED_OUT: i16 = 7;
/// Kafka's NOT_LEADER_OR_FOLLOWER: a consumer refreshes its metadata and fetches the
/// partition again (librdkafka and Kafka's Java consumer both handle it themselves; an
/// unexpected code would reach the application, as an exception in Java).
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A request, client -> broker (`read_data` on the stream).
    Request,
    /// A broker's response the service asked for (`write_data`).
    Response,
}

/// One frame for the Python service.
#[derive(Debug, Clone)]
pub struct HandOff {
    /// Per connection, increasing; answers come back in the order frames are taken
    /// (a broker's answer may be taken before requests made earlier).
    pub id: u64,
    pub direction: Direction,
    /// The whole frame, size prefix included.
    pub frame: Bytes,
    pub api_key: i16,
    pub api_version: i16,
    /// The connection's principal when the broker authenticated one (`User:alice`).
    pub principal: Option<String>,
    pub security_protocol: &'static str,
}

/// Hand-offs one connection may have unanswered before it stops reading from its
/// client. A broker reads a connection's next request only once it answered the last
/// one; a client pipelining thousands of requests a rule needs would otherwise queue
/// them all on the service's stream, where the last ones outwait the hand-off timeout
/// (counted from when each is sent) and the connection fails closed.
pub const MAX_PENDING_PER_CONNECTION: usize = 64;

/// Frames a connection a throttle holds back may have read and not answered before it
/// stops reading from its client (its bytes are bounded as ever). Kafka does not read a
/// muted channel, but its clients wait out the throttle; librdkafka pipelines on
/// (`max.in.flight` 1,000,000 when not idempotent), and a connection that stopped
/// reading at [`MAX_PENDING_PER_CONNECTION`] frames never saw its client go: a killed
/// producer's requests read before then went on at the rate for minutes (6,700 records
/// in 3 minutes), a timed-out one's were stored twice. Read on, the client's end is
/// seen and drops what the throttle holds ([`crate::ffi`]).
pub const MAX_HELD_PER_CONNECTION: usize = 4096;

/// How much a connection may have awaiting answers before it stops reading from its
/// client: see [`reading_paused`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBound {
    pub max_bytes: usize,
    pub max_frames: usize,
}

/// Whether a connection should stop (or keep stopped) reading from its client, given
/// what it has handed off and not had answered: more than `max_bytes` or than
/// `max_frames` frames ([`MAX_PENDING_PER_CONNECTION`], or [`MAX_HELD_PER_CONNECTION`]
/// while a throttle holds some) stops it; it reads again at half of both.
pub fn reading_paused(paused: bool, awaiting_bytes: usize, pending: usize, max_bytes: usize, max_frames: usize) -> bool {
    if paused {
        awaiting_bytes > max_bytes / 2 || pending > max_frames / 2
    } else {
        awaiting_bytes > max_bytes || pending > max_frames
    }
}

/// Why a hand-off has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer within the hand-off timeout.
    Timeout,
    /// No endpoint could be reached, or the stream broke.
    Unavailable,
    /// The process-wide bound of bytes in flight was reached: not handed off at all.
    Overloaded,
}

/// What became of a hand-off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The reply to a request: the bytes for the broker (empty: nothing goes), the
    /// gateway's own answer (goes to the client in the request's turn), and whether the
    /// broker's response must be handed off too.
    /// `vouched`: schema ids the service passes, per topic ([`super::vouch`]).
    Request { forward: Vec<u8>, answer: Option<Vec<u8>>, want_response: bool, vouched: Vec<Vouch> },
    /// The reply to a response: what the client gets instead.
    Response { answer: Vec<u8>, vouched: Vec<Vouch> },
    /// No reply: fail-open forwards the frame as it was; fail-closed answers a request
    /// with a retriable error where the module can build one, else closes.
    Failed(Failure),
    /// The service asked to close the connection.
    Close,
}

/// What answers a frame whose hand-off failed closed, where the module can build one: a
/// retriable error the client retries by itself, in the API's own answer. A Produce
/// request: REQUEST_TIMED_OUT for each partition. A Fetch request, or the broker's
/// answer to one: NOT_LEADER_OR_FOLLOWER for each partition, without records, and no
/// fetch session (the consumer opens a new one). None: the connection closes.
pub fn retriable_answer(direction: Direction, api_key: i16, api_version: i16, frame: &[u8]) -> Option<Vec<u8>> {
    match (direction, api_key) {
        (Direction::Request, PRODUCE) => produce_timed_out(frame, api_version),
        (Direction::Request, FETCH) => fetch_refused(frame, api_version),
        (Direction::Response, FETCH) => fetch_answer_refused(frame, api_version),
        _ => None,
    }
}

/// A Produce response with REQUEST_TIMED_OUT for every partition of `frame` (a whole
/// Produce request); None when the module cannot read that request.
fn produce_timed_out(frame: &[u8], api_version: i16) -> Option<Vec<u8>> {
    if !super::topics::produce_is_bounded(frame, api_version) {
        return None;
    }
    let (header, request) = read_request::<ProduceRequest>(frame, ApiKey::Produce, api_version)?;
    let responses = request.topic_data.into_iter().map(|topic| TopicProduceResponse::default()
        .with_name(topic.name)
        .with_topic_id(topic.topic_id)
        .with_partition_responses(topic.partition_data.into_iter().map(|p| PartitionProduceResponse::default()
            .with_index(p.index)
            .with_error_code(REQUEST_TIMED_OUT)
            .with_base_offset(-1)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(-1)).collect()))
        .collect();
    let response = ProduceResponse::default().with_responses(responses);
    write_response(header.correlation_id, ApiKey::Produce, api_version, &response)
}

/// A Fetch response refusing every partition a Fetch request names.
fn fetch_refused(frame: &[u8], api_version: i16) -> Option<Vec<u8>> {
    if !super::topics::fetch_is_bounded(frame, api_version) {
        return None;
    }
    let (header, request) = read_request::<FetchRequest>(frame, ApiKey::Fetch, api_version)?;
    let responses = request.topics.into_iter().map(|topic| FetchableTopicResponse::default()
        .with_topic(topic.topic)
        .with_topic_id(topic.topic_id)
        .with_partitions(topic.partitions.iter().map(|p| refused_partition(p.partition)).collect()))
        .collect();
    let response = FetchResponse::default().with_session_id(0).with_responses(responses);
    write_response(header.correlation_id, ApiKey::Fetch, api_version, &response)
}

/// The broker's answer to a Fetch with every partition refused (its records dropped).
fn fetch_answer_refused(frame: &[u8], api_version: i16) -> Option<Vec<u8>> {
    let key = ApiKey::Fetch;
    if frame.len() < 4 || !knows(key, api_version) {
        return None;
    }
    let mut buf = Bytes::copy_from_slice(&frame[4..]);
    let header = ResponseHeader::decode(&mut buf, key.response_header_version(api_version)).ok()?;
    let mut response = FetchResponse::decode(&mut buf, api_version).ok()?;
    response.session_id = 0;
    for topic in &mut response.responses {
        for partition in &mut topic.partitions {
            *partition = refused_partition(partition.partition_index);
        }
    }
    write_response(header.correlation_id, key, api_version, &response)
}

fn refused_partition(index: i32) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(NOT_LEADER_OR_FOLLOWER)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_records(Some(Bytes::new())) // empty, never null: librdkafka reads null as malformed
}

/// Whether kafka-protocol reads this version of the API.
fn knows(key: ApiKey, api_version: i16) -> bool {
    let range = key.valid_versions();
    (range.min..=range.max).contains(&api_version)
}

/// A whole request frame (size prefix included) read by kafka-protocol.
fn read_request<T: Decodable>(frame: &[u8], key: ApiKey, api_version: i16) -> Option<(RequestHeader, T)> {
    if frame.len() < 4 || !knows(key, api_version) {
        return None;
    }
    let mut buf = Bytes::copy_from_slice(&frame[4..]);
    let header = RequestHeader::decode(&mut buf, key.request_header_version(api_version)).ok()?;
    let body = T::decode(&mut buf, api_version).ok()?;
    Some((header, body))
}

/// A whole response frame: size, header, body.
fn write_response<T: Encodable>(correlation_id: i32, key: ApiKey, api_version: i16, body: &T) -> Option<Vec<u8>> {
    let mut out = BytesMut::with_capacity(128);
    out.extend_from_slice(&[0; 4]);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut out, key.response_header_version(api_version))
        .ok()?;
    body.encode(&mut out, api_version).ok()?;
    let size = i32::try_from(out.len() - 4).ok()?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Some(out.to_vec())
}

#[cfg(test)]
mod tests {
    use super::{reading_paused, MAX_HELD_PER_CONNECTION as HELD, MAX_PENDING_PER_CONNECTION as MAX};

    #[test]
    fn reading_stops_past_either_bound_and_resumes_below_half_of_both() {
        let bytes = 1 << 20;
        assert!(!reading_paused(false, bytes, MAX, bytes, MAX));
        assert!(reading_paused(false, bytes + 1, 0, bytes, MAX));
        assert!(reading_paused(false, 0, MAX + 1, bytes, MAX)); // thousands of tiny frames
        assert!(reading_paused(true, 0, MAX / 2 + 1, bytes, MAX));
        assert!(reading_paused(true, bytes / 2 + 1, 0, bytes, MAX));
        assert!(!reading_paused(true, bytes / 2, MAX / 2, bytes, MAX));
        // A throttled connection reads on past MAX frames, to see its client's end.
        assert!(!reading_paused(false, 0, MAX + 1, bytes, HELD));
        assert!(!reading_paused(true, 0, MAX + 1, bytes, HELD));
        assert!(reading_paused(false, 0, HELD + 1, bytes, HELD));
        assert!(reading_paused(false, bytes + 1, 1, bytes, HELD));
    }
}
