//! The core fed whole streams split at every offset, both directions (h11's test_io).

mod common;

use common::*;
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::ApiKey;
use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::{Disposition, Output, ProtocolError, RequestPolicy, Requester, Session, SessionLimits};

/// Answers ApiVersions (18) itself, with a canned frame naming the correlation id.
struct AnswerApiVersions;

fn local_answer(correlation_id: i32) -> Vec<u8> {
    opaque_response(correlation_id, b"local")
}

impl RequestPolicy for AnswerApiVersions {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key == 18 {
            Disposition::Answer(local_answer(head.correlation_id))
        } else {
            Disposition::Forward
        }
    }
}

fn session() -> Session<AnswerApiVersions> {
    Session::with_policy(SessionLimits::default(), AnswerApiVersions)
}

/// Pipelined requests: Metadata v12, Produce acks=1, Produce acks=0 (no response),
/// ApiVersions (answered locally), Fetch v11 (passes), ApiVersions again.
fn request_stream() -> (Vec<u8>, Vec<u8>) {
    let parts = [
        request(3, 12, 1, &[0, 1, 0]),
        produce_request(2, 1, 300),
        produce_request(3, 0, 50),
        request(18, 3, 4, &[0, 0, 0]),
        request(1, 11, 5, &[7; 40]),
        request(18, 3, 6, &[0, 0, 0]),
    ];
    let stream = parts.concat();
    let forwarded = [&parts[0], &parts[1], &parts[2], &parts[4]].map(|p| p.as_slice()).concat();
    (stream, forwarded)
}

/// The broker's answers, in order: Metadata (to be rewritten), Produce, Fetch.
fn response_stream() -> Vec<u8> {
    [metadata_response(12, 1), opaque_response(2, &[9; 20]), opaque_response(5, &[3; 500])].concat()
}

fn feed_requests<P: RequestPolicy>(s: &mut Session<P>, chunks: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
    let (mut forwarded, mut to_client) = (Vec::new(), Vec::new());
    for chunk in chunks {
        let mut out = Output::default();
        s.feed_requests(chunk, &mut out).unwrap();
        forwarded.extend(bytes_of(chunk, &out));
        let mut local = Output::default();
        s.ready_responses(&mut local);
        to_client.extend(bytes_of(&[], &local));
    }
    (forwarded, to_client)
}

fn feed_responses<P: RequestPolicy>(s: &mut Session<P>, chunks: &[&[u8]]) -> Vec<u8> {
    let routes = routes();
    let mut to_client = Vec::new();
    for chunk in chunks {
        let mut out = Output::default();
        s.feed_responses(chunk, view(&routes), &mut out).unwrap();
        to_client.extend(bytes_of(chunk, &out));
    }
    to_client
}

/// What the client must see for `response_stream`, in request order.
fn expected_client_stream() -> Vec<Vec<u8>> {
    let mut s = session();
    let (requests, _) = request_stream();
    feed_requests(&mut s, &[&requests]);
    let out = feed_responses(&mut s, &[&response_stream()]);
    frames(&out)
}

#[test]
fn requests_split_at_every_offset_pass_unchanged_in_order() {
    let (stream, forwarded) = request_stream();
    for cut in 0..=stream.len() {
        let mut s = session();
        let (out, _) = feed_requests(&mut s, &[&stream[..cut], &stream[cut..]]);
        assert_eq!(out, forwarded, "cut at {cut}");
        assert_eq!(s.in_flight(), 5, "slots: every request but acks=0, cut at {cut}");
    }
}

#[test]
fn requests_fed_one_byte_at_a_time() {
    let (stream, forwarded) = request_stream();
    let mut s = session();
    let chunks: Vec<&[u8]> = stream.chunks(1).collect();
    let (out, to_client) = feed_requests(&mut s, &chunks);
    assert_eq!(out, forwarded);
    assert!(to_client.is_empty(), "local answers wait for the Metadata response before them");
}

#[test]
fn responses_split_at_every_offset_come_out_in_request_order() {
    let (requests, _) = request_stream();
    let responses = response_stream();
    let expected = expected_client_stream();
    // Metadata rewritten, Produce, local ApiVersions (4), Fetch, local ApiVersions (6).
    assert_eq!(expected.len(), 5);
    let (correlation, meta): (i32, MetadataResponse) = decode_response(ApiKey::Metadata, 12, &expected[0]);
    assert_eq!(correlation, 1);
    assert!(meta.brokers.iter().all(|b| b.host.as_str() == GATEWAY_HOST));
    assert_eq!(meta.brokers.iter().map(|b| b.port).collect::<Vec<_>>(), [19092, 19093]);
    assert_eq!(expected[1], opaque_response(2, &[9; 20]));
    assert_eq!(expected[2], local_answer(4));
    assert_eq!(expected[3], opaque_response(5, &[3; 500]));
    assert_eq!(expected[4], local_answer(6));
    for cut in 0..=responses.len() {
        let mut s = session();
        feed_requests(&mut s, &[&requests]);
        let out = feed_responses(&mut s, &[&responses[..cut], &responses[cut..]]);
        assert_eq!(frames(&out), expected, "cut at {cut}");
        assert_eq!(s.in_flight(), 0);
        assert_eq!(s.held_bytes(), 0);
    }
}

