//! Incremental Fetch requests (KIP-227 sessions) in the core: one naming no selected
//! topic goes to the broker at once, and its answer decides: an answer naming no
//! selected topic goes to the client as it came; one naming a selected topic (or an id
//! the module cannot name) goes to the service after its request, replayed.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use keg_kafka_filter::core::stats::Counter;
use keg_kafka_filter::core::topics::TopicSelector;
use keg_kafka_filter::core::vouch::answer_unselected;
use keg_kafka_filter::core::{Direction, HandOff, Output, Resolution, Session, SessionLimits};

/// Fetch by topic (`s.*` selected).
fn session() -> Session<SelectS> {
    Session::with_policy(SessionLimits::default(), SelectS::new(1))
}

fn selector() -> Arc<TopicSelector> {
    SelectS::new(1).selector
}

fn drain_responses(s: &mut Session<SelectS>) -> Vec<u8> {
    let mut out = Output::default();
    s.ready_responses(&mut out);
    bytes_of(&[], &out)
}

fn answer(correlation_id: i32, version: i16, topics: &[&str]) -> Vec<u8> {
    let topics: Vec<(&str, Vec<u8>)> = topics.iter().map(|t| (*t, b"records".to_vec())).collect();
    fetch_answer(correlation_id, version, &topics, false)
}

#[test]
fn an_incremental_fetch_naming_no_selected_topic_goes_on_and_its_answer_decides() {
    for version in [7, 11, 12, 13, 15, 16, 17, 18] {
        let mut s = session();
        // Naming only an unselected topic, or nothing (nothing changed in the session):
        // forwarded whole at once, the service never sees it; its answer of unselected
        // topics goes to the client as it came.
        for (cid, named) in [(1, vec!["logs"]), (2, vec![])] {
            let request = fetch_request_in(cid, version, 3, &named);
            let (forwarded, handoffs) = request_round(&mut s, &request);
            assert_eq!(forwarded, request, "v{version}");
            assert!(handoffs.is_empty(), "v{version}");
            let broker = answer(cid, version, &["logs", "audit"]);
            let (sent, handoffs) = answer_round(&mut s, &broker);
            assert_eq!(sent, broker, "v{version}: the answer goes as it came");
            assert!(handoffs.is_empty());
        }
        assert_eq!(s.stats.get(Counter::HandoffByAnswer), 2, "v{version}");
        assert_eq!(s.stats.get(Counter::HandoffAnswerNotSelected), 2, "v{version}");

        // Its answer carries records of a selected topic the request did not name (the
        // session's): the request goes to the service first, replayed, then the answer.
        let request = fetch_request_in(3, version, 4, &["logs"]);
        assert!(request_round(&mut s, &request).1.is_empty());
        let broker = answer(3, version, &["logs", "s.cards"]);
        let (sent, handoffs) = answer_round(&mut s, &broker);
        assert!(sent.is_empty(), "v{version}: the answer keeps its place");
        assert_eq!(handoffs.len(), 1);
        assert_eq!((handoffs[0].direction, &handoffs[0].frame[..]), (Direction::Request, &request[..]));
        s.resolve(handoffs[0].id, Resolution::Request { forward: request.clone(), answer: None, want_response: true, vouched: vec![] })
            .unwrap();
        let handoffs = s.take_handoffs();
        assert_eq!(handoffs.len(), 1);
        assert_eq!((handoffs[0].direction, &handoffs[0].frame[..]), (Direction::Response, &broker[..]));
        let masked = answer(3, version, &["logs"]);
        s.resolve(handoffs[0].id, Resolution::Response { answer: masked.clone(), vouched: vec![] }).unwrap();
        assert_eq!(drain_responses(&mut s), masked, "v{version}: the service's answer goes out");

        // Naming a selected topic: handed off before the broker sees it, as a full one.
        let request = fetch_request_in(4, version, 5, &["logs", "s.cards"]);
        let (forwarded, handoffs) = request_round(&mut s, &request);
        assert!(forwarded.is_empty(), "v{version}");
        assert_eq!(handoffs.len(), 1);
        assert_eq!(s.stats.get(Counter::HandoffByAnswer), 3);
        assert_eq!(s.in_flight(), 1);
    }
}

