//! The hand-off state machine of the core, without Envoy and without a service: frames
//! handed off keep their place in both directions whatever arrives meanwhile, answers
//! replace them once, and the absence of an answer fails open or closed.

mod common;

use bytes::{Bytes, BytesMut};
use common::*;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use keg_kafka_filter::core::handoff::{Failure, ReadBound, MAX_PENDING_PER_CONNECTION, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT};
use keg_kafka_filter::core::head::RequestHead;
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::who::ClientId;
use keg_kafka_filter::core::{Direction, Disposition, HandOff, Output, ProtocolError, RequestPolicy, Requester, Resolution, Session, SessionLimits};

/// Hands off Produce (0), forwards everything else.
struct HandOffProduce {
    fail_open: bool,
}

impl RequestPolicy for HandOffProduce {
    fn decide(&mut self, head: &RequestHead, _: &Requester<'_>) -> Disposition {
        if head.api_key == 0 {
            Disposition::HandOff { fail_open: self.fail_open }
        } else {
            Disposition::Forward
        }
    }
}

fn session(fail_open: bool) -> Session<HandOffProduce> {
    Session::with_policy(SessionLimits::default(), HandOffProduce { fail_open })
}

/// A Produce request kafka-protocol can read (v9, header v2), two partitions.
fn produce(correlation_id: i32, acks: i16) -> Vec<u8> {
    let version = 9;
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(0)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("t")))
        .encode(&mut buf, ApiKey::Produce.request_header_version(version))
        .unwrap();
    let partitions = (0..2).map(|i| PartitionProduceData::default()
        .with_index(i)
        .with_records(Some(Bytes::from(vec![i as u8; 64])))).collect();
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("orders")))
            .with_partition_data(partitions)])
        .encode(&mut buf, version)
        .unwrap();
    sized(&buf)
}

/// Forwarded requests and hand-offs of feeding `chunks`, resolving each hand-off with
/// `answer` as soon as it appears (`eager`) or after the last chunk.
fn run_requests(s: &mut Session<HandOffProduce>, chunks: &[&[u8]], eager: bool,
                answer: &dyn Fn(&HandOff) -> Resolution) -> (Vec<u8>, Vec<u8>, Vec<HandOff>) {
    let (mut forwarded, mut to_client, mut handed) = (Vec::new(), Vec::new(), Vec::new());
    let mut deferred = Vec::new();
    for chunk in chunks {
        let mut out = Output::default();
        s.feed_requests(chunk, &mut out).unwrap();
        forwarded.extend(bytes_of(chunk, &out));
        for h in s.take_handoffs() {
            if eager {
                s.resolve(h.id, answer(&h)).unwrap();
            } else {
                deferred.push(h.clone());
            }
            handed.push(h);
        }
        drain(s, &mut forwarded, &mut to_client);
    }
    for h in deferred {
        s.resolve(h.id, answer(&h)).unwrap();
        drain(s, &mut forwarded, &mut to_client);
    }
    (forwarded, to_client, handed)
}

fn drain(s: &mut Session<HandOffProduce>, forwarded: &mut Vec<u8>, to_client: &mut Vec<u8>) {
    let mut out = Output::default();
    s.ready_requests(&mut out);
    forwarded.extend(bytes_of(&[], &out));
    let mut out = Output::default();
    s.ready_responses(&mut out);
    to_client.extend(bytes_of(&[], &out));
}

/// Python's answer: the frame with its last byte changed (a "masked" record), and
/// want_response on acks=1 Produce.
fn masked(h: &HandOff) -> Resolution {
    match h.direction {
        Direction::Request => {
            let mut frame = h.frame.to_vec();
            *frame.last_mut().unwrap() ^= 0xff;
            Resolution::Request { forward: frame, answer: None, want_response: true, vouched: vec![] }
        }
        Direction::Response => {
            let mut frame = h.frame.to_vec();
            frame.extend_from_slice(b"!");
            let size = (frame.len() - 4) as i32;
            frame[..4].copy_from_slice(&size.to_be_bytes());
            Resolution::Response { answer: frame, vouched: vec![] }
        }
    }
}

