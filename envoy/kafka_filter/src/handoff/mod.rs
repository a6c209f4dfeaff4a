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
//! - Throttles: a reply that says its request was over a rate (`keg.throttle_ms`) holds
//!   the replies to the connection's next requests back that long ([`Mute`]).
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
}

/// Answers that came back for connections already closed (process-wide).
pub static LATE_ANSWERS: AtomicU64 = AtomicU64::new(0);

impl Link {
    pub fn new(waker: Box<dyn Wake>) -> Arc<Link> {
        Arc::new(Link { inner: Mutex::new(LinkInner { waker: Some(waker), answers: VecDeque::new(), late: 0 }) })
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
        let task = Task { rx, link, metadata, hash, current, connector: self.connector.clone(), down: self.down.clone() };
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
}

struct Unanswered {
    id: u64,
    direction: Direction,
    deadline: tokio::time::Instant,
}

impl Task {
    async fn run(mut self) {
        while let Some(first) = self.rx.recv().await {
            let interest = (self.current)();
            let timeout = Duration::from_millis(interest.handoff_timeout_ms);
            let Some(exchange) = self.open(&interest.endpoints, timeout).await else {
                if !self.link.deliver(first.id, Resolution::Failed(Failure::Unavailable)) {
                    return;
                }
                continue;
            };
            if !self.serve(exchange, first, timeout).await {
                return;
            }
        }
    }

    /// A stream on the connection's endpoint, or the next ones in turn.
    async fn open(&self, endpoints: &[String], timeout: Duration) -> Option<Box<dyn Exchange>> {
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
                Ok(Ok(exchange)) => {
                    self.down.lock().unwrap_or_else(|e| e.into_inner()).remove(endpoint.as_str());
                    return Some(exchange);
                }
                Ok(Err(_)) | Err(_) => {
                    self.down.lock().unwrap_or_else(|e| e.into_inner()).insert(endpoint.clone(), Instant::now() + DOWN_FOR);
                }
            }
        }
        None
    }

    /// Serves one stream until it breaks (Some(true): open another on the next
    /// message) or the connection is gone (false).
    async fn serve(&mut self, mut exchange: Box<dyn Exchange>, first: Outgoing, timeout: Duration) -> bool {
        let mut unanswered: VecDeque<Unanswered> = VecDeque::new();
        let mut mute = Mute::default();
        let mut pending = Some(first);
        loop {
            if let Some(outgoing) = pending.take() {
                let deadline = tokio::time::Instant::now() + timeout;
                let id = outgoing.id;
                unanswered.push_back(Unanswered { id, direction: outgoing.direction, deadline });
                if exchange.send(outgoing.message).is_err() {
                    return mute.release(&self.link) && self.fail(&mut unanswered, Failure::Unavailable);
                }
            }
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
                        let Some(u) = unanswered.pop_front() else { return mute.release(&self.link) };
                        let throttle = proto::throttle(&reply);
                        if !mute.deliver(&self.link, u.id, u.direction, proto::resolution(u.direction, reply)) {
                            return false;
                        }
                        if let Some(pause) = throttle {
                            mute.extend(pause);
                        }
                    }
                    Some(Err(_)) | None if unanswered.is_empty() => return mute.release(&self.link),
                    Some(Err(_)) | None => {
                        return mute.release(&self.link) && self.fail(&mut unanswered, Failure::Unavailable)
                    }
                },
                _ = sleep_until(deadline) => {
                    return mute.release(&self.link) && self.fail(&mut unanswered, Failure::Timeout)
                }
                _ = sleep_until(mute.release_at()) => {
                    if !mute.release(&self.link) {
                        return false;
                    }
                }
                outgoing = self.rx.recv() => match outgoing {
                    Some(outgoing) => pending = Some(outgoing),
                    None => return false, // the connection is gone: drop the stream
                },
            }
        }
    }

    fn fail(&self, unanswered: &mut VecDeque<Unanswered>, failure: Failure) -> bool {
        for u in unanswered.drain(..) {
            if !self.link.deliver(u.id, Resolution::Failed(failure)) {
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
/// the throttle time Kafka's clients back off on; the replies to the connection's next
/// requests (what lets them reach the broker) are held until the throttle time has
/// passed, so a client that ignores the throttle time (librdkafka) is held to the rate
/// too, and their frames, still pending, count against the connection's bound, which
/// then stops its reads. Replies to the broker's answers are never held: a client waits
/// for none of its answers longer than the broker made it (holding them too held a
/// throttled Produce's answer for the whole throttle time: librdkafka measured a 10 s
/// round trip, where Kafka answers at once and mutes the channel after).
#[derive(Default)]
struct Mute {
    until: Option<tokio::time::Instant>,
    /// Replies to requests, in order, that wait for `until`.
    held: VecDeque<(u64, Resolution)>,
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

    /// Delivers a reply now, or holds it: a request's while muted or while earlier ones
    /// are held (they go in order). False when the connection is gone.
    fn deliver(&mut self, link: &Link, id: u64, direction: Direction, resolution: Resolution) -> bool {
        if direction == Direction::Request && (self.muted() || !self.held.is_empty()) {
            self.held.push_back((id, resolution));
            return true;
        }
        link.deliver(id, resolution)
    }

    /// When the held replies may go (never while none is held).
    fn release_at(&self) -> Option<tokio::time::Instant> {
        if self.held.is_empty() { None } else { self.until }
    }

    /// Delivers every held reply (the mute is over, or the stream ends: its replies
    /// came, and a next stream starts unmuted). False when the connection is gone.
    fn release(&mut self, link: &Link) -> bool {
        self.held.drain(..).all(|(id, resolution)| link.deliver(id, resolution))
    }
}

#[cfg(test)]
pub(crate) mod tests;
