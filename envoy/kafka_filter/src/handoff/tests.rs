//! The hand-off thread against a fake service (no network, no Envoy): endpoints that
//! answer, are dead, never answer, answer late, or break their stream.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use prost_types::value::Kind;
use prost_types::Value;

use super::proto::{self, ProcessingRequest, ProcessingResponse};
use super::*;
use crate::core::handoff::HandOff;

/// Endpoint names say how the fake service behaves: `echo`, `dead`, `silent`,
/// `slow` (answers after 150 ms), `breaks` (ends the stream at the first message),
/// `once` (answers the first message, then ends the stream while it is idle),
/// `throttles` (echoes, each reply to a request saying it was over a rate by
/// [`THROTTLE`]), `throttles-once` (both), `mutes` (throttles the first request, 200 ms
/// late, and defers those that come during its throttle, as the service does).
#[derive(Default)]
pub(crate) struct FakeService {
    /// Streams opened: endpoint and initial metadata.
    pub(crate) opened: Mutex<Vec<(String, Metadata)>>,
    /// The frames the service was sent, when (what it judged, and when it did).
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
}

type Metadata = Vec<(String, String)>;
/// A frame the service was sent, and when.
type Seen = (std::time::Instant, Vec<u8>);

const THROTTLE: Duration = Duration::from_millis(800);

struct FakeExchange {
    requests: mpsc::UnboundedSender<ProcessingRequest>,
    replies: mpsc::UnboundedReceiver<ProcessingResponse>,
}

impl Connector for FakeService {
    fn open<'a>(&'a self, endpoint: &'a str, metadata: &'a [(String, String)]) -> BoxFuture<'a, Result<Box<dyn Exchange>, String>> {
        Box::pin(async move {
            let mode = endpoint.split(':').next().unwrap_or("").to_string();
            if mode == "dead" {
                return Err(format!("{endpoint}: connection refused"));
            }
            self.opened.lock().unwrap().push((endpoint.to_string(), metadata.to_vec()));
            let (requests, mut incoming) = mpsc::unbounded_channel::<ProcessingRequest>();
            let (outgoing, replies) = mpsc::unbounded_channel();
            let seen = self.seen.clone();
            let mut muted_until: Option<tokio::time::Instant> = None;
            tokio::spawn(async move {
                while let Some(request) = incoming.recv().await {
                    let frame = request.read_data.as_ref().or(request.write_data.as_ref()).map(|d| d.data.to_vec());
                    seen.lock().unwrap().push((std::time::Instant::now(), frame.unwrap_or_default()));
                    match mode.as_str() {
                        "silent" => continue,
                        "breaks" => return,
                        "slow" => tokio::time::sleep(Duration::from_millis(150)).await,
                        _ => {}
                    }
                    // Echo: the frame back where it came from.
                    let is_request = request.read_data.is_some();
                    let mut reply = ProcessingResponse { read_data: request.read_data, write_data: request.write_data, ..Default::default() };
                    if mode == "mutes" && is_request {
                        // As the service does: the first request is over the rate, those
                        // that come while the connection is muted are not judged.
                        let now = tokio::time::Instant::now();
                        let (key, ms) = match muted_until {
                            None => {
                                // Late enough that the module has sent the requests behind
                                // it before the throttle reaches it (what it defers itself
                                // never comes here).
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                let now = tokio::time::Instant::now();
                                muted_until = Some(now + THROTTLE);
                                ("throttle_ms", THROTTLE.as_millis() as f64)
                            }
                            Some(until) if until > now => ("defer_ms", (until - now).as_millis() as f64 + 1.0),
                            Some(_) => ("", 0.0),
                        };
                        if !key.is_empty() {
                            let pause = Value { kind: Some(Kind::NumberValue(ms)) };
                            let data = if key == "defer_ms" { None } else { reply.read_data.take() };
                            reply = proto::tests::with_keg(ProcessingResponse { read_data: data, ..reply }, vec![(key, pause)]);
                        }
                    }
                    if mode.starts_with("throttles") && is_request {
                        let pause = Value { kind: Some(Kind::NumberValue(THROTTLE.as_millis() as f64)) };
                        reply = proto::tests::with_keg(reply, vec![("throttle_ms", pause)]);
                    }
                    if outgoing.send(reply).is_err() || mode.ends_with("once") {
                        return;
                    }
                }
            });
            Ok(Box::new(FakeExchange { requests, replies }) as Box<dyn Exchange>)
        })
    }
}

