//! The hand-off thread: frames to the Python service and its answers back to the
//! worker thread that owns the connection.
//!
//! One module-owned thread runs a small tokio runtime (started on the first hand-off of
//! the process). Each Kafka connection that hands something off gets a task there and
//! one gRPC stream to the service (`NetworkExternalProcessor/Process`, frames mode, see
//! the hand-off protocol), opened lazily and kept while the connection lives. Messages
//! go out in order, one reply per message comes back in order; each answer is put in the
//! connection's [`Link`] and the worker is woken through Envoy's scheduler (the only
//! call that is safe off the worker thread), where the filter applies it.
//!
//! - Endpoints: a connection's frames all go to one endpoint, chosen by a hash of the
//!   connection id; when it cannot be reached the next one is tried (an endpoint that
//!   failed is skipped for a while unless all did).
//! - Timeout: the oldest unanswered message has `handoff_timeout_ms`; when it passes,
//!   every unanswered message of that stream fails (answers come in order, so a late
//!   one could not be told apart) and the stream is dropped; the next message opens a
//!   new one.
//! - A stream that breaks fails its unanswered messages the same way.
//! - Throttles: a reply that says its request was over a rate (`keg.throttle_ms`) mutes
//!   the connection that long ([`Mute`]): the replies to requests already judged wait,
//!   and the connection's next requests are not even sent to be judged until it ends.
//! - Closed connections: the filter closes its link on destroy; answers that come later
//!   are dropped (counted) and the task ends, dropping its stream.