fn masked_frame(frame: &[u8]) -> Vec<u8> {
    let mut frame = frame.to_vec();
    *frame.last_mut().unwrap() ^= 0xff;
    frame
}

/// Metadata, Produce acks=1 (handed off), ApiVersions, Produce acks=0 (handed off), Fetch.
fn request_stream() -> Vec<Vec<u8>> {
    vec![
        request(3, 12, 1, &[0, 1, 0]),
        produce(2, 1),
        request(18, 3, 3, &[0, 0, 0]),
        produce(4, 0),
        request(1, 11, 5, &[7; 40]),
    ]
}

#[test]
fn requests_split_at_every_offset_keep_their_order_around_handoffs() {
    let parts = request_stream();
    let stream = parts.concat();
    let expected = [parts[0].clone(), masked_frame(&parts[1]), parts[2].clone(), masked_frame(&parts[3]), parts[4].clone()].concat();
    for eager in [true, false] {
        for cut in 0..=stream.len() {
            let mut s = session(false);
            let (forwarded, to_client, handed) = run_requests(&mut s, &[&stream[..cut], &stream[cut..]], eager, &masked);
            assert_eq!(forwarded, expected, "cut at {cut}, eager {eager}");
            assert!(to_client.is_empty());
            assert_eq!(handed.iter().map(|h| h.frame.to_vec()).collect::<Vec<_>>(), [parts[1].clone(), parts[3].clone()]);
            assert_eq!(s.in_flight(), 4, "every request but acks=0 has its slot");
            assert_eq!((s.pending_handoffs(), s.handoff_bytes()), (0, 0));
        }
    }
}

#[test]
fn nothing_overtakes_a_pending_request() {
    let parts = request_stream();
    let mut s = session(false);
    let mut out = Output::default();
    let stream = parts.concat();
    s.feed_requests(&stream, &mut out).unwrap();
    assert_eq!(bytes_of(&stream, &out), parts[0], "only what precedes the hand-off leaves");
    let handed = s.take_handoffs();
    assert_eq!(handed.len(), 2, "hand-offs are pipelined, not one at a time");
    assert!(s.requests_waiting());
    // The second answer first (it cannot be, on one stream, but the core does not care):
    // nothing leaves until the first one is back.
    s.resolve(handed[1].id, masked(&handed[1])).unwrap();
    let mut ready = Output::default();
    s.ready_requests(&mut ready);
    assert!(ready.is_empty());
    s.resolve(handed[0].id, masked(&handed[0])).unwrap();
    s.ready_requests(&mut ready);
    assert_eq!(bytes_of(&[], &ready), [masked_frame(&parts[1]), parts[2].clone(), masked_frame(&parts[3]), parts[4].clone()].concat());
    assert!(!s.requests_waiting());
}

#[test]
fn at_most_a_window_of_handoffs_is_sent_and_each_answer_lets_one_more_go() {
    // A client pipelining far more requests than the window: the service answers a
    // connection's frames one at a time, and the timeout runs from when one is sent.
    let count = MAX_PENDING_PER_CONNECTION * 3;
    let stream: Vec<u8> = (0..count).flat_map(|i| produce(i as i32 + 1, 1)).collect();
    let mut s = session(false);
    let mut out = Output::default();
    s.feed_requests(&stream, &mut out).unwrap();
    assert_eq!(s.pending_handoffs(), count);
    let mut sent = s.take_handoffs();
    assert_eq!(sent.len(), MAX_PENDING_PER_CONNECTION);
    assert!(s.take_handoffs().is_empty(), "none more before an answer");
    let (mut forwarded, mut to_client) = (Vec::new(), Vec::new());
    let mut answered = 0;
    while let Some(h) = (!sent.is_empty()).then(|| sent.remove(0)) {
        s.resolve(h.id, masked(&h)).unwrap();
        answered += 1;
        let more = s.take_handoffs();
        assert!(more.len() <= 1 && sent.len() + more.len() <= MAX_PENDING_PER_CONNECTION);
        sent.extend(more);
        drain(&mut s, &mut forwarded, &mut to_client);
    }
    assert_eq!(answered, count);
    let expected: Vec<u8> = (0..count).flat_map(|i| masked_frame(&produce(i as i32 + 1, 1))).collect();
    assert_eq!(forwarded, expected, "every request, in order");
}