impl Exchange for FakeExchange {
    fn send(&mut self, message: ProcessingRequest) -> Result<(), String> {
        self.requests.send(message).map_err(|_| "closed".to_string())
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<ProcessingResponse, String>>> {
        Box::pin(async move { self.replies.recv().await.map(Ok) })
    }
}

/// Counts wakes, as Envoy's scheduler would post events to the worker.
#[derive(Clone, Default)]
struct Wakes(Arc<(Mutex<usize>, Condvar)>);

impl Wake for Wakes {
    fn wake(&self) {
        *self.0 .0.lock().unwrap() += 1;
        self.0 .1.notify_all();
    }
}

/// Waits until `n` answers came (taking them as the worker would), or 5 s. The link is
/// never read while the wakes' lock is held: the hand-off thread wakes the worker under
/// the link's lock (as Envoy's scheduler is committed), and the opposite order
/// deadlocked a test now and then.
fn answers(link: &Link, wakes: &Wakes, n: usize) -> Vec<(u64, Resolution)> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (lock, cond) = &*wakes.0;
    loop {
        got.extend(link.take());
        if got.len() >= n || std::time::Instant::now() > deadline {
            return got;
        }
        let guard = lock.lock().unwrap();
        drop(cond.wait_timeout(guard, Duration::from_millis(20)).unwrap());
    }
}

fn runtime() -> (Runtime, Arc<FakeService>) {
    let service = Arc::new(FakeService::default());
    (Runtime::start(service.clone()).unwrap(), service)
}

fn interest(endpoints: &[&str], timeout_ms: u64) -> Current {
    let mut interest = Interest::default();
    interest.endpoints = endpoints.iter().map(|e| e.to_string()).collect();
    interest.handoff_timeout_ms = timeout_ms;
    let interest = Arc::new(interest);
    Arc::new(move || interest.clone())
}

fn outgoing(id: u64, direction: Direction, frame: &'static [u8]) -> Outgoing {
    let handoff = HandOff { id, direction, frame: Bytes::from_static(frame), api_key: 0, api_version: 9,
                            principal: None, security_protocol: "PLAINTEXT" };
    Outgoing { id, direction, message: proto::message(&handoff) }
}

fn forwarded(frame: &[u8]) -> Resolution {
    Resolution::Request { forward: frame.to_vec(), answer: None, want_response: false, vouched: vec![] }
}

#[test]
fn answers_come_back_in_order_with_the_streams_metadata() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let metadata = vec![("x-keg-mode".to_string(), "frames".to_string())];
    let conn = rt.connect(link.clone(), metadata.clone(), 7, interest(&["echo:1"], 2000));
    assert!(conn.send(outgoing(1, Direction::Request, b"one")));
    assert!(conn.send(outgoing(2, Direction::Response, b"two")));
    assert!(conn.send(outgoing(3, Direction::Request, b"three")));
    let got = answers(&link, &wakes, 3);
    assert_eq!(got, vec![(1, forwarded(b"one")), (2, Resolution::Response { answer: b"two".to_vec(), vouched: vec![] }), (3, forwarded(b"three"))]);
    let opened = service.opened.lock().unwrap();
    assert_eq!(opened.len(), 1, "one stream per connection");
    assert_eq!(opened[0], ("echo:1".to_string(), metadata));
}