pub mod grpc;
pub mod proto;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::core::handoff::{Direction, Failure, Resolution};
use crate::core::interest::Interest;
use proto::{ProcessingRequest, ProcessingResponse};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Wakes the worker thread of a connection (Envoy's scheduler commit).
pub trait Wake: Send {
    fn wake(&self);
}

/// What the hand-off thread and a connection's worker share.
pub struct Link {
    inner: Mutex<LinkInner>,
}

struct LinkInner {
    /// None once the connection is gone: answers are dropped.
    waker: Option<Box<dyn Wake>>,
    answers: VecDeque<(u64, Resolution)>,
    /// Answers dropped because they came after the connection was gone.
    late: u64,
    /// Requests a throttle holds back (judged ones whose replies wait, and ones not yet
    /// sent to be judged): what would reach the broker only after the mute.
    throttled: usize,
}

/// Answers that came back for connections already closed (process-wide).
pub static LATE_ANSWERS: AtomicU64 = AtomicU64::new(0);

impl Link {
    pub fn new(waker: Box<dyn Wake>) -> Arc<Link> {
        Arc::new(Link { inner: Mutex::new(LinkInner { waker: Some(waker), answers: VecDeque::new(), late: 0, throttled: 0 }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts an answer for the worker and wakes it; false when the connection is gone.
    pub fn deliver(&self, id: u64, resolution: Resolution) -> bool {
        let mut inner = self.lock();
        if inner.waker.is_none() {
            inner.late += 1;
            LATE_ANSWERS.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        inner.answers.push_back((id, resolution));
        if inner.answers.len() == 1 {
            // One wake per batch: the worker takes every answer there is when it runs.
            if let Some(waker) = &inner.waker {
                waker.wake();
            }
        }
        true
    }

    /// The answers that came back, in order (worker thread).
    pub fn take(&self) -> VecDeque<(u64, Resolution)> {
        std::mem::take(&mut self.lock().answers)
    }

    /// The connection is gone: later answers are dropped; the waker is dropped here,
    /// under the lock, so it is never used once this returns.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.waker = None;
        inner.answers.clear();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().waker.is_none()
    }

    /// Answers dropped because the connection was gone when they came.
    pub fn late_answers(&self) -> u64 {
        self.lock().late
    }

    /// How many of the connection's requests a throttle holds back now (worker thread:
    /// a client that ends its connection while some are held has them dropped).
    pub fn throttled(&self) -> usize {
        self.lock().throttled
    }

    /// A throttle that begins to hold requests wakes the worker: it reads on past the
    /// bound of a connection not throttled (`core::handoff::MAX_HELD_PER_CONNECTION`),
    /// and a connection that had stopped reading would otherwise wait for the mute's
    /// end to be told, its client's end unseen until then.
    fn set_throttled(&self, n: usize) {
        let mut inner = self.lock();
        let began = inner.throttled == 0 && n > 0;
        inner.throttled = n;
        if began && inner.answers.is_empty() {
            if let Some(waker) = &inner.waker {
                waker.wake();
            }
        }
    }
}

/// One stream to the service.
pub trait Exchange: Send {
    fn send(&mut self, message: ProcessingRequest) -> Result<(), String>;
    /// The next reply (cancel-safe); None when the service ended the stream.
    fn next(&mut self) -> BoxFuture<'_, Option<Result<ProcessingResponse, String>>>;
}

/// Opens streams to endpoints (the gRPC client; tests give a fake).
pub trait Connector: Send + Sync + 'static {
    fn open<'a>(&'a self, endpoint: &'a str, metadata: &'a [(String, String)]) -> BoxFuture<'a, Result<Box<dyn Exchange>, String>>;
}

/// The interest in force (endpoints, timeout) when a stream is opened.
pub type Current = Arc<dyn Fn() -> Arc<Interest> + Send + Sync>;

/// A message for the connection's task.
pub struct Outgoing {
    pub id: u64,
    pub direction: Direction,
    pub message: ProcessingRequest,
}

/// The sending end a filter keeps; dropping it ends the connection's task.
pub struct Connection {
    tx: mpsc::UnboundedSender<Outgoing>,
}

impl Connection {
    /// False when the task is gone (the runtime stopped): the caller fails the hand-off.
    pub fn send(&self, outgoing: Outgoing) -> bool {
        self.tx.send(outgoing).is_ok()
    }
}

/// The hand-off thread's runtime and the connector its tasks use.
pub struct Runtime {
    handle: tokio::runtime::Handle,
    connector: Arc<dyn Connector>,
    down: Arc<Mutex<HashMap<String, Instant>>>,
}

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
static CONNECTOR: OnceLock<Arc<dyn Connector>> = OnceLock::new();

/// Makes the runtime use `connector` instead of gRPC (tests; before the first use).
pub fn install_connector(connector: Arc<dyn Connector>) {
    let _ = CONNECTOR.set(connector);
}

/// How long an endpoint that could not be reached is tried last.
const DOWN_FOR: Duration = Duration::from_secs(2);

impl Runtime {
    /// The process's hand-off runtime, its thread started on first use.
    pub fn get() -> Result<&'static Runtime, String> {
        RUNTIME.get_or_init(|| {
            let connector = CONNECTOR.get().cloned().unwrap_or_else(|| Arc::new(grpc::GrpcConnector::default()));
            Runtime::start(connector)
        }).as_ref().map_err(Clone::clone)
    }

    /// A runtime of its own (a thread) whose tasks open streams with `connector`.
    pub fn start(connector: Arc<dyn Connector>) -> Result<Runtime, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("keg-handoff".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                match runtime {
                    Ok(runtime) => {
                        let _ = tx.send(Ok(runtime.handle().clone()));
                        runtime.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("hand-off runtime: {e}")));
                    }
                }
            })
            .map_err(|e| format!("hand-off thread: {e}"))?;
        let handle = rx.recv().map_err(|e| format!("hand-off thread: {e}"))??;
        Ok(Runtime { handle, connector, down: Arc::default() })
    }

    /// Starts the task of one connection; `metadata` is the stream's initial metadata
    /// and `hash` chooses its endpoint.
    pub fn connect(&self, link: Arc<Link>, metadata: Vec<(String, String)>, hash: u64, current: Current) -> Connection {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task { rx, link, metadata, hash, current, connector: self.connector.clone(), down: self.down.clone(), mute: Mute::default() };
        self.handle.spawn(task.run());
        Connection { tx }
    }
}