#[test]
fn the_brokers_answer_is_handed_off_at_once_whatever_requests_wait_behind_the_window() {
    // A librdkafka producer pipelined hundreds of requests into a throttle: the window
    // was full of requests held for the rate, and the answer to one forwarded before
    // waited behind them (no answer for 20 s: it timed out and sent again).
    let mut s = session(false);
    let (_, mut first) = request_round(&mut s, &produce(1, 1));
    let h = first.remove(0);
    s.resolve(h.id, Resolution::Request { forward: h.frame.to_vec(), answer: None, want_response: true, vouched: vec![] })
        .unwrap();
    let queued: Vec<u8> = (0..MAX_PENDING_PER_CONNECTION + 10).flat_map(|i| produce(i as i32 + 2, 1)).collect();
    let (_, held) = request_round(&mut s, &queued);
    assert_eq!(held.len(), MAX_PENDING_PER_CONNECTION, "the window is full, none answered");
    let answer = encode_response(ApiKey::Produce, 9, 1, &ProduceResponse::default());
    let (to_client, handed) = answer_round(&mut s, &answer);
    assert!(to_client.is_empty(), "the answer goes to the service first");
    assert_eq!(handed.iter().map(|h| h.direction).collect::<Vec<_>>(), [Direction::Response]);
    s.resolve(handed[0].id, Resolution::Response { answer: answer.clone(), vouched: vec![] }).unwrap();
    let mut out = Output::default();
    s.ready_responses(&mut out);
    assert_eq!(bytes_of(&[], &out), answer, "the client has its answer while the requests wait");
    // The requests past the window still go in order, one per answer.
    s.resolve(held[0].id, masked(&held[0])).unwrap();
    let more = s.take_handoffs();
    assert_eq!(more.len(), 1);
    assert!(more[0].id > held.last().unwrap().id);
}

#[test]
fn past_the_window_a_session_takes_no_more_requests_and_takes_the_rest_when_fed_again() {
    // A client pipelining requests it never read answers to: one read of Envoy's held
    // 41,943 Metadata requests, all taken at once, each a hand-off; the service was
    // busy with them for minutes after the client had gone.
    let bound = Some(ReadBound { max_bytes: 64 << 20, max_frames: MAX_PENDING_PER_CONNECTION });
    let count = 1_000;
    let stream: Vec<u8> = (0..count).flat_map(|i| produce(i as i32 + 1, 1)).collect();
    let mut s = session(false);
    let (mut forwarded, mut to_client) = (Vec::new(), Vec::new());
    let mut rest: &[u8] = &stream;
    let mut rounds = 0;
    while !rest.is_empty() {
        rounds += 1;
        let mut out = Output::default();
        let taken = s.feed_requests_within(rest, &mut out, bound).unwrap();
        assert!(taken > 0 || s.pending_handoffs() > 0, "it stops only with answers to wait for");
        assert!(s.pending_handoffs() <= MAX_PENDING_PER_CONNECTION + 1,
                "{} hand-offs made from one read", s.pending_handoffs());
        forwarded.extend(bytes_of(rest, &out));
        rest = &rest[taken..];
        for h in s.take_handoffs() {
            s.resolve(h.id, masked(&h)).unwrap();
        }
        drain(&mut s, &mut forwarded, &mut to_client);
    }
    assert!(rounds > count / (MAX_PENDING_PER_CONNECTION + 1), "{rounds} reads");
    let expected: Vec<u8> = (0..count).flat_map(|i| masked_frame(&produce(i as i32 + 1, 1))).collect();
    assert_eq!(forwarded, expected, "every request once, in order");
    // Without a bound (or with nothing awaiting answers) everything is taken.
    let mut out = Output::default();
    assert_eq!(session(false).feed_requests_within(&stream, &mut out, None).unwrap(), stream.len());
}