#[test]
fn a_dead_endpoint_is_skipped_for_the_next_one() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    // hash 0 chooses the first endpoint, which is dead.
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["dead:1", "echo:2"], 2000));
    conn.send(outgoing(1, Direction::Request, b"f"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"f"))]);
    assert_eq!(service.opened.lock().unwrap()[0].0, "echo:2");
    // With every endpoint dead, the hand-off fails (the session fails open or closed).
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["dead:1", "dead:2"], 2000));
    conn.send(outgoing(1, Direction::Request, b"f"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, Resolution::Failed(Failure::Unavailable))]);
}

/// The gRPC client opens a stream without reaching the service (it connects at the
/// first call), so a killed worker's endpoint opens fine and its stream fails at once.
/// A stream that failed puts its endpoint last: a pipelining client's whole backlog
/// failed on the dead one, stream after stream, in 0.2 s, while the other worker was up.
#[test]
fn after_a_stream_fails_the_next_one_goes_to_another_endpoint() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    // hash 0 chooses the first endpoint, whose streams break at their first message.
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["breaks:1", "echo:2"], 2000));
    conn.send(outgoing(1, Direction::Request, b"f"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, Resolution::Failed(Failure::Unavailable))], "the frame it held");
    for id in 2..=4 {
        conn.send(outgoing(id, Direction::Request, b"g"));
        assert_eq!(answers(&link, &wakes, 1), vec![(id, forwarded(b"g"))]);
    }
    let opened: Vec<String> = service.opened.lock().unwrap().iter().map(|(e, _)| e.clone()).collect();
    assert_eq!(opened, ["breaks:1", "echo:2"]);
}

#[test]
fn a_silent_service_times_out_every_unanswered_message_then_a_new_stream_opens() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["silent:1"], 50));
    conn.send(outgoing(1, Direction::Request, b"a"));
    conn.send(outgoing(2, Direction::Request, b"b"));
    let got = answers(&link, &wakes, 2);
    assert_eq!(got, vec![(1, Resolution::Failed(Failure::Timeout)), (2, Resolution::Failed(Failure::Timeout))]);
    conn.send(outgoing(3, Direction::Request, b"c"));
    assert_eq!(answers(&link, &wakes, 1), vec![(3, Resolution::Failed(Failure::Timeout))]);
    assert_eq!(service.opened.lock().unwrap().len(), 2, "a timed-out stream is not reused");
}

#[test]
fn a_broken_stream_fails_what_it_held() {
    let (rt, _) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["breaks:1"], 2000));
    conn.send(outgoing(1, Direction::Response, b"a"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, Resolution::Failed(Failure::Unavailable))]);
}

/// A stream that ended while nothing was unanswered (the service restarted, the HTTP/2
/// connection went away while the Kafka connection was quiet) is dropped then: the
/// next message opens another instead of failing on the dead one (which, fail-closed,
/// closed a quiet Kafka connection at its next handed-off request).
#[test]
fn a_stream_that_ends_while_idle_is_replaced_not_failed() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["once:1"], 2000));
    conn.send(outgoing(1, Direction::Request, b"a"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"a"))]);
    std::thread::sleep(Duration::from_millis(100)); // the stream ends, idle
    conn.send(outgoing(2, Direction::Request, b"b"));
    assert_eq!(answers(&link, &wakes, 1), vec![(2, forwarded(b"b"))]);
    assert_eq!(service.opened.lock().unwrap().len(), 2);
}

#[test]
fn a_late_answer_for_a_closed_connection_is_dropped_and_connections_do_not_wait_for_each_other() {
    let (rt, _) = runtime();
    let (slow_wakes, fast_wakes) = (Wakes::default(), Wakes::default());
    let slow = Link::new(Box::new(slow_wakes.clone()));
    let fast = Link::new(Box::new(fast_wakes.clone()));
    let slow_conn = rt.connect(slow.clone(), vec![], 0, interest(&["slow:1"], 2000));
    let fast_conn = rt.connect(fast.clone(), vec![], 0, interest(&["echo:1"], 2000));
    slow_conn.send(outgoing(1, Direction::Request, b"slow"));
    fast_conn.send(outgoing(1, Direction::Request, b"fast"));
    assert_eq!(answers(&fast, &fast_wakes, 1), vec![(1, forwarded(b"fast"))]);
    assert!(slow.take().is_empty(), "the slow service's answer is not there yet");
    slow.close(); // the connection is destroyed before its answer comes
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while slow.late_answers() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(slow.late_answers(), 1, "the late answer is dropped and counted");
    assert!(slow.take().is_empty());
    assert_eq!(*slow_wakes.0 .0.lock().unwrap(), 0, "a closed connection is never woken");
    drop(slow_conn);
}