struct Task {
    rx: mpsc::UnboundedReceiver<Outgoing>,
    link: Arc<Link>,
    metadata: Vec<(String, String)>,
    hash: u64,
    current: Current,
    connector: Arc<dyn Connector>,
    down: Arc<Mutex<HashMap<String, Instant>>>,
    /// Kept across streams: a stream that breaks does not end a throttle, nor lose the
    /// requests it holds back.
    mute: Mute,
}

struct Unanswered {
    id: u64,
    direction: Direction,
    deadline: tokio::time::Instant,
    /// A request's message, kept to send again if the service defers it (the frame's
    /// bytes are shared, not copied).
    message: Option<ProcessingRequest>,
}

impl Task {
    async fn run(mut self) {
        loop {
            // A stream is opened for the next message, or for requests a throttle held
            // back when the last stream ended.
            let first = if self.mute.deferred.is_empty() {
                match self.rx.recv().await {
                    Some(first) => Some(first),
                    None => return,
                }
            } else {
                None
            };
            let interest = (self.current)();
            let timeout = Duration::from_millis(interest.handoff_timeout_ms);
            let Some((endpoint, exchange)) = self.open(&interest.endpoints, timeout).await else {
                let failed = first.into_iter().chain(std::mem::take(&mut self.mute.deferred));
                if !self.fail(failed.map(|o| o.id), Failure::Unavailable) {
                    return;
                }
                self.link.set_throttled(self.mute.holding());
                continue;
            };
            let (open, failed) = self.serve(exchange, first, timeout).await;
            if failed {
                // The next stream goes to another endpoint first. A stream's open does
                // not reach the service (tonic connects at the first call): a killed
                // worker's endpoint opened fine and failed at once, stream after
                // stream, and a client's whole backlog failed on it in 0.2 s while the
                // other worker was there.
                self.mark_down(&endpoint);
            }
            if !open {
                return;
            }
        }
    }

    /// A stream on the connection's endpoint, or the next ones in turn, and the endpoint.
    async fn open(&self, endpoints: &[String], timeout: Duration) -> Option<(String, Box<dyn Exchange>)> {
        if endpoints.is_empty() {
            return None;
        }
        let start = (self.hash % endpoints.len() as u64) as usize;
        let mut order: Vec<&String> = (0..endpoints.len()).map(|i| &endpoints[(start + i) % endpoints.len()]).collect();
        {
            // Endpoints that failed lately go last (stable: the hash order otherwise).
            let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            order.sort_by_key(|e| down.get(e.as_str()).is_some_and(|until| *until > now));
        }
        for endpoint in order {
            match tokio::time::timeout(timeout, self.connector.open(endpoint, &self.metadata)).await {
                Ok(Ok(exchange)) => return Some((endpoint.clone(), exchange)),
                Ok(Err(_)) | Err(_) => self.mark_down(endpoint),
            }
        }
        None
    }

    /// `endpoint` goes last in every connection's order for [`DOWN_FOR`].
    fn mark_down(&self, endpoint: &str) {
        self.down.lock().unwrap_or_else(|e| e.into_inner()).insert(endpoint.to_string(), Instant::now() + DOWN_FOR);
    }