/// The broker's answers to the forwarded requests of `request_stream`, in order.
fn response_stream() -> Vec<Vec<u8>> {
    vec![metadata_response(12, 1), opaque_response(2, &[9; 20]), opaque_response(3, &[1; 10]), opaque_response(5, &[3; 500])]
}

#[test]
fn a_response_handed_off_keeps_its_place_split_at_every_offset() {
    let requests = request_stream().concat();
    let responses = response_stream();
    let stream = responses.concat();
    let routes = routes();
    for cut in 0..=stream.len() {
        let mut s = session(false);
        run_requests(&mut s, &[&requests], true, &masked);
        let (mut to_client, mut handed) = (Vec::new(), Vec::new());
        for chunk in [&stream[..cut], &stream[cut..]] {
            let mut out = Output::default();
            s.feed_responses(chunk, view(&routes), &mut out).unwrap();
            to_client.extend(bytes_of(chunk, &out));
            handed.extend(s.take_handoffs());
        }
        assert_eq!(handed.len(), 1, "the Produce response, asked for by want_response");
        assert_eq!(handed[0].direction, Direction::Response);
        assert_eq!(handed[0].frame.to_vec(), responses[1]);
        assert_eq!(frames(&to_client).len(), 1, "the Metadata answer leaves, the rest waits");
        s.resolve(handed[0].id, masked(&handed[0])).unwrap();
        let mut out = Output::default();
        s.ready_responses(&mut out);
        to_client.extend(bytes_of(&[], &out));
        let got = frames(&to_client);
        assert_eq!(got.len(), 4, "cut at {cut}");
        assert!(got[1].ends_with(b"!"), "the service's answer in the Produce's turn");
        assert_eq!(got[2..], responses[2..], "cut at {cut}");
        assert_eq!((s.in_flight(), s.held_bytes()), (0, 0));
    }
}

#[test]
fn the_services_own_answer_leaves_in_its_requests_turn() {
    let mut s = session(false);
    let (metadata, produce) = (request(3, 12, 1, &[0, 1, 0]), produce(2, 1));
    let answer = opaque_response(2, b"answered by the gateway");
    let stream = [metadata.clone(), produce].concat();
    let local = answer.clone();
    let (forwarded, to_client, _) = run_requests(&mut s, &[&stream], true,
        &|_| Resolution::Request { forward: vec![], answer: Some(local.clone()), want_response: false, vouched: vec![] });
    assert_eq!(forwarded, metadata, "the answered request never reaches the broker");
    assert!(to_client.is_empty(), "not before the broker's answer to the Metadata request");
    let routes = routes();
    let mut out = Output::default();
    let meta = metadata_response(12, 1);
    s.feed_responses(&meta, view(&routes), &mut out).unwrap();
    let got = frames(&bytes_of(&meta, &out));
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], answer);
    assert_eq!(s.stats.get(Counter::HandoffAnswers), 1);
}

#[test]
fn fail_closed_answers_produce_with_a_retriable_error_and_closes_otherwise() {
    let mut s = session(false);
    let (_, to_client, handed) = run_requests(&mut s, &[&produce(7, 1)], true, &|_| Resolution::Failed(Failure::Timeout));
    assert_eq!(handed.len(), 1);
    let (correlation, response): (i32, ProduceResponse) = decode_response(ApiKey::Produce, 9, &to_client);
    assert_eq!(correlation, 7);
    let errors: Vec<i16> = response.responses.iter().flat_map(|t| t.partition_responses.iter().map(|p| p.error_code)).collect();
    assert_eq!(errors, [REQUEST_TIMED_OUT; 2]);
    assert_eq!(response.responses[0].name.0.as_str(), "orders");
    assert_eq!(s.stats.get(Counter::HandoffRetriableErrors), 1);
    // acks=0: nothing to answer, nothing forwarded.
    let mut s = session(false);
    let (forwarded, to_client, _) = run_requests(&mut s, &[&produce(8, 0)], true, &|_| Resolution::Failed(Failure::Unavailable));
    assert!(forwarded.is_empty() && to_client.is_empty());
    // A request the module cannot answer: the connection closes.
    struct HandOffMetadata;
    impl RequestPolicy for HandOffMetadata {
        fn decide(&mut self, _: &RequestHead, _: &Requester<'_>) -> Disposition {
            Disposition::HandOff { fail_open: false }
        }
    }
    let mut s = Session::with_policy(SessionLimits::default(), HandOffMetadata);
    let mut out = Output::default();
    s.feed_requests(&request(3, 12, 1, &[0, 1, 0]), &mut out).unwrap();
    let h = s.take_handoffs().remove(0);
    let err = s.resolve(h.id, Resolution::Failed(Failure::Timeout)).unwrap_err();
    assert!(matches!(err, ProtocolError::HandOff(ref why) if why.contains("Metadata") && why.contains("fail-closed")), "{err}");
}