#[test]
fn interleaved_directions_keep_request_order() {
    let (requests, _) = request_stream();
    let responses = response_stream();
    let expected = expected_client_stream().concat();
    // Requests and responses interleave at every pair of request/response cut points
    // (a response can only come after its request).
    let request_frames = frames(&requests);
    let response_frames = frames(&responses);
    let first_two_requests = [request_frames[0].clone(), request_frames[1].clone()].concat();
    for cut in 0..=first_two_requests.len() {
        let mut s = session();
        let mut to_client = Vec::new();
        let (_, local) = feed_requests(&mut s, &[&first_two_requests[..cut], &first_two_requests[cut..]]);
        to_client.extend(local);
        to_client.extend(feed_responses(&mut s, &[&response_frames[0]]));
        let rest: Vec<u8> = request_frames[2..].concat();
        let (_, local) = feed_requests(&mut s, &[&rest]);
        to_client.extend(local);
        to_client.extend(feed_responses(&mut s, &[&response_frames[1], &response_frames[2]]));
        assert_eq!(to_client, expected, "cut at {cut}");
    }
}

#[test]
fn a_local_answer_at_the_front_leaves_at_once() {
    let mut s = session();
    let (forwarded, to_client) = feed_requests(&mut s, &[&request(18, 3, 9, &[0, 0, 0])]);
    assert!(forwarded.is_empty());
    assert_eq!(to_client, local_answer(9));
    assert_eq!(s.stats.get(Counter::LocalAnswers), 1);
}

#[test]
fn responses_pass_through_without_copies() {
    let mut s = Session::new(SessionLimits::default());
    let mut out = Output::default();
    let req = produce_request(1, 1, 10);
    s.feed_requests(&req, &mut out).unwrap();
    assert!(out.is_whole(req.len()), "a pass-through request is its own input");
    let resp = opaque_response(1, &[1; 100]);
    let routes = routes();
    let mut out = Output::default();
    s.feed_responses(&resp, view(&routes), &mut out).unwrap();
    assert!(out.is_whole(resp.len()), "a pass-through response is its own input");
}

#[test]
fn out_of_order_or_unasked_responses_are_violations() {
    let routes = routes();
    let mut s = Session::new(SessionLimits::default());
    let mut out = Output::default();
    let err = s.feed_responses(&opaque_response(1, b""), view(&routes), &mut out).unwrap_err();
    assert_eq!(err, ProtocolError::UnexpectedResponse { correlation_id: 1, expected: None });
    let mut s = Session::new(SessionLimits::default());
    s.feed_requests(&request(3, 12, 7, &[0, 1, 0]), &mut out).unwrap();
    let err = s.feed_responses(&opaque_response(8, b""), view(&routes), &mut out).unwrap_err();
    assert_eq!(err, ProtocolError::UnexpectedResponse { correlation_id: 8, expected: Some(7) });
}

#[test]
fn frames_beyond_the_limit_close_before_any_byte_is_held() {
    let mut s = Session::new(SessionLimits { max_frame_size: 64 });
    let mut out = Output::default();
    let err = s.feed_requests(&produce_request(1, 1, 100)[..4], &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { max: 64, .. }));
    let mut s = Session::new(SessionLimits { max_frame_size: 64 });
    s.feed_requests(&request(3, 12, 1, &[0, 1, 0]), &mut out).unwrap();
    let routes = routes();
    let err = s.feed_responses(&opaque_response(1, &[0; 100])[..4], view(&routes), &mut out).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { .. }));
}

#[test]
fn a_sasl_handshake_v0_is_answered_unsupported_and_the_stream_stays_readable() {
    // After a v0 handshake a client sends raw SASL tokens, then requests again: the
    // module cannot tell them apart, and went on passing everything unread (every rule
    // bypassed). It answers the v0 handshake itself now; what follows is read as ever.
    let mut s = Session::new(SessionLimits::default());
    let routes = routes();
    let mut out = Output::default();
    let handshake = request(17, 0, 1, &[0, 5, b'P', b'L', b'A', b'I', b'N']);
    let metadata = request(3, 12, 2, &[0, 1, 0]);
    let stream = [handshake, metadata.clone()].concat();
    s.feed_requests(&stream, &mut out).unwrap();
    assert_eq!(bytes_of(&stream, &out), metadata, "the handshake never reaches the broker");
    let mut out = Output::default();
    s.feed_responses(&[], view(&routes), &mut out).unwrap();
    assert_eq!(bytes_of(&[], &out), vec![0, 0, 0, 10, 0, 0, 0, 1, 0, 35, 0, 0, 0, 0]);
    assert_eq!(s.stats.get(Counter::LocalAnswers), 1);
}