#[test]
fn an_answer_the_walk_cannot_vouch_for_goes_to_the_service() {
    let s = selector();
    for version in [7, 12, 13, 17] {
        let whole = answer(1, version, &["logs", "audit"]);
        assert!(answer_unselected(1, &whole, version, &s), "v{version}");
        for cut in 0..whole.len() {
            let mut short = whole[..cut].to_vec();
            if short.len() >= 4 {
                let size = (short.len() - 4) as i32;
                short[..4].copy_from_slice(&size.to_be_bytes());
            }
            assert!(!answer_unselected(1, &short, version, &s), "v{version} cut at {cut}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert!(!answer_unselected(1, &longer, version, &s), "v{version}: trailing bytes");
        assert!(!answer_unselected(1, &answer(1, version, &["s.x"]), version, &s), "v{version}");
    }
    // A topic id the module never saw named: nobody can tell what it is.
    let unknown = {
        let mut frame = answer(1, 17, &["logs"]);
        let id = topic_id("logs");
        let at = frame.windows(16).position(|w| w == id.as_bytes()).unwrap();
        frame[at] ^= 0xff;
        frame
    };
    assert!(!answer_unselected(1, &unknown, 17, &s));
    assert!(!answer_unselected(1, &answer(1, 18, &["logs"]), 19, &s), "a version the walk does not know");
}

#[test]
fn an_answer_handed_off_names_the_topic_ids_it_carries() {
    use keg_kafka_filter::handoff::proto::{message, NAMESPACE};
    use prost_types::value::Kind;
    let id = topic_id("s.answered");
    let h = HandOff {
        id: 1, direction: Direction::Response, frame: Bytes::from(answer(1, 17, &["logs", "s.answered"])),
        api_key: 1, api_version: 17, principal: None, security_protocol: "PLAINTEXT",
    };
    let m = message(&h);
    let keg = &m.metadata.unwrap().filter_metadata[NAMESPACE];
    let Some(Kind::StructValue(ids)) = &keg.fields["topic_ids"].kind else { panic!("{keg:?}") };
    let hex: String = id.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(ids.fields[&hex].kind, Some(Kind::StringValue("s.answered".into())));
    assert_eq!(ids.fields.len(), 2, "logs too");
}

#[test]
fn a_fetch_whose_answer_may_go_to_the_service_asks_the_broker_for_at_most_the_cap() {
    use keg_kafka_filter::core::topics::HANDOFF_FETCH_MAX_BYTES;
    // Java's consumer asks for 50 MiB; a 32 MiB answer took longer to mask than the
    // hand-off timeout allows, every time (the consumer never progressed).
    let asked: i32 = 50 << 20;
    let capped = |request: &[u8]| {
        let mut expected = request.to_vec();
        let at = expected.windows(4).position(|w| w == asked.to_be_bytes()).unwrap();
        expected[at..at + 4].copy_from_slice(&HANDOFF_FETCH_MAX_BYTES.to_be_bytes());
        expected
    };
    for version in [7, 12, 13, 15, 17, 18] {
        let mut s = session();
        // Selected: the service sees what the client asked for (its request rules judge
        // that); what it forwards asking for the answer goes to the broker capped.
        let request = fetch_request_asking(1, version, -1, &["s.cards"], asked);
        let (forwarded, handoffs) = request_round(&mut s, &request);
        assert!(forwarded.is_empty(), "v{version}");
        assert_eq!(&handoffs[0].frame[..], &request[..], "v{version}");
        s.resolve(handoffs[0].id, Resolution::Request { forward: request.clone(), answer: None,
                                                         want_response: true, vouched: vec![] }).unwrap();
        let mut out = Output::default();
        s.ready_requests(&mut out);
        assert_eq!(bytes_of(&[], &out), capped(&request), "v{version}");
        let (_, handoffs) = answer_round(&mut s, &answer(1, version, &["s.cards"]));
        s.resolve(handoffs[0].id, Resolution::Response { answer: answer(1, version, &[]), vouched: vec![] }).unwrap();
        drain_responses(&mut s);
        // Incremental, naming no selected topic: it goes to the broker capped (its answer
        // may be the service's); its replay is what the client asked for.
        let request = fetch_request_asking(2, version, 3, &["logs"], asked);
        let (forwarded, handoffs) = request_round(&mut s, &request);
        assert!(handoffs.is_empty(), "v{version}");
        assert_eq!(forwarded, capped(&request), "v{version}");
        let (_, handoffs) = answer_round(&mut s, &answer(2, version, &["s.cards"]));
        assert_eq!(&handoffs[0].frame[..], &request[..], "v{version}: the replay");
        assert_eq!(s.stats.get(Counter::HandoffFetchCapped), 2, "v{version}");
    }
    // A Fetch no rule's topic names goes on as it came, whatever it asks for, and so
    // does one the service forwards without asking for its answer (a request rule's).
    let mut s = session();
    let request = fetch_request_asking(1, 12, -1, &["logs"], asked);
    assert_eq!(request_round(&mut s, &request).0, request);
    let request = fetch_request_asking(2, 12, -1, &["s.cards"], asked);
    let (_, handoffs) = request_round(&mut s, &request);
    s.resolve(handoffs[0].id, Resolution::Request { forward: request.clone(), answer: None,
                                                     want_response: false, vouched: vec![] }).unwrap();
    let mut out = Output::default();
    s.ready_requests(&mut out);
    assert_eq!(bytes_of(&[], &out), request);
    assert_eq!(s.stats.get(Counter::HandoffFetchCapped), 0);
}