/// Hands off every request.
struct HandOffAll;

impl RequestPolicy for HandOffAll {
    fn decide(&mut self, _: &RequestHead, _: &Requester<'_>) -> Disposition {
        Disposition::HandOff { fail_open: false }
    }
}

/// A Fetch request (v12: flexible, names) of `orders` partitions 0 and 1, in a session.
fn fetch_request(correlation_id: i32) -> Vec<u8> {
    let version = 12;
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(1)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("t")))
        .encode(&mut buf, ApiKey::Fetch.request_header_version(version))
        .unwrap();
    FetchRequest::default()
        .with_session_id(42)
        .with_session_epoch(3)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("orders")))
            .with_partitions((0..2).map(|i| FetchPartition::default().with_partition(i)).collect())])
        .encode(&mut buf, version)
        .unwrap();
    sized(&buf)
}

/// Every partition of a Fetch answer: (topic, partition, error, high watermark, records).
fn fetched(response: &FetchResponse) -> Vec<(String, i32, i16, i64, Option<Bytes>)> {
    response.responses.iter().flat_map(|t| t.partitions.iter().map(|p| (
        t.topic.0.to_string(), p.partition_index, p.error_code, p.high_watermark, p.records.clone())))
        .collect()
}

#[test]
fn fail_closed_answers_a_fetch_or_its_answer_with_a_retriable_error() {
    let refused = |partition| ("orders".to_string(), partition, NOT_LEADER_OR_FOLLOWER, -1, Some(Bytes::new()));
    // The request's hand-off fails: each partition it names is refused, no session.
    let mut s = Session::with_policy(SessionLimits::default(), HandOffAll);
    let mut out = Output::default();
    s.feed_requests(&fetch_request(5), &mut out).unwrap();
    let h = s.take_handoffs().remove(0);
    s.resolve(h.id, Resolution::Failed(Failure::Timeout)).unwrap();
    let mut out = Output::default();
    s.ready_responses(&mut out);
    let (correlation, response): (i32, FetchResponse) = decode_response(ApiKey::Fetch, 12, &bytes_of(&[], &out));
    assert_eq!((correlation, response.session_id, response.error_code), (5, 0, 0));
    assert_eq!(fetched(&response), [refused(0), refused(1)]);
    assert_eq!(s.stats.get(Counter::HandoffRetriableErrors), 1);

    // The broker's answer (records a rule must see) goes to the service, which fails:
    // its records are dropped, its partitions refused.
    let mut s = Session::with_policy(SessionLimits::default(), HandOffAll);
    let mut out = Output::default();
    s.feed_requests(&fetch_request(6), &mut out).unwrap();
    let h = s.take_handoffs().remove(0);
    s.resolve(h.id, Resolution::Request { forward: h.frame.to_vec(), answer: None, want_response: true, vouched: vec![] })
        .unwrap();
    let answer = FetchResponse::default().with_session_id(42).with_responses(vec![FetchableTopicResponse::default()
        .with_topic(TopicName(StrBytes::from_static_str("orders")))
        .with_partitions((0..2).map(|i| PartitionData::default().with_partition_index(i).with_high_watermark(9)
            .with_records(Some(Bytes::from_static(b"secret records")))).collect())]);
    let routes = routes();
    let mut out = Output::default();
    s.feed_responses(&encode_response(ApiKey::Fetch, 12, 6, &answer), view(&routes), &mut out).unwrap();
    assert!(out.is_empty());
    let h = s.take_handoffs().remove(0);
    s.resolve(h.id, Resolution::Failed(Failure::Unavailable)).unwrap();
    let mut out = Output::default();
    s.ready_responses(&mut out);
    let (correlation, response): (i32, FetchResponse) = decode_response(ApiKey::Fetch, 12, &bytes_of(&[], &out));
    assert_eq!((correlation, response.session_id), (6, 0));
    assert_eq!(fetched(&response), [refused(0), refused(1)]);
}