    /// Serves one stream until it ends: (whether the connection is still there, so the
    /// next message opens another; whether the stream failed: broke, or timed out).
    async fn serve(&mut self, mut exchange: Box<dyn Exchange>, first: Option<Outgoing>, timeout: Duration) -> (bool, bool) {
        let mut unanswered: VecDeque<Unanswered> = VecDeque::new();
        let mut pending = first;
        loop {
            let mut now = pending.take().and_then(|outgoing| self.mute.admit(outgoing));
            while let Some(outgoing) = now.take().or_else(|| self.mute.next_deferred()) {
                let deadline = tokio::time::Instant::now() + timeout;
                let kept = (outgoing.direction == Direction::Request).then(|| outgoing.message.clone());
                unanswered.push_back(Unanswered { id: outgoing.id, direction: outgoing.direction, deadline, message: kept });
                self.mute.sent(outgoing.direction);
                if exchange.send(outgoing.message).is_err() {
                    return (self.end_stream(&mut unanswered, Failure::Unavailable), true);
                }
            }
            self.link.set_throttled(self.mute.holding());
            let deadline = unanswered.front().map(|u| u.deadline);
            tokio::select! {
                biased;
                // Read while idle too: a stream that breaks with nothing unanswered (the
                // service restarted, the HTTP/2 connection went) is dropped then, and the
                // next message opens another. Unread, its break surfaced only as the
                // failure of the next message sent on it: a quiet Kafka connection's next
                // handed-off request failed and, fail-closed, the connection was closed.
                reply = exchange.next() => match reply {
                    Some(Ok(reply)) => {
                        // An answer nobody asked for: the service broke the protocol.
                        let Some(u) = unanswered.pop_front() else { return (self.mute.release(&self.link), true) };
                        if let (Some(pause), Some(message)) = (proto::defer(&reply), u.message) {
                            self.mute.put_back(Outgoing { id: u.id, direction: u.direction, message }, pause);
                            continue;
                        }
                        let throttle = proto::throttle(&reply);
                        if !self.mute.deliver(&self.link, u.id, u.direction, proto::resolution(u.direction, reply)) {
                            return (false, false);
                        }
                        if let Some(pause) = throttle {
                            self.mute.extend(pause);
                        }
                    }
                    // (with nothing unanswered, only the held replies go)
                    Some(Err(_)) | None => return (self.end_stream(&mut unanswered, Failure::Unavailable), true),
                },
                _ = sleep_until(deadline) => return (self.end_stream(&mut unanswered, Failure::Timeout), true),
                _ = sleep_until(self.mute.wake_at()) => {
                    if !self.mute.release(&self.link) {
                        return (false, false);
                    }
                }
                outgoing = self.rx.recv() => match outgoing {
                    Some(outgoing) => pending = Some(outgoing),
                    None => return (false, false), // the connection is gone: drop the stream
                },
            }
        }
    }

    /// The stream is over with messages unanswered: the replies held for the mute go,
    /// then the unanswered ones fail (answers come in order: a late one could not be
    /// told apart). The requests the mute holds back wait for the next stream.
    fn end_stream(&mut self, unanswered: &mut VecDeque<Unanswered>, failure: Failure) -> bool {
        self.mute.in_flight = 0;
        self.mute.release(&self.link) && self.fail(unanswered.drain(..).map(|u| u.id), failure)
    }