#[test]
fn one_wake_per_batch_of_answers() {
    let link = Link::new(Box::new(Wakes::default()));
    let wakes = Wakes::default();
    let link2 = Link::new(Box::new(wakes.clone()));
    for id in 1..=3 {
        assert!(link2.deliver(id, Resolution::Close));
    }
    assert_eq!(*wakes.0 .0.lock().unwrap(), 1, "the worker takes all three at once");
    assert_eq!(link2.take().len(), 3);
    link2.deliver(4, Resolution::Close);
    assert_eq!(*wakes.0 .0.lock().unwrap(), 2);
    link.close();
    assert!(!link.deliver(1, Resolution::Close));
    assert!(link.is_closed());
}

#[test]
fn a_throttled_answer_goes_at_once_and_holds_the_connections_next_ones_back_without_timing_them_out() {
    let (rt, _) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    // The pause (800 ms) is longer than the timeout (300 ms): the held message's deadline
    // moves with the pause, or it would fail.
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["throttles:1"], 300));
    conn.send(outgoing(1, Direction::Request, b"over"));
    conn.send(outgoing(2, Direction::Request, b"next"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"over"))]);
    std::thread::sleep(Duration::from_millis(100));
    assert!(link.take().is_empty(), "the next answer waits for the pause");
    assert_eq!(answers(&link, &wakes, 1), vec![(2, forwarded(b"next"))]);
}

#[test]
fn the_brokers_answers_go_at_once_while_the_connection_is_muted() {
    // A throttled Produce's answer (handed off for the rule's patch) waited the whole
    // pause behind it: librdkafka saw a 10 s round trip where the broker answers at once.
    let (rt, _) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["throttles:1"], 300));
    let start = std::time::Instant::now();
    conn.send(outgoing(1, Direction::Request, b"over"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"over"))]);
    conn.send(outgoing(2, Direction::Request, b"next"));
    conn.send(outgoing(3, Direction::Response, b"answer to over"));
    let answer = Resolution::Response { answer: b"answer to over".to_vec(), vouched: vec![] };
    assert_eq!(answers(&link, &wakes, 1), vec![(3, answer)]);
    assert!(start.elapsed() < THROTTLE, "the answer waited for the pause: {:?}", start.elapsed());
    assert_eq!(answers(&link, &wakes, 1), vec![(2, forwarded(b"next"))]);
    assert!(start.elapsed() >= THROTTLE, "the next request went before the pause ended");
}

/// Requests are judged when they may go, not when they arrive: while the connection is
/// muted the service is not sent its next requests at all, and after the mute they go
/// one at a time, each after the reply to the one before (judged on arrival, a
/// pipelining client's whole queue ran its bucket into its deepest debt, then all went
/// at the mute's end: 1.6 MB/s through 200 KB/s).
#[test]
fn requests_behind_a_throttle_are_sent_to_be_judged_only_after_it_one_at_a_time() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["throttles:1"], 2000));
    let start = std::time::Instant::now();
    conn.send(outgoing(1, Direction::Request, b"over"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"over"))]);
    conn.send(outgoing(2, Direction::Request, b"second"));
    conn.send(outgoing(3, Direction::Request, b"third"));
    conn.send(outgoing(4, Direction::Response, b"an answer"));
    std::thread::sleep(Duration::from_millis(200));
    let sent: Vec<Vec<u8>> = service.seen.lock().unwrap().iter().map(|(_, f)| f.clone()).collect();
    assert_eq!(sent, vec![b"over".to_vec(), b"an answer".to_vec()], "muted: the next requests wait in the module");
    assert_eq!(link.throttled(), 2, "the worker can tell what a throttle holds back");
    // Each deferred request is throttled in turn (the fake throttles every request): the
    // second goes at the first mute's end, the third at the second's.
    let got = answers(&link, &wakes, 3);
    assert_eq!(got.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![4, 2, 3]);
    let seen = service.seen.lock().unwrap().clone();
    let at = |frame: &[u8]| seen.iter().find(|(_, f)| f == frame).map(|(t, _)| t.duration_since(start)).unwrap();
    assert!(at(b"second") >= THROTTLE, "judged before the mute ended: {:?}", at(b"second"));
    assert!(at(b"third") >= 2 * THROTTLE, "judged along with the second: {:?}", at(b"third"));
    assert_eq!(link.throttled(), 0);
}