#[test]
fn fail_open_forwards_the_frame_as_it_was_and_a_late_answer_changes_nothing() {
    let mut s = session(true);
    let frame = produce(3, 1);
    let (forwarded, _, handed) = run_requests(&mut s, &[&frame], true, &|_| Resolution::Failed(Failure::Timeout));
    assert_eq!(forwarded, frame);
    assert_eq!(s.stats.get(Counter::HandoffFailedOpen), 1);
    // The answer arrives after the timeout: ignored, never a second copy.
    s.resolve(handed[0].id, masked(&handed[0])).unwrap();
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert!(out.is_empty());
    // The broker's response passes (no want_response on a failed hand-off).
    let routes = routes();
    let response = opaque_response(3, b"ok");
    let mut out = Output::default();
    s.feed_responses(&response, view(&routes), &mut out).unwrap();
    assert!(out.is_whole(response.len()));
}

#[test]
fn a_failed_response_handoff_fails_open_or_closes() {
    for fail_open in [true, false] {
        let mut s = session(fail_open);
        run_requests(&mut s, &[&produce(2, 1)], true,
                     &|h| Resolution::Request { forward: h.frame.to_vec(), answer: None, want_response: true, vouched: vec![] });
        let routes = routes();
        let response = opaque_response(2, b"broker");
        let mut out = Output::default();
        s.feed_responses(&response, view(&routes), &mut out).unwrap();
        assert!(out.is_empty());
        let h = s.take_handoffs().remove(0);
        let result = s.resolve(h.id, Resolution::Failed(Failure::Unavailable));
        if fail_open {
            result.unwrap();
            let mut out = Output::default();
            s.ready_responses(&mut out);
            assert_eq!(bytes_of(&[], &out), response);
        } else {
            assert!(result.is_err(), "fail-closed: a response is replaced by closing");
        }
    }
}