    fn fail(&self, ids: impl Iterator<Item = u64>, failure: Failure) -> bool {
        for id in ids {
            if !self.link.deliver(id, Resolution::Failed(failure)) {
                return false;
            }
        }
        true
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A connection muted for a rate it went over, as Kafka mutes a throttled client's
/// channel (KIP-219): the request over the rate goes on at once and its answer carries
/// the throttle time Kafka's clients back off on; then, until that time has passed, the
/// connection's next requests are not sent to be judged (and replies to those judged
/// before the throttle came back are held), so a client that ignores the throttle time
/// (librdkafka) is held to the rate too: what waits counts against the connection's
/// bound, which then stops its reads, as a muted Kafka channel is not read.
///
/// Requests are judged when they may go, one at a time after a mute, not when they
/// arrive: judged on arrival, a pipelining client's queue (up to the connection's
/// bound, 16 MiB) ran its bucket into the most debt it may owe (10 s of the rate) and
/// then all went at the mute's end, 1.6 MB/s through a limit of 200 KB/s.
///
/// Replies to the broker's answers are never held: a client waits for none of its
/// answers longer than the broker made it (holding them held a throttled Produce's
/// answer for the whole throttle time: librdkafka measured a 10 s round trip, where
/// Kafka answers at once and mutes the channel after).
#[derive(Default)]
struct Mute {
    until: Option<tokio::time::Instant>,
    /// Replies to requests, in order, that wait for `until`.
    held: VecDeque<(u64, Resolution)>,
    /// Requests not yet judged, in order: they go once the mute is over, one at a time
    /// while the reply to the one before could mute the connection again.
    deferred: VecDeque<Outgoing>,
    /// Requests sent to be judged and not answered yet.
    in_flight: usize,
    /// How many requests the service sent back since the last deferred one went: they
    /// were sent before those still deferred, so they go first, in their order.
    returned: usize,
}

impl Mute {
    /// Each pause is what one request adds to the connection's (the service keeps until
    /// when it asked the module to wait): requests judged back to back mute the
    /// connection for the last one's throttle, not for the sum of all.
    fn extend(&mut self, pause: Duration) {
        let now = tokio::time::Instant::now();
        self.until = Some(self.until.map_or(now, |until| until.max(now)) + pause);
    }

    fn muted(&self) -> bool {
        self.until.is_some_and(|until| until > tokio::time::Instant::now())
    }

    /// A message to send now, or None when it is a request that must wait its turn
    /// (muted, or requests before it wait). Messages with the broker's answers go.
    fn admit(&mut self, outgoing: Outgoing) -> Option<Outgoing> {
        if outgoing.direction == Direction::Request && (self.muted() || !self.deferred.is_empty()) {
            self.deferred.push_back(outgoing);
            return None;
        }
        Some(outgoing)
    }

    /// The next request held back that may be sent now: the mute is over and every
    /// request sent before it was answered (one of them could mute the connection).
    fn next_deferred(&mut self) -> Option<Outgoing> {
        if self.muted() || self.in_flight > 0 {
            return None;
        }
        self.returned = 0;
        self.deferred.pop_front()
    }

    fn sent(&mut self, direction: Direction) {
        if direction == Direction::Request {
            self.in_flight += 1;
        }
    }

    /// The service did not judge a request (it came while the connection was muted, sent
    /// before the throttle reached the module): it goes again after `pause`, before the
    /// requests that came after it.
    fn put_back(&mut self, outgoing: Outgoing, pause: Duration) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.deferred.insert(self.returned.min(self.deferred.len()), outgoing);
        self.returned += 1;
        let until = tokio::time::Instant::now() + pause;
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// Delivers a reply now, or holds it: a request's while muted or while earlier ones
    /// are held (they go in order). False when the connection is gone.
    fn deliver(&mut self, link: &Link, id: u64, direction: Direction, resolution: Resolution) -> bool {
        if direction == Direction::Request {
            self.in_flight = self.in_flight.saturating_sub(1);
            if self.muted() || !self.held.is_empty() {
                self.held.push_back((id, resolution));
                return true;
            }
        }
        link.deliver(id, resolution)
    }

    /// When the mute's end has something to do: held replies to deliver, or a request
    /// held back to send (never while neither waits on it).
    fn wake_at(&self) -> Option<tokio::time::Instant> {
        let waiting = !self.held.is_empty() || (!self.deferred.is_empty() && self.in_flight == 0);
        if waiting { self.until } else { None }
    }

    /// The requests this mute holds back, judged or not.
    fn holding(&self) -> usize {
        self.held.len() + self.deferred.len()
    }

    /// Delivers every held reply (the mute is over, or the stream ends: its replies
    /// came). False when the connection is gone.
    fn release(&mut self, link: &Link) -> bool {
        self.held.drain(..).all(|(id, resolution)| link.deliver(id, resolution))
    }
}

#[cfg(test)]
pub(crate) mod tests;