/// A connection that stopped reading (at `MAX_PENDING_PER_CONNECTION` frames) reads on
/// while a throttle holds its requests, to see its client go: the worker must be told
/// when a throttle begins to hold some, not only at the mute's end, when answers come.
#[test]
fn a_throttle_that_begins_to_hold_requests_wakes_the_worker_without_an_answer() {
    let (rt, _) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["throttles:1"], 2000));
    conn.send(outgoing(1, Direction::Request, b"over"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"over"))]);
    let before = *wakes.0 .0.lock().unwrap();
    conn.send(outgoing(2, Direction::Request, b"held"));
    let deadline = std::time::Instant::now() + THROTTLE / 2;
    while link.throttled() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(link.throttled(), 1);
    assert!(link.take().is_empty(), "no answer yet: the mute holds the request");
    assert_eq!(*wakes.0 .0.lock().unwrap(), before + 1, "the worker was not told the throttle began");
    assert_eq!(answers(&link, &wakes, 1), vec![(2, forwarded(b"held"))]);
}

/// A stream that breaks while requests wait behind a throttle loses none of them: they
/// go on the next stream once the mute is over.
#[test]
fn requests_held_back_survive_a_stream_that_ends() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["throttles-once:1"], 2000));
    let start = std::time::Instant::now();
    conn.send(outgoing(1, Direction::Request, b"over"));
    assert_eq!(answers(&link, &wakes, 1), vec![(1, forwarded(b"over"))]);
    conn.send(outgoing(2, Direction::Request, b"held"));
    assert_eq!(answers(&link, &wakes, 1), vec![(2, forwarded(b"held"))]);
    assert!(start.elapsed() >= THROTTLE, "the mute ended with the stream");
    assert_eq!(service.opened.lock().unwrap().len(), 2, "the held request went on a new stream");
}

/// Requests the module sent before the throttle reached it (a pipelining client's) are
/// sent back unjudged by the service; the module sends them again, in order, once the
/// mute is over (judged at once, they ran the bucket into its deepest debt and all went
/// at the mute's end: 4 MB in 12 s through 100 KB/s).
#[test]
fn requests_the_service_defers_are_sent_again_in_order_after_the_mute() {
    let (rt, service) = runtime();
    let wakes = Wakes::default();
    let link = Link::new(Box::new(wakes.clone()));
    let conn = rt.connect(link.clone(), vec![], 0, interest(&["mutes:1"], 2000));
    let start = std::time::Instant::now();
    conn.send(outgoing(1, Direction::Request, b"over"));
    conn.send(outgoing(2, Direction::Request, b"second"));
    conn.send(outgoing(3, Direction::Request, b"third"));
    let got = answers(&link, &wakes, 3);
    assert_eq!(got, vec![(1, forwarded(b"over")), (2, forwarded(b"second")), (3, forwarded(b"third"))]);
    let seen = service.seen.lock().unwrap().clone();
    let frames: Vec<&[u8]> = seen.iter().map(|(_, f)| f.as_slice()).collect();
    assert_eq!(frames, vec![&b"over"[..], b"second", b"third", b"second", b"third"], "sent, deferred, sent again");
    assert!(seen[3].0.duration_since(start) >= THROTTLE, "sent again before the mute ended");
}