#[test]
fn answers_that_break_the_protocol_close_the_connection() {
    let cases: Vec<(Resolution, &str)> = vec![
        (Resolution::Request { forward: vec![], answer: None, want_response: false, vouched: vec![] }, "dropped"),
        (Resolution::Request { forward: vec![1], answer: Some(vec![2]), want_response: false, vouched: vec![] }, "both"),
        (Resolution::Response { answer: vec![1], vouched: vec![] }, "response's answer"),
        (Resolution::Request { forward: vec![], answer: Some(opaque_response(99, b"")), want_response: false, vouched: vec![] },
         "another correlation id"),
        (Resolution::Close, "closed"),
    ];
    for (resolution, why) in cases {
        let mut s = session(false);
        let mut out = Output::default();
        s.feed_requests(&produce(1, 1), &mut out).unwrap();
        let h = s.take_handoffs().remove(0);
        let err = s.resolve(h.id, resolution).unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
}

#[test]
fn an_answer_to_a_response_must_be_that_response() {
    for (answer, ok) in [(opaque_response(2, b"changed"), true), (opaque_response(3, b"x"), false), (vec![], false)] {
        let mut s = session(false);
        run_requests(&mut s, &[&produce(2, 1)], true,
                     &|h| Resolution::Request { forward: h.frame.to_vec(), answer: None, want_response: true, vouched: vec![] });
        let routes = routes();
        let mut out = Output::default();
        s.feed_responses(&opaque_response(2, b"broker"), view(&routes), &mut out).unwrap();
        let h = s.take_handoffs().remove(0);
        assert_eq!(s.resolve(h.id, Resolution::Response { answer, vouched: vec![] }).is_ok(), ok);
    }
}

#[test]
fn handoffs_carry_the_principal_once_authenticated() {
    use kafka_protocol::messages::{SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse};
    fn encoded<M: Encodable>(key: ApiKey, version: i16, correlation_id: i32, m: &M) -> Vec<u8> {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        m.encode(&mut buf, version).unwrap();
        sized(&buf)
    }
    let mut s = session(false);
    let routes = routes();
    let handshake = encoded(ApiKey::SaslHandshake, 1, 1, &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")));
    let auth = encoded(ApiKey::SaslAuthenticate, 2, 2, &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0alice\0pw")));
    let stream = [handshake, auth, produce(3, 1)].concat();
    // Byte at a time: SASL frames are copied while they pass, never held.
    let chunks: Vec<&[u8]> = stream.chunks(1).collect();
    let (forwarded, _, handed) = run_requests(&mut s, &chunks[..stream.len() - produce(3, 1).len()], true, &masked);
    assert_eq!(forwarded.len(), stream.len() - produce(3, 1).len());
    assert!(handed.is_empty());
    let answers = [
        encode_response(ApiKey::SaslHandshake, 1, 1, &SaslHandshakeResponse::default()),
        encode_response(ApiKey::SaslAuthenticate, 2, 2, &SaslAuthenticateResponse::default()),
    ].concat();
    let mut to_client = Vec::new();
    for chunk in answers.chunks(3) {
        let mut out = Output::default();
        s.feed_responses(chunk, view(&routes), &mut out).unwrap();
        to_client.extend(bytes_of(chunk, &out));
    }
    assert_eq!(to_client, answers, "SASL answers pass as they came");
    let (_, _, handed) = run_requests(&mut s, &chunks[stream.len() - produce(3, 1).len()..], true, &masked);
    assert_eq!(handed[0].principal.as_deref(), Some("User:alice"));
    assert_eq!(handed[0].security_protocol, "SASL_PLAINTEXT");
}

/// Hands off the requests whose client id is "billing" (a who-selector naming it).
struct HandOffBilling;

impl RequestPolicy for HandOffBilling {
    fn decide(&mut self, _: &RequestHead, from: &Requester<'_>) -> Disposition {
        match from.client_id {
            ClientId::Bytes(b"billing") => Disposition::HandOff { fail_open: false },
            _ => Disposition::Forward,
        }
    }
}

/// A ListOffsets-shaped request (key 2, v1) with this client id (None: null).
fn request_from(correlation_id: i32, client_id: Option<&str>) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(2i16.to_be_bytes());
    b.extend(1i16.to_be_bytes());
    b.extend(correlation_id.to_be_bytes());
    match client_id {
        Some(id) => {
            b.extend((id.len() as i16).to_be_bytes());
            b.extend(id.as_bytes());
        }
        None => b.extend((-1i16).to_be_bytes()),
    }
    b.extend([0u8; 9]);
    sized(&b)
}

#[test]
fn requests_are_decided_by_their_own_client_id_wherever_the_stream_is_cut() {
    let requests = [request_from(1, Some("etl-loader")), request_from(2, Some("billing")), request_from(3, None),
                    request_from(4, Some("billing-2")), request_from(5, Some("billing"))];
    let stream: Vec<u8> = requests.concat();
    let forwarded_expected: Vec<u8> = [&requests[0], &requests[2], &requests[3]].into_iter().flatten().copied().collect();
    for cut in 0..=stream.len() {
        let mut s = Session::with_policy(SessionLimits::default(), HandOffBilling);
        let (forwarded, handed) = requests_cut_at(&mut s, &stream, cut);
        let handed: Vec<&[u8]> = handed.iter().map(|h| &h.frame[..]).collect();
        assert_eq!(handed, [&requests[1][..], &requests[4][..]], "cut at {cut}");
        assert_eq!(forwarded, forwarded_expected[..forwarded.len()], "cut at {cut}: forwarded in order");
    }
}
