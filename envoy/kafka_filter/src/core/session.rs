//! One Kafka connection, both directions.
//!
//! Contract (what the FFI layer relies on):
//! - Ordering: a slot is reserved in the in-flight queue when a request's head has been
//!   read, before any of its bytes pass; responses leave in the order of those slots,
//!   whether the broker answers, the gateway answers ([`Disposition::Answer`]), a
//!   response is held to be examined, or a frame waits for the Python service. A broker
//!   response whose correlation id is not the oldest forwarded request's is a protocol
//!   violation.
//! - Pass-through: a frame nobody needs is forwarded as ranges of the input as it arrives
//!   (its head first, so a decision is always made before the first byte leaves).
//! - Topic selection ([`Disposition::Select`]): the request's first bytes are read for
//!   its topics ([`topics::select`]) before any of them pass; decided from the chunk at
//!   hand, nothing is copied; otherwise its bytes are kept until the topics decide (the
//!   last topic name, at worst the whole frame). Not selected: it is forwarded as a
//!   Forward request is (what was kept, then the rest as it arrives); selected, or not
//!   readable: it is handed off. An incremental Fetch naming no selected topic
//!   ([`Selection::ByAnswer`]) is collected whole and forwarded; its answer is held and
//!   passes if it names no selected topic, else the request is handed off (replayed: the
//!   broker has it already) and the answer after it, as for vouched Fetches.
//! - Hand-off ([`Disposition::HandOff`]): the whole request is collected and becomes a
//!   [`HandOff`] ([`Session::take_handoffs`]); its place in the request stream, and its
//!   slot, wait for its [`Resolution`] ([`Session::resolve`]). Requests after it are
//!   queued behind it ([`Outbox`]), never forwarded before it; the same holds for a
//!   broker response the service asked for, and the responses after it. Hand-offs are
//!   pipelined: several may be pending, each resolves into its own place.
//! - Identity: SaslHandshake and SaslAuthenticate frames (both directions) are copied
//!   while they pass and read by [`Identity`]; hand-offs carry the principal.
//! - Metrics ([`Session::meter`], when configured): every request's head and the bytes of
//!   its body as they are consumed, whatever the request's fate, go to the [`Meter`]
//!   (client id, principal, Produce topics); it reads, never holds or changes them.
//! - Bounds: every frame's size is checked against `max_frame_size` when its size prefix
//!   arrives; the core holds at most one partial head and one held frame per direction
//!   plus the gateway's own pending answers and what waits behind hand-offs
//!   ([`Session::held_bytes`], [`Session::handoff_bytes`]).
//! - Errors: any malformed input is a [`ProtocolError`]; the caller closes the
//!   connection. The core never panics on input (property-tested).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::handoff::{reading_paused, retriable_answer, Direction, HandOff, ReadBound, Resolution, MAX_PENDING_PER_CONNECTION};
use super::head::{parse_request_head, parse_response_head, Parsed, RequestHead, ResponseHead, PRODUCE, RESPONSE_HEAD};
use super::identity::{self, Identity};
use super::meter::Meter;
use super::outbox::Outbox;
use super::safeguard::ProduceChecks;
use super::rewrite::{self, Plan, RewriteReport, RouteView};
use super::skim;
use super::stats::{ApiCounter, Counter, Stats};
use super::topics::{self, Selection, TopicSelector, FETCH, HANDOFF_FETCH_MAX_BYTES};
use super::vouch::{self, FetchVerdict, Vouched, Vouching};
use super::who::{ClientId, Peer, Requester};
use super::{Output, Piece, ProtocolError};

const SASL_HANDSHAKE: i16 = identity::SASL_HANDSHAKE;
/// Held frames grow as their bytes arrive, from this much.
const INITIAL_HOLD_CAPACITY: usize = 64 * 1024;
/// A SASL frame is copied up to this much while it passes: beyond it the tracker does
/// not read it anyway (Kafka's `sasl.server.max.receive.size`), so a huge one costs no
/// copy of its own.
const OBSERVE_LIMIT: usize = identity::MAX_AUTH_BYTES + 1024;

#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub max_frame_size: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        // Kafka's socket.request.max.bytes default; responses are bounded by fetch.max.bytes.
        SessionLimits { max_frame_size: 100 * 1024 * 1024 }
    }
}

/// What happens to a request, decided from its head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Forward it to the broker as it arrives.
    Forward,
    /// Drop it; answer the client with this complete response frame (size prefix
    /// included) in its turn.
    Answer(Vec<u8>),
    /// Collect it whole and hand it to the Python service; `fail_open` says what the
    /// absence of an answer means (forward as it was, or fail closed).
    HandOff { fail_open: bool },
    /// Hand it off (as `HandOff`) if one of its topics is selected; else forward it.
    /// With `vouching`, a selected Produce (a Fetch's answer) whose records carry ids the
    /// service vouched for is forwarded too ([`vouch`]).
    Select { fail_open: bool, selector: Arc<TopicSelector>, vouching: Option<Arc<Vouching>> },
    /// A Produce only safeguards may act on: handed off (if one of its topics is
    /// selected, with a selector) unless it keeps every check ([`ProduceChecks`]); a
    /// request that does is forwarded whole.
    Checked { fail_open: bool, selector: Option<Arc<TopicSelector>>, checks: Arc<ProduceChecks> },
}

pub trait RequestPolicy {
    /// What to do with a request, from its head and who sends it.
    fn decide(&mut self, head: &RequestHead, from: &Requester<'_>) -> Disposition;

    /// Whether a failed hand-off of this whole request (its frame from the size prefix),
    /// decided to fail closed, forwards it after all: what it names only dry-run rules
    /// act on ([`super::interest::Interest::fails_open_for`]). Asked when the hand-off
    /// fails, not before.
    fn fails_open_for(&mut self, _api_key: i16, _api_version: i16, _frame: &[u8]) -> bool {
        false
    }
}

/// Phase 1's policy: every request goes to the broker.
#[derive(Debug, Default, Clone, Copy)]
pub struct ForwardAll;

impl RequestPolicy for ForwardAll {
    fn decide(&mut self, _: &RequestHead, _: &Requester<'_>) -> Disposition {
        Disposition::Forward
    }
}

impl RequestPolicy for Box<dyn RequestPolicy + Send> {
    fn decide(&mut self, head: &RequestHead, from: &Requester<'_>) -> Disposition {
        (**self).decide(head, from)
    }

    fn fails_open_for(&mut self, api_key: i16, api_version: i16, frame: &[u8]) -> bool {
        (**self).fails_open_for(api_key, api_version, frame)
    }
}

#[derive(Debug)]
enum Reply {
    /// The broker answers; `handoff` when the Python service asked for that answer.
    Broker { plan: Plan, handoff: Option<ResponseHandOff> },
    Local(Vec<u8>),
    /// The request is being collected to be handed off.
    Collecting,
    /// The request waits for the Python service's answer to hand-off `id`.
    Pending(u64),
}

#[derive(Debug)]
struct InFlight {
    correlation_id: i32,
    api_key: i16,
    api_version: i16,
    reply: Reply,
}

impl InFlight {
    fn of(head: &RequestHead, reply: Reply) -> InFlight {
        InFlight { correlation_id: head.correlation_id, api_key: head.api_key, api_version: head.api_version, reply }
    }
}

/// An answer the Python service asked for (or may ask for): what its failure means,
/// whether vouched ids may let it pass instead, and `replay`: the request, when it went
/// to the broker on vouched ids without the service seeing it. Such an answer that does
/// not pass on vouched ids is handed off after its request ([`Session::resolve`]).
#[derive(Debug, Clone)]
struct ResponseHandOff {
    fail_open: bool,
    vouching: Option<Arc<Vouching>>,
    replay: Option<Bytes>,
    /// A [`Selection::ByAnswer`] request's: an answer naming no topic it selects goes to
    /// the client as it came.
    selector: Option<Arc<TopicSelector>>,
}

/// A broker answer waiting for the service's reply to its replayed request: its place in
/// the response stream is hand-off `id`.
#[derive(Debug)]
struct Replayed {
    id: u64,
    frame: Bytes,
}

/// A request collected whole to be handed off.
#[derive(Debug)]
struct Collect {
    remaining: usize,
    api_key: i16,
    api_version: i16,
    expects_response: bool,
    fail_open: bool,
    vouching: Option<Arc<Vouching>>,
    /// [`Selection::ByAnswer`]: it goes to the broker, its answer is judged by `selector`.
    by_answer: Option<Arc<TopicSelector>>,
    /// A Produce that keeps these goes to the broker ([`Disposition::Checked`]).
    checks: Option<Arc<ProduceChecks>>,
    frame: Vec<u8>,
}

/// A request whose topics decide whether it is handed off, read so far.
#[derive(Debug)]
struct Select {
    remaining: usize,
    frame_len: usize,
    api_key: i16,
    api_version: i16,
    expects_response: bool,
    fail_open: bool,
    selector: Arc<TopicSelector>,
    vouching: Option<Arc<Vouching>>,
    checks: Option<Arc<ProduceChecks>>,
    frame: Vec<u8>,
}

#[derive(Debug)]
enum RequestState {
    Head,
    Pass(usize),
    Drop(usize),
    /// Passes, and is copied for the identity tracker (SASL frames).
    Observe { remaining: usize, api_key: i16, api_version: i16, frame: Vec<u8> },
    Collect(Collect),
    Select(Select),
}

#[derive(Debug)]
enum ResponseState {
    Head,
    /// Passes; `observe` keeps a copy for the identity tracker (SASL answers).
    Pass { remaining: usize, api_key: i16, api_version: i16, observe: Option<Vec<u8>> },
    Hold { remaining: usize, api_key: i16, api_version: i16, plan: Plan, handoff: Option<ResponseHandOff>, frame: Vec<u8> },
}

/// A hand-off whose answer has not come back.
#[derive(Debug)]
struct Pending {
    id: u64,
    direction: Direction,
    /// What was handed off: forwarded as it is when the hand-off fails open.
    frame: Bytes,
    api_key: i16,
    api_version: i16,
    expects_response: bool,
    fail_open: bool,
    vouching: Option<Arc<Vouching>>,
    /// A replayed request: the answer that waits for its reply.
    then_response: Option<Replayed>,
}

/// A Produce of a vouching range that came while an earlier Produce of that range was
/// handed off and its vouches had not passed it: the answer on its way may vouch for its
/// ids (the first frame to a topic; the frames after a vouch expired). It waits for that
/// answer, in its slot, where it would have waited anyway (nothing overtakes a handed-off
/// request), instead of crossing to the service too; then it passes on the vouches or is
/// handed off ([`Session::unpark`]).
#[derive(Debug)]
struct Parked {
    id: u64,
    frame: Vec<u8>,
    api_version: i16,
    expects_response: bool,
    fail_open: bool,
    vouching: Arc<Vouching>,
}

pub struct Session<P: RequestPolicy = ForwardAll> {
    limits: SessionLimits,
    policy: P,
    in_flight: VecDeque<InFlight>,
    request: RequestState,
    request_head: Vec<u8>,
    response: ResponseState,
    response_head: Vec<u8>,
    next_handoff: u64,
    /// Schema ids the service vouched for, for records produced and fetched.
    vouched_requests: Vouched,
    vouched_responses: Vouched,
    handoffs: VecDeque<HandOff>, // made, not taken yet
    pending: VecDeque<Pending>,
    /// Produce requests decided once an earlier hand-off's answer (and its vouches) is in.
    parked: VecDeque<Parked>,
    /// Whether the latest answer to a Produce handed off under a vouching range vouched
    /// for anything (true before any): requests wait for answers only while they do.
    service_vouches: bool,
    requests_out: Outbox,
    responses_out: Outbox,
    pub identity: Identity,
    /// The client's address and listener, as rules match them (set by the filter).
    pub peer: Peer,
    pub stats: Stats,
    /// Labelled counts (None: the configuration asks for none, nothing is read for them).
    pub meter: Option<Meter>,
}

impl Session<ForwardAll> {
    pub fn new(limits: SessionLimits) -> Self {
        Session::with_policy(limits, ForwardAll)
    }
}

enum HeadBytes {
    Input(usize, usize),
    Kept(Vec<u8>),
}

impl HeadBytes {
    fn len(&self) -> usize {
        match self {
            HeadBytes::Input(start, end) => end - start,
            HeadBytes::Kept(bytes) => bytes.len(),
        }
    }

    fn emit(self, out: &mut Output) {
        match self {
            HeadBytes::Input(start, end) => out.pass(start..end),
            HeadBytes::Kept(bytes) => out.owned(bytes),
        }
    }

    fn to_vec(&self, input: &[u8], capacity: usize) -> Vec<u8> {
        let mut frame = Vec::with_capacity(capacity.max(self.len()));
        match self {
            HeadBytes::Input(start, end) => frame.extend_from_slice(&input[*start..*end]),
            HeadBytes::Kept(bytes) => frame.extend_from_slice(bytes),
        }
        frame
    }
}

impl<P: RequestPolicy> Session<P> {
    pub fn with_policy(limits: SessionLimits, policy: P) -> Self {
        Session {
            limits,
            policy,
            in_flight: VecDeque::new(),
            request: RequestState::Head,
            request_head: Vec::new(),
            response: ResponseState::Head,
            response_head: Vec::new(),
            next_handoff: 1,
            vouched_requests: Vouched::default(),
            vouched_responses: Vouched::default(),
            handoffs: VecDeque::new(),
            pending: VecDeque::new(),
            parked: VecDeque::new(),
            service_vouches: true,
            requests_out: Outbox::default(),
            responses_out: Outbox::default(),
            identity: Identity::default(),
            peer: Peer::default(),
            stats: Stats::default(),
            meter: None,
        }
    }

    /// Bytes the core holds for this connection.
    pub fn held_bytes(&self) -> usize {
        let held = match &self.response {
            ResponseState::Hold { frame, .. } => frame.len(),
            ResponseState::Pass { observe: Some(frame), .. } => frame.len(),
            _ => 0,
        };
        let request = match &self.request {
            RequestState::Observe { frame, .. } => frame.len(),
            _ => 0,
        };
        let local: usize = self.in_flight.iter().map(|e| match &e.reply {
            Reply::Local(bytes) => bytes.len(),
            _ => 0,
        }).sum();
        self.request_head.len() + self.response_head.len() + held + request + local + self.handoff_bytes()
    }

    /// Bytes handed off and not answered yet, being collected to be handed off, or
    /// queued behind a hand-off (the per-connection hand-off bound counts these).
    pub fn handoff_bytes(&self) -> usize {
        let collecting = match &self.request {
            RequestState::Collect(c) => c.frame.len(),
            RequestState::Select(s) => s.frame.len(),
            _ => 0,
        };
        collecting + self.handoff_bytes_awaiting_answers()
    }

    /// The part of [`Self::handoff_bytes`] that answers will release: frames handed off,
    /// and what is queued behind them; not the frame still being read (collected to be
    /// handed off, or read for its topics), which only more reading can complete.
    pub fn handoff_bytes_awaiting_answers(&self) -> usize {
        let pending: usize = self.pending.iter()
            .map(|p| p.frame.len() + p.then_response.as_ref().map_or(0, |r| r.frame.len())).sum();
        let parked: usize = self.parked.iter().map(|p| p.frame.len()).sum();
        pending + parked + self.requests_out.bytes() + self.responses_out.bytes()
    }

    /// Requests whose responses have not left yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Hand-offs whose answers have not come back.
    pub fn pending_handoffs(&self) -> usize {
        self.pending.len()
    }

    /// Whether requests wait behind a hand-off (a client's end of stream must wait too).
    pub fn requests_waiting(&self) -> bool {
        !self.requests_out.is_empty()
    }

    /// Whether responses wait behind a hand-off.
    pub fn responses_waiting(&self) -> bool {
        !self.responses_out.is_empty()
    }

    /// The frames to hand to the Python service now: the requests made and not taken
    /// yet, in order, as long as fewer than [`MAX_PENDING_PER_CONNECTION`] taken ones
    /// wait for their answers (each answer lets one more go), and every broker's answer
    /// made, whatever waits. The service answers a connection's frames one at a time
    /// and the hand-off timeout runs from when a frame is sent: a client pipelining
    /// thousands must not have them all sent at once. An answer of the broker waits on
    /// nothing but its own request, judged and forwarded before: behind the window, it
    /// waited for requests a throttle held (librdkafka saw no answer for 20 s, timed
    /// out and sent its records again: 17,888 stored twice of 6,000).
    pub fn take_handoffs(&mut self) -> Vec<HandOff> {
        let sent = self.pending.len().saturating_sub(self.handoffs.len());
        let mut room = MAX_PENDING_PER_CONNECTION.saturating_sub(sent);
        let mut taken = Vec::new();
        let mut waiting = VecDeque::new();
        for handoff in self.handoffs.drain(..) {
            let goes = match handoff.direction {
                Direction::Response => true,
                Direction::Request => waiting.is_empty() && room > 0,
            };
            if !goes {
                waiting.push_back(handoff);
                continue;
            }
            if handoff.direction == Direction::Request {
                room -= 1;
            }
            taken.push(handoff);
        }
        self.handoffs = waiting;
        taken
    }

    // -- client -> broker -------------------------------------------------------------

    /// Feeds bytes from the client; `out` receives what to forward to the broker now
    /// (what waits behind a hand-off leaves later, see [`Session::ready_requests`]).
    pub fn feed_requests(&mut self, input: &[u8], out: &mut Output) -> Result<(), ProtocolError> {
        self.feed_requests_within(input, out, None).map(|_| ())
    }

    /// [`Session::feed_requests`], but it stops at a frame's start once the hand-offs
    /// awaiting answers are past `bound` (the filter then stops reading from the client)
    /// and returns how many bytes it took: the rest stays with the caller, to be fed
    /// again when reading resumes. Before, one read of Envoy's (up to its 1 MiB buffer:
    /// 41,943 pipelined Metadata requests) was taken whole, each frame a hand-off, and a
    /// client that never read its answers kept the service busy for minutes.
    pub fn feed_requests_within(&mut self, input: &[u8], out: &mut Output, bound: Option<ReadBound>)
        -> Result<usize, ProtocolError> {
        let start = out.pieces.len();
        let mut pos = 0;
        while pos < input.len() {
            if bound.is_some_and(|b| self.past(b)) {
                break;
            }
            let (body_from, in_body) = (pos, !matches!(self.request, RequestState::Head));
            let more = self.feed_request_state(input, &mut pos, out)?;
            if in_body {
                if let Some(meter) = &mut self.meter {
                    meter.body(&input[body_from..pos]);
                }
            }
            if !more {
                break; // the input ended inside a head, which is kept: all of it taken
            }
        }
        self.requests_out.route(input, out, start);
        Ok(pos)
    }

    /// Whether, at the start of a frame, what awaits answers is past `bound`.
    fn past(&self, bound: ReadBound) -> bool {
        matches!(self.request, RequestState::Head)
            && self.request_head.is_empty()
            && !self.pending.is_empty()
            && reading_paused(false, self.handoff_bytes_awaiting_answers(), self.pending.len(),
                              bound.max_bytes, bound.max_frames)
    }

    /// One step of [`Session::feed_requests`]: the current request state takes what it
    /// can of `input` from `at`; false when the input ended inside a head (kept).
    fn feed_request_state(&mut self, input: &[u8], at: &mut usize, out: &mut Output) -> Result<bool, ProtocolError> {
        let mut pos = *at;
        match &mut self.request {
            RequestState::Pass(remaining) => {
                let remaining = *remaining;
                let n = remaining.min(input.len() - pos);
                out.pass(pos..pos + n);
                pos += n;
                self.request_continues(remaining - n, false);
            }
            RequestState::Drop(remaining) => {
                let remaining = *remaining;
                let n = remaining.min(input.len() - pos);
                pos += n;
                self.request_continues(remaining - n, true);
            }
            RequestState::Observe { remaining, frame, .. } => {
                let n = (*remaining).min(input.len() - pos);
                out.pass(pos..pos + n);
                copy_observed(frame, &input[pos..pos + n]);
                pos += n;
                *remaining -= n;
                if *remaining == 0 {
                    self.observed_request();
                }
            }
            RequestState::Collect(collect) => {
                let n = collect.remaining.min(input.len() - pos);
                collect.frame.extend_from_slice(&input[pos..pos + n]);
                pos += n;
                collect.remaining -= n;
                if collect.remaining == 0 {
                    self.collected(out);
                }
            }
            RequestState::Select(select) => {
                let n = select.remaining.min(input.len() - pos);
                select.frame.extend_from_slice(&input[pos..pos + n]);
                pos += n;
                select.remaining -= n;
                let RequestState::Select(select) = std::mem::replace(&mut self.request, RequestState::Head) else {
                    unreachable!()
                };
                self.select(select, out);
            }
            RequestState::Head => {
                let Some(head) = self.request_head(input, &mut pos)? else {
                    *at = pos;
                    return Ok(false);
                };
                self.on_request_head(head, input, &mut pos, out);
            }
        }
        *at = pos;
        Ok(true)
    }

    /// The head of the next request, from the input or from bytes kept from earlier
    /// chunks; None when the input ran out first (the bytes are kept).
    fn request_head(&mut self, input: &[u8], pos: &mut usize) -> Result<Option<RequestHead>, ProtocolError> {
        let max = self.limits.max_frame_size;
        if self.request_head.is_empty() {
            match parse_request_head(&input[*pos..], max)? {
                Parsed::Head(head) => return Ok(Some(head)),
                Parsed::NeedAtLeast(_) => {
                    self.request_head.extend_from_slice(&input[*pos..]);
                    *pos = input.len();
                    return Ok(None);
                }
            }
        }
        loop {
            match parse_request_head(&self.request_head, max)? {
                Parsed::Head(head) => return Ok(Some(head)),
                Parsed::NeedAtLeast(need) => {
                    if *pos == input.len() {
                        return Ok(None);
                    }
                    let buffered = self.request_head.len();
                    // Once the size is known, take the rest of the frame at once (it is
                    // copied anyway: the output is no longer the input as it came).
                    let until = super::head::frame_size(&self.request_head, 0, max)?
                        .map_or(need, |size| super::head::SIZE_PREFIX + size);
                    let take = (until - buffered).min(input.len() - *pos);
                    self.request_head.extend_from_slice(&input[*pos..*pos + take]);
                    *pos += take;
                }
            }
        }
    }

    fn on_request_head(&mut self, head: RequestHead, input: &[u8], pos: &mut usize, out: &mut Output) {
        let frame_len = head.frame_len();
        self.stats.api(head.api_key, ApiCounter::Requests, 1);
        self.stats.api(head.api_key, ApiCounter::RequestBytes, frame_len as u64);
        let head_bytes = if self.request_head.is_empty() {
            let start = *pos;
            *pos += head.head_len;
            HeadBytes::Input(start, *pos)
        } else {
            HeadBytes::Kept(std::mem::take(&mut self.request_head))
        };
        let remaining = frame_len - head_bytes.len();
        // Read from the frame's first bytes, as many as arrived with its head.
        let client_id = ClientId::read(head.client_id, match &head_bytes {
            HeadBytes::Input(start, _) => &input[*start..],
            HeadBytes::Kept(kept) => kept.as_slice(),
        });
        if let Some(meter) = &mut self.meter {
            let identity = &self.identity;
            meter.principal(identity.epoch(), || identity.principal());
            meter.request(head.api_key, head.api_version, client_id, frame_len - head.head_len);
            if let HeadBytes::Kept(kept) = &head_bytes {
                meter.body(&kept[head.head_len..]); // the rest of the frame's first read
            }
        }
        let from = Requester { identity: &self.identity, peer: &self.peer, client_id };
        let disposition = if head.api_key == SASL_HANDSHAKE && head.api_version == 0 {
            Disposition::Answer(raw_sasl_refused(head.correlation_id))
        } else {
            self.policy.decide(&head, &from)
        };
        match disposition {
            Disposition::Forward => {
                if head.expects_response() {
                    let plan = self.response_plan(head.api_key, head.api_version);
                    self.in_flight.push_back(InFlight::of(&head, Reply::Broker { plan, handoff: None }));
                }
                if identity::observes(head.api_key) {
                    let frame = head_bytes.to_vec(input, frame_len.min(identity::MAX_AUTH_BYTES));
                    head_bytes.emit(out);
                    self.request = RequestState::Observe {
                        remaining, api_key: head.api_key, api_version: head.api_version, frame,
                    };
                    if remaining == 0 {
                        self.observed_request();
                    }
                } else {
                    head_bytes.emit(out);
                    self.request_continues(remaining, false);
                }
            }
            Disposition::Answer(response) => {
                self.stats.add(Counter::LocalAnswers, 1);
                if head.expects_response() {
                    self.in_flight.push_back(InFlight::of(&head, Reply::Local(response)));
                }
                self.request_continues(remaining, true);
            }
            Disposition::Select { fail_open, selector, vouching } => {
                self.select_from_head(&head, head_bytes, input, fail_open, selector, vouching, None, out);
            }
            Disposition::Checked { fail_open, selector: Some(selector), checks } => {
                self.select_from_head(&head, head_bytes, input, fail_open, selector, None, Some(checks), out);
            }
            Disposition::Checked { fail_open, selector: None, checks } => {
                self.collect_from_head(&head, head_bytes, input, fail_open, Some(checks), out);
            }
            Disposition::HandOff { fail_open } => {
                self.collect_from_head(&head, head_bytes, input, fail_open, None, out);
            }
        }
    }

    /// A request's slot while it is collected or selected (the last: no head is read
    /// meanwhile).
    fn reserve_collecting(&mut self, head: &RequestHead) {
        if head.expects_response() {
            self.in_flight.push_back(InFlight::of(head, Reply::Collecting));
        }
    }

    /// A request to collect whole, from its head on (see [`Session::collect`]).
    fn collect_from_head(&mut self, head: &RequestHead, head_bytes: HeadBytes, input: &[u8], fail_open: bool,
                         checks: Option<Arc<ProduceChecks>>, out: &mut Output) {
        self.reserve_collecting(head);
        let frame_len = head.frame_len();
        let remaining = frame_len - head_bytes.len();
        let frame = head_bytes.to_vec(input, frame_len.min(INITIAL_HOLD_CAPACITY));
        self.collect(head, fail_open, None, None, checks, remaining, frame, out);
    }

    /// A request whose topics decide, from its head on: decided at once when the chunk
    /// at hand holds its topics (nothing is copied), else kept until they arrive.
    #[allow(clippy::too_many_arguments)]
    fn select_from_head(&mut self, head: &RequestHead, head_bytes: HeadBytes, input: &[u8], fail_open: bool,
                        selector: Arc<TopicSelector>, vouching: Option<Arc<Vouching>>,
                        checks: Option<Arc<ProduceChecks>>, out: &mut Output) {
        let frame_len = head.frame_len();
        let remaining = frame_len - head_bytes.len();
        self.reserve_collecting(head);
        if let HeadBytes::Input(start, end) = head_bytes {
            // Decided from this chunk alone: no byte is copied.
            let here = &input[start..input.len().min(start + frame_len)];
            let decision = topics::select(head.api_key, head.api_version, here, frame_len, &selector);
            match decision {
                Selection::Pass => {
                    self.not_selected(head.api_key, head.api_version, head.expects_response());
                    out.pass(start..end);
                    self.request_continues(remaining, false);
                    return;
                }
                Selection::HandOff | Selection::ByAnswer => {
                    let frame = head_bytes.to_vec(input, frame_len.min(INITIAL_HOLD_CAPACITY));
                    let by_answer = (decision == Selection::ByAnswer).then_some(selector);
                    self.collect(head, fail_open, vouching, by_answer, checks, remaining, frame, out);
                    return;
                }
                Selection::NeedMore => {}
            }
        }
        let frame = head_bytes.to_vec(input, frame_len.min(INITIAL_HOLD_CAPACITY));
        let select = Select {
            remaining: frame_len - frame.len(),
            frame_len,
            api_key: head.api_key,
            api_version: head.api_version,
            expects_response: head.expects_response(),
            fail_open,
            selector,
            vouching,
            checks,
            frame,
        };
        self.select(select, out);
    }

    /// Collects a request to hand it off (`frame`: its bytes so far, `remaining` to come);
    /// handed off at once when it is whole.
    #[allow(clippy::too_many_arguments)]
    fn collect(&mut self, head: &RequestHead, fail_open: bool, vouching: Option<Arc<Vouching>>,
               by_answer: Option<Arc<TopicSelector>>, checks: Option<Arc<ProduceChecks>>, remaining: usize,
               frame: Vec<u8>, out: &mut Output) {
        self.request = RequestState::Collect(Collect {
            remaining,
            api_key: head.api_key,
            api_version: head.api_version,
            expects_response: head.expects_response(),
            fail_open,
            vouching,
            by_answer,
            checks,
            frame,
        });
        if remaining == 0 {
            self.collected(out);
        }
    }

    /// A request whose topics decide: read what is kept of it so far.
    fn select(&mut self, s: Select, out: &mut Output) {
        let decision = match topics::select(s.api_key, s.api_version, &s.frame, s.frame_len, &s.selector) {
            // The whole frame is here and still undecided: cannot happen (a complete
            // frame decides), handed off if it does.
            Selection::NeedMore if s.remaining == 0 => Selection::HandOff,
            decision => decision,
        };
        match decision {
            Selection::NeedMore => self.request = RequestState::Select(s),
            Selection::Pass => {
                self.not_selected(s.api_key, s.api_version, s.expects_response);
                out.owned(s.frame);
                self.request_continues(s.remaining, false);
            }
            Selection::HandOff | Selection::ByAnswer => {
                self.request = RequestState::Collect(Collect {
                    remaining: s.remaining,
                    api_key: s.api_key,
                    api_version: s.api_version,
                    expects_response: s.expects_response,
                    fail_open: s.fail_open,
                    vouching: s.vouching,
                    by_answer: (decision == Selection::ByAnswer).then_some(s.selector),
                    checks: s.checks,
                    frame: s.frame,
                });
                if s.remaining == 0 {
                    self.collected(out);
                }
            }
        }
    }

    /// A request no selected topic names goes to the broker as a Forward one does: its
    /// slot (the last: no head is read while one is selected) waits for the broker.
    fn not_selected(&mut self, api_key: i16, api_version: i16, expects_response: bool) {
        self.stats.add(Counter::HandoffNotSelected, 1);
        self.forwarded_whole(api_key, api_version, expects_response);
    }

    /// A request kept whole (or in part) goes to the broker after all: its slot (the
    /// last) waits for the broker's answer.
    fn forwarded_whole(&mut self, api_key: i16, api_version: i16, expects_response: bool) {
        if expects_response {
            let plan = self.response_plan(api_key, api_version);
            if let Some(entry) = self.in_flight.back_mut() {
                entry.reply = Reply::Broker { plan, handoff: None };
            }
        }
    }

    fn response_plan(&mut self, api_key: i16, api_version: i16) -> Plan {
        let (plan, unreadable) = rewrite::plan(api_key, api_version);
        if unreadable {
            self.stats.add(Counter::UnreadableVersions, 1);
        }
        plan
    }

    fn request_continues(&mut self, remaining: usize, drop: bool) {
        self.request = if remaining > 0 {
            if drop { RequestState::Drop(remaining) } else { RequestState::Pass(remaining) }
        } else {
            RequestState::Head
        };
    }

    /// A SASL request passed whole: the identity tracker reads it.
    fn observed_request(&mut self) {
        if let RequestState::Observe { api_key, api_version, frame, .. } =
            std::mem::replace(&mut self.request, RequestState::Head)
        {
            self.identity.observe_request(api_key, api_version, &frame);
        }
        self.request_continues(0, false);
    }

    /// A request collected whole: it becomes a hand-off and takes its place in the
    /// request stream (and its slot) until its answer comes back.
    fn collected(&mut self, out: &mut Output) {
        let RequestState::Collect(mut c) = std::mem::replace(&mut self.request, RequestState::Head) else {
            unreachable!("collected() outside Collect")
        };
        self.request_continues(0, false);
        if identity::observes(c.api_key) {
            self.identity.observe_request(c.api_key, c.api_version, &c.frame);
        }
        if c.api_key == PRODUCE && c.checks.as_ref().is_some_and(|checks| checks.passes(&c.frame, c.api_version)) {
            // Keeps every safeguard: no rule of its range can act on it.
            self.forwarded_whole(c.api_key, c.api_version, c.expects_response);
            self.stats.add(Counter::HandoffSafeguardsKept, 1);
            out.owned(c.frame);
            return;
        }
        if c.api_key == PRODUCE && self.vouched_request(&c) {
            self.forwarded_whole(c.api_key, c.api_version, c.expects_response);
            self.stats.add(Counter::HandoffVouched, 1);
            out.owned(c.frame);
            return;
        }
        if let (PRODUCE, Some(vouching)) = (c.api_key, &c.vouching) {
            if self.vouches_awaited(vouching) {
                let id = self.awaiting_answer(c.expects_response);
                let vouching = vouching.clone();
                self.parked.push_back(Parked {
                    id, frame: c.frame, api_version: c.api_version, expects_response: c.expects_response,
                    fail_open: c.fail_open, vouching,
                });
                out.pieces.push(Piece::HandOff(id));
                return;
            }
        }
        // A Fetch's (ShareFetch's) answer can be read before it leaves.
        let answer_read = topics::judged_by_answer(c.api_key) && c.expects_response;
        let by_answer = answer_read && c.by_answer.is_some();
        if by_answer || (answer_read && c.api_key == FETCH && self.vouched_fetch(&c)) {
            // Its answer is read for selected topics and vouched ids; one that does not
            // pass goes to the service after this request, replayed (held_response).
            // The replay is what the client asked for: the service's request rules judge
            // that; the broker is asked for what one hand-off of its answer can carry.
            let replay = Some(Bytes::from(c.frame.clone()));
            if by_answer {
                // (A vouched Fetch's answer has its own bound: it is cut at a batch
                // boundary past what one frame may validate, `vouch::fetch_verdict`.)
                self.cap_fetch(c.api_key, c.api_version, &mut c.frame);
            }
            let plan = self.response_plan(c.api_key, c.api_version);
            let handoff = ResponseHandOff { fail_open: c.fail_open, vouching: c.vouching, replay, selector: c.by_answer };
            if let Some(entry) = self.in_flight.back_mut() {
                entry.reply = Reply::Broker { plan, handoff: Some(handoff) };
            }
            self.stats.add(if by_answer { Counter::HandoffByAnswer } else { Counter::HandoffVouched }, 1);
            out.owned(c.frame);
            return;
        }
        let id = self.awaiting_answer(c.expects_response);
        let frame = Bytes::from(c.frame);
        self.stats.add(Counter::HandoffRequests, 1);
        self.hand_off(id, Direction::Request, frame, c.api_key, c.api_version, c.expects_response, c.fail_open, c.vouching);
        out.pieces.push(Piece::HandOff(id));
    }

    /// A Fetch whose answer the service may read (it asked for it, or the answer is read
    /// for selected topics and vouched ids first) asks the broker for no more than one
    /// hand-off can carry in time ([`HANDOFF_FETCH_MAX_BYTES`]). Not before: the request
    /// rules see what the client asked for.
    fn cap_fetch(&mut self, api_key: i16, api_version: i16, frame: &mut [u8]) {
        if api_key == FETCH && topics::cap_fetch_max_bytes(frame, api_version, HANDOFF_FETCH_MAX_BYTES) {
            self.stats.add(Counter::HandoffFetchCapped, 1);
        }
    }

    /// Whether a collected Fetch may go to the broker without the service: every topic of
    /// it a rule selects is vouched for (its answer is then read for vouched ids).
    fn vouched_fetch(&self, c: &Collect) -> bool {
        c.vouching.as_ref().is_some_and(|v| {
            self.vouched_responses.applies_to(v)
                && vouch::fetch_request_passes(&c.frame, c.api_version, v, &self.vouched_responses, Instant::now())
        })
    }

    /// Whether an answer that may vouch for Produce requests of `vouching`'s range is on
    /// its way (a Produce of that range handed off), or requests of it wait for one.
    fn vouches_awaited(&self, vouching: &Arc<Vouching>) -> bool {
        !self.parked.is_empty() || self.answer_may_vouch(vouching)
    }

    /// Whether a Produce of `vouching`'s range is handed off, its answer not in yet, and
    /// the service's answers vouch (one that does not, Avro payloads say, or a failed
    /// hand-off, stops the waiting: requests then go to the service as they come).
    fn answer_may_vouch(&self, vouching: &Arc<Vouching>) -> bool {
        self.service_vouches && self.pending.iter().any(|p| {
            p.direction == Direction::Request && p.api_key == PRODUCE && p.then_response.is_none()
                && p.vouching.as_ref().is_some_and(|v| Arc::ptr_eq(v, vouching))
        })
    }

    /// Decides the parked Produce requests, in order, once an answer is in: each passes
    /// on the vouches now known, or waits on while another answer that may vouch is on
    /// its way (and so do those after it: the service sees requests in order), or is
    /// handed off.
    fn unpark(&mut self) {
        while let Some(p) = self.parked.pop_front() {
            if self.produce_vouched(&p.frame, p.api_version, &p.vouching) {
                if p.expects_response {
                    let plan = self.response_plan(PRODUCE, p.api_version);
                    if let Some(entry) = self.slot_awaiting(p.id) {
                        entry.reply = Reply::Broker { plan, handoff: None };
                    }
                }
                self.stats.add(Counter::HandoffVouched, 1);
                self.requests_out.fill(p.id, p.frame);
            } else if self.answer_may_vouch(&p.vouching) {
                self.parked.push_front(p);
                return;
            } else {
                self.stats.add(Counter::HandoffRequests, 1);
                self.hand_off(p.id, Direction::Request, Bytes::from(p.frame), PRODUCE, p.api_version, p.expects_response,
                              p.fail_open, Some(p.vouching));
            }
        }
    }

    /// The id of the collected request's answer to come (from the service, or after a
    /// wait for one), which its slot (the last: no head is read while one is collected)
    /// now waits for.
    fn awaiting_answer(&mut self, expects_response: bool) -> u64 {
        let id = self.next_handoff;
        self.next_handoff += 1;
        if expects_response {
            if let Some(entry) = self.in_flight.back_mut() {
                entry.reply = Reply::Pending(id);
            }
        }
        id
    }

    /// The slot waiting for answer `id`.
    fn slot_awaiting(&mut self, id: u64) -> Option<&mut InFlight> {
        self.in_flight.iter_mut().find(|e| matches!(e.reply, Reply::Pending(p) if p == id))
    }

    /// Whether a collected Produce passes on ids the service vouched for.
    fn vouched_request(&self, c: &Collect) -> bool {
        c.vouching.as_ref().is_some_and(|v| self.produce_vouched(&c.frame, c.api_version, v))
    }

    /// Whether a Produce of `vouching`'s range passes on the vouches known now.
    fn produce_vouched(&self, frame: &[u8], api_version: i16, vouching: &Arc<Vouching>) -> bool {
        self.vouched_requests.applies_to(vouching)
            && vouch::produce_passes(frame, api_version, vouching, &self.vouched_requests, Instant::now())
    }

    #[allow(clippy::too_many_arguments)]
    fn hand_off(&mut self, id: u64, direction: Direction, frame: Bytes, api_key: i16, api_version: i16,
                expects_response: bool, fail_open: bool, vouching: Option<Arc<Vouching>>) {
        self.handoffs.push_back(HandOff {
            id,
            direction,
            frame: frame.clone(),
            api_key,
            api_version,
            principal: self.identity.known_principal(),
            security_protocol: self.identity.security_protocol(),
        });
        self.pending.push_back(Pending {
            id, direction, frame, api_key, api_version, expects_response, fail_open, vouching, then_response: None,
        });
    }

    /// Requests that may go to the broker now, after answers came back.
    pub fn ready_requests(&mut self, out: &mut Output) {
        self.requests_out.drain_ready(out);
    }

    // -- answers from the Python service ----------------------------------------------

    /// Applies the answer to hand-off `id` (or its absence). An id that is not pending
    /// (answered already, or a late answer after a failure) is ignored: a frame handed
    /// off is forwarded or replaced once, never twice. Err: close the connection.
    pub fn resolve(&mut self, id: u64, resolution: Resolution) -> Result<(), ProtocolError> {
        let Some(index) = self.pending.iter().position(|p| p.id == id) else {
            return Ok(());
        };
        let Some(mut pending) = self.pending.remove(index) else { return Ok(()) };
        if let Some(unsent) = self.handoffs.iter().position(|h| h.id == id) {
            self.handoffs.remove(unsent); // resolved before it was taken: never sent
        }
        if pending.direction == Direction::Request && pending.api_key == PRODUCE && pending.vouching.is_some() {
            self.service_vouches = matches!(&resolution, Resolution::Request { vouched, .. } if !vouched.is_empty());
        }
        let resolution = self.learn_vouches(&pending, resolution);
        if let Resolution::Failed(_) = resolution {
            self.stats.add(Counter::HandoffFailures, 1);
            if !pending.fail_open && pending.direction == Direction::Request && pending.api_key == PRODUCE {
                // Read only now, when it matters: a Produce naming no topic an enforced
                // rule acts on fails open.
                pending.fail_open = self.policy.fails_open_for(pending.api_key, pending.api_version, &pending.frame);
            }
            if pending.fail_open {
                self.stats.add(Counter::HandoffFailedOpen, 1);
            }
        }
        match pending.direction {
            Direction::Request if pending.then_response.is_some() => self.resolve_replay(pending, resolution),
            Direction::Request => self.resolve_request(pending, resolution),
            Direction::Response => self.resolve_response(pending, resolution),
        }?;
        self.unpark();
        Ok(())
    }

    /// The reply to a replayed request (it went to the broker already): its answer goes
    /// to the service if the reply asks for it, else to the client as it came; a gateway
    /// answer (a rule refusing it now) takes the answer's place.
    fn resolve_replay(&mut self, mut p: Pending, resolution: Resolution) -> Result<(), ProtocolError> {
        let Some(answer) = p.then_response.take() else { return Ok(()) };
        let api = api_name(p.api_key);
        match resolution {
            Resolution::Request { answer: Some(own), .. } => {
                if correlation_id(&own, 4) != correlation_id(&p.frame, 8) {
                    return Err(ProtocolError::HandOff(format!("the service's answer to a {api} request has another correlation id")));
                }
                self.stats.add(Counter::HandoffAnswers, 1);
                self.responses_out.fill(answer.id, own);
            }
            Resolution::Request { want_response: true, .. } => {
                self.stats.add(Counter::HandoffResponses, 1);
                self.hand_off(answer.id, Direction::Response, answer.frame, p.api_key, p.api_version, true, p.fail_open, p.vouching);
            }
            Resolution::Request { .. } => {
                self.responses_out.fill(answer.id, answer.frame.to_vec());
            }
            Resolution::Failed(_) if p.fail_open => {
                self.responses_out.fill(answer.id, answer.frame.to_vec());
            }
            Resolution::Failed(failure) => match retriable_answer(Direction::Response, p.api_key, p.api_version, &answer.frame) {
                Some(refused) => {
                    self.stats.add(Counter::HandoffRetriableErrors, 1);
                    self.responses_out.fill(answer.id, refused);
                }
                None => return Err(ProtocolError::HandOff(format!(
                    "no answer from the service for a {api} request ({failure:?}): fail-closed"))),
            },
            Resolution::Close => return Err(ProtocolError::HandOff(format!("the service closed the connection at a {api} request"))),
            Resolution::Response { .. } => return Err(ProtocolError::HandOff(format!("a response's answer to a {api} request"))),
        }
        Ok(())
    }

    /// Keeps what the service vouched for in its answer (see [`vouch`]).
    /// Vouches count only for frames of the range (and table) the frame was handed off
    /// under; a frame handed off without vouching brings none.
    fn learn_vouches(&mut self, pending: &Pending, mut resolution: Resolution) -> Resolution {
        let vouches = match &mut resolution {
            Resolution::Request { vouched, .. } | Resolution::Response { vouched, .. } => std::mem::take(vouched),
            _ => return resolution,
        };
        if let (false, Some(under)) = (vouches.is_empty(), &pending.vouching) {
            let known = match pending.direction {
                Direction::Request => &mut self.vouched_requests,
                Direction::Response => &mut self.vouched_responses,
            };
            known.learn(vouches, under, Instant::now());
        }
        resolution
    }

    fn resolve_request(&mut self, p: Pending, resolution: Resolution) -> Result<(), ProtocolError> {
        let err = |why: String| Err(ProtocolError::HandOff(why));
        let api = api_name(p.api_key);
        let (forward, reply) = match resolution {
            Resolution::Request { forward, answer: Some(answer), .. } => {
                if !forward.is_empty() {
                    return err(format!("the service both answered and forwarded a {api} request"));
                }
                if !p.expects_response {
                    return err(format!("the service answered a {api} request that expects no response"));
                }
                if correlation_id(&answer, 4) != correlation_id(&p.frame, 8) {
                    return err(format!("the service's answer to a {api} request has another correlation id"));
                }
                self.stats.add(Counter::HandoffAnswers, 1);
                (Vec::new(), Some(Reply::Local(answer)))
            }
            Resolution::Request { mut forward, answer: None, want_response, .. } if !forward.is_empty() => {
                if want_response {
                    self.cap_fetch(p.api_key, p.api_version, &mut forward);
                }
                let plan = self.response_plan(p.api_key, p.api_version);
                let handoff = want_response.then(|| ResponseHandOff {
                    fail_open: p.fail_open, vouching: p.vouching.clone(), replay: None, selector: None,
                });
                (forward, p.expects_response.then_some(Reply::Broker { plan, handoff }))
            }
            Resolution::Request { .. } => {
                if p.expects_response {
                    return err(format!("the service dropped a {api} request that expects a response"));
                }
                (Vec::new(), None)
            }
            Resolution::Failed(_) if p.fail_open => {
                let plan = self.response_plan(p.api_key, p.api_version);
                (p.frame.to_vec(), p.expects_response.then_some(Reply::Broker { plan, handoff: None }))
            }
            Resolution::Failed(failure) => {
                if !p.expects_response {
                    (Vec::new(), None) // acks=0: nobody waits for an answer; counted
                } else if let Some(answer) = retriable_answer(Direction::Request, p.api_key, p.api_version, &p.frame) {
                    self.stats.add(Counter::HandoffRetriableErrors, 1);
                    (Vec::new(), Some(Reply::Local(answer)))
                } else {
                    return err(format!("no answer from the service for a {api} request ({failure:?}): fail-closed"));
                }
            }
            Resolution::Close => return err(format!("the service closed the connection at a {api} request")),
            Resolution::Response { .. } => return err(format!("a response's answer to a {api} request")),
        };
        if let Some(reply) = reply {
            match self.slot_awaiting(p.id) {
                Some(entry) => entry.reply = reply,
                None => return err(format!("no slot for the {api} request handed off")),
            }
        }
        self.requests_out.fill(p.id, forward);
        Ok(())
    }

    fn resolve_response(&mut self, p: Pending, resolution: Resolution) -> Result<(), ProtocolError> {
        let api = api_name(p.api_key);
        let answer = match resolution {
            Resolution::Response { answer, .. } if correlation_id(&answer, 4).is_some()
                && correlation_id(&answer, 4) == correlation_id(&p.frame, 4) => answer,
            Resolution::Failed(_) if p.fail_open => p.frame.to_vec(),
            Resolution::Failed(failure) => match retriable_answer(Direction::Response, p.api_key, p.api_version, &p.frame) {
                Some(answer) => {
                    self.stats.add(Counter::HandoffRetriableErrors, 1);
                    answer
                }
                None => return Err(ProtocolError::HandOff(format!(
                    "no answer from the service for a {api} response ({failure:?}): fail-closed"))),
            },
            Resolution::Close => {
                return Err(ProtocolError::HandOff(format!("the service closed the connection at a {api} response")))
            }
            _ => return Err(ProtocolError::HandOff(format!(
                "the service's answer to a {api} response is not one (empty, or another correlation id)"))),
        };
        self.responses_out.fill(p.id, answer);
        Ok(())
    }

    // -- broker -> client -------------------------------------------------------------

    /// What may go to the client now: answers to hand-offs that came back, and the
    /// gateway's own answers that are due (the response stream is between frames and
    /// they are the oldest outstanding). Call after feeding requests or resolving.
    pub fn ready_responses(&mut self, out: &mut Output) {
        self.responses_out.drain_ready(out);
        let start = out.pieces.len();
        self.local_answers(out);
        self.responses_out.route(&[], out, start);
    }

    fn local_answers(&mut self, out: &mut Output) {
        if !matches!(self.response, ResponseState::Head) || !self.response_head.is_empty() {
            return;
        }
        while let Some(InFlight { reply: Reply::Local(_), .. }) = self.in_flight.front() {
            if let Some(InFlight { reply: Reply::Local(bytes), .. }) = self.in_flight.pop_front() {
                out.owned(bytes);
            }
        }
    }

    /// Feeds bytes from the broker; `out` receives what to send to the client now.
    pub fn feed_responses(&mut self, input: &[u8], view: RouteView<'_>, out: &mut Output) -> Result<(), ProtocolError> {
        self.responses_out.drain_ready(out);
        let start = out.pieces.len();
        self.local_answers(out);
        let mut pos = 0;
        while pos < input.len() {
            match &mut self.response {
                ResponseState::Pass { remaining, observe, .. } => {
                    let n = (*remaining).min(input.len() - pos);
                    out.pass(pos..pos + n);
                    if let Some(frame) = observe {
                        copy_observed(frame, &input[pos..pos + n]);
                    }
                    pos += n;
                    *remaining -= n;
                    if *remaining == 0 {
                        let ResponseState::Pass { api_key, api_version, observe, .. } =
                            std::mem::replace(&mut self.response, ResponseState::Head)
                        else {
                            unreachable!()
                        };
                        if let Some(frame) = observe {
                            self.identity.observe_response(api_key, api_version, &frame);
                        }
                        self.response_done(out);
                    }
                }
                ResponseState::Hold { remaining, frame, .. } => {
                    let n = (*remaining).min(input.len() - pos);
                    frame.extend_from_slice(&input[pos..pos + n]);
                    pos += n;
                    *remaining -= n;
                    if *remaining == 0 {
                        let ResponseState::Hold { api_key, api_version, plan, handoff, frame, .. } =
                            std::mem::replace(&mut self.response, ResponseState::Head)
                        else {
                            unreachable!()
                        };
                        self.held_response(api_key, api_version, plan, handoff, frame, view, out)?;
                    }
                }
                ResponseState::Head => {
                    let Some(head) = self.response_head(input, &mut pos)? else {
                        break;
                    };
                    self.on_response_head(head, input, &mut pos, out, view)?;
                }
            }
        }
        self.responses_out.route(input, out, start);
        Ok(())
    }

    fn response_head(&mut self, input: &[u8], pos: &mut usize) -> Result<Option<ResponseHead>, ProtocolError> {
        let max = self.limits.max_frame_size;
        if self.response_head.is_empty() {
            if let Parsed::Head(head) = parse_response_head(&input[*pos..], max)? {
                return Ok(Some(head));
            }
        }
        let take = (RESPONSE_HEAD - self.response_head.len()).min(input.len() - *pos);
        self.response_head.extend_from_slice(&input[*pos..*pos + take]);
        *pos += take;
        match parse_response_head(&self.response_head, max)? {
            Parsed::Head(head) => Ok(Some(head)),
            Parsed::NeedAtLeast(_) => Ok(None),
        }
    }

    fn on_response_head(
        &mut self,
        head: ResponseHead,
        input: &[u8],
        pos: &mut usize,
        out: &mut Output,
        view: RouteView<'_>,
    ) -> Result<(), ProtocolError> {
        let entry = match self.in_flight.pop_front() {
            Some(entry @ InFlight { reply: Reply::Broker { .. }, .. }) if entry.correlation_id == head.correlation_id => entry,
            other => {
                return Err(ProtocolError::UnexpectedResponse {
                    correlation_id: head.correlation_id,
                    expected: other.map(|e| e.correlation_id),
                })
            }
        };
        let Reply::Broker { plan, handoff } = entry.reply else { unreachable!() };
        let (api_key, api_version) = (entry.api_key, entry.api_version);
        let frame_len = head.frame_len();
        self.stats.api(api_key, ApiCounter::ResponseBytes, frame_len as u64);
        let head_bytes = if self.response_head.is_empty() {
            let start = *pos;
            *pos += RESPONSE_HEAD;
            HeadBytes::Input(start, *pos)
        } else {
            HeadBytes::Kept(std::mem::take(&mut self.response_head))
        };
        let remaining = frame_len - RESPONSE_HEAD;
        if plan == Plan::Pass && handoff.is_none() {
            let observe = identity::observes(api_key).then(|| head_bytes.to_vec(input, frame_len.min(INITIAL_HOLD_CAPACITY)));
            head_bytes.emit(out);
            self.response = ResponseState::Pass { remaining, api_key, api_version, observe };
            if remaining == 0 {
                if let ResponseState::Pass { observe: Some(frame), .. } =
                    std::mem::replace(&mut self.response, ResponseState::Head)
                {
                    self.identity.observe_response(api_key, api_version, &frame);
                }
                self.response_done(out);
            }
            return Ok(());
        }
        let frame = head_bytes.to_vec(input, frame_len.min(INITIAL_HOLD_CAPACITY));
        if remaining == 0 {
            self.held_response(api_key, api_version, plan, handoff, frame, view, out)
        } else {
            self.response = ResponseState::Hold { remaining, api_key, api_version, plan, handoff, frame };
            Ok(())
        }
    }

    /// A complete held response: examined, then sent on or handed off.
    #[allow(clippy::too_many_arguments)]
    fn held_response(&mut self, api_key: i16, api_version: i16, plan: Plan, handoff: Option<ResponseHandOff>, frame: Vec<u8>,
                     view: RouteView<'_>, out: &mut Output) -> Result<(), ProtocolError> {
        if identity::observes(api_key) {
            self.identity.observe_response(api_key, api_version, &frame);
        }
        let mut sent = if plan == Plan::Pass { frame } else { self.examine(api_key, api_version, plan, frame, view)? };
        if let Some(h) = handoff.as_ref().filter(|_| topics::judged_by_answer(api_key)) {
            if h.selector.as_ref().is_some_and(|s| vouch::answer_unselected(api_key, &sent, api_version, s)) {
                self.stats.add(Counter::HandoffAnswerNotSelected, 1);
                out.owned(sent);
                self.response_done(out);
                return Ok(());
            }
            match self.vouched_response(sent, api_version, h.vouching.as_deref()) {
                Ok(bytes) => {
                    self.stats.add(Counter::HandoffVouched, 1);
                    out.owned(bytes);
                    self.response_done(out);
                    return Ok(());
                }
                Err(frame) => sent = frame,
            }
        }
        match handoff {
            None => out.owned(sent),
            Some(ResponseHandOff { fail_open, vouching, replay: Some(request), .. }) => {
                // The service has not seen the request: it goes first, then (if its reply
                // asks for it) this answer, which keeps its place meanwhile.
                let response_id = self.next_handoff;
                let request_id = response_id + 1;
                self.next_handoff += 2;
                self.stats.add(Counter::HandoffRequests, 1);
                self.hand_off(request_id, Direction::Request, request, api_key, api_version, true, fail_open, vouching);
                if let Some(p) = self.pending.back_mut() {
                    p.then_response = Some(Replayed { id: response_id, frame: Bytes::from(sent) });
                }
                out.pieces.push(Piece::HandOff(response_id));
            }
            Some(h) => {
                let id = self.next_handoff;
                self.next_handoff += 1;
                self.stats.add(Counter::HandoffResponses, 1);
                self.hand_off(id, Direction::Response, Bytes::from(sent), api_key, api_version, true, h.fail_open, h.vouching);
                out.pieces.push(Piece::HandOff(id));
            }
        }
        self.response_done(out);
        Ok(())
    }

    /// A Fetch answer the service asked for, read for ids it vouched for: Ok with the
    /// bytes to send (the answer, or the answer cut short), else Err with it back.
    fn vouched_response(&mut self, frame: Vec<u8>, api_version: i16, vouching: Option<&Vouching>) -> Result<Vec<u8>, Vec<u8>> {
        let Some(v) = vouching.filter(|v| self.vouched_responses.applies_to(v)) else { return Err(frame) };
        match vouch::fetch_verdict(&frame, api_version, v, &self.vouched_responses, Instant::now()) {
            FetchVerdict::Pass => Ok(frame),
            FetchVerdict::Cut(shorter) => {
                self.stats.add(Counter::HandoffVouchedCut, 1);
                Ok(shorter)
            }
            FetchVerdict::HandOff => Err(frame),
        }
    }

    /// A complete held response: the bytes to send in its place.
    fn examine(&mut self, api_key: i16, api_version: i16, plan: Plan, frame: Vec<u8>, view: RouteView<'_>) -> Result<Vec<u8>, ProtocolError> {
        self.stats.add(Counter::ResponsesExamined, 1);
        if plan == Plan::Skim {
            let has_endpoints = skim::fetch_has_node_endpoints(&frame)
                .map_err(|_| ProtocolError::Malformed("Fetch response"))?;
            if !has_endpoints {
                self.stats.add(Counter::ResponsesUntouched, 1);
                return Ok(frame);
            }
        }
        let mut report = RewriteReport::default();
        let rewritten = rewrite::rewrite(api_key, api_version, &frame, view, &mut report)?;
        self.stats.add(Counter::AddressesRewritten, u64::from(report.addresses));
        self.stats.add(Counter::UnknownBrokers, u64::from(report.unknown_brokers));
        self.stats.add(Counter::EndpointsRedacted, u64::from(report.redacted));
        match rewritten {
            Some(bytes) => Ok(bytes),
            None => {
                self.stats.add(Counter::ResponsesUntouched, 1);
                Ok(frame)
            }
        }
    }

    fn response_done(&mut self, out: &mut Output) {
        self.response = ResponseState::Head;
        self.local_answers(out);
    }
}

/// Kafka's UNSUPPORTED_VERSION.
const UNSUPPORTED_VERSION: i16 = 35;

/// The gateway's answer to a SaslHandshake v0: UNSUPPORTED_VERSION, no mechanisms.
/// After a v0 handshake the client sends raw SASL tokens, then (logged in) requests
/// again, with nothing in the stream to tell one from the other: a connection the module
/// cannot read is one no rule applies to (the module passed the rest of such a
/// connection untouched, and a client bypassed every rule by sending a v0 handshake
/// first, even on a PLAINTEXT listener, where the broker refuses it and serves on).
/// Clients since Kafka 1.0 use v1 and SaslAuthenticate; Kafka 4 serves clients from 2.1.
fn raw_sasl_refused(correlation_id: i32) -> Vec<u8> {
    let mut frame = Vec::with_capacity(14);
    frame.extend_from_slice(&10i32.to_be_bytes()); // header and body below
    frame.extend_from_slice(&correlation_id.to_be_bytes());
    frame.extend_from_slice(&UNSUPPORTED_VERSION.to_be_bytes());
    frame.extend_from_slice(&0i32.to_be_bytes()); // Mechanisms: none
    frame
}

/// The correlation id of a frame (at `at`: 8 in a request, 4 in a response), if it
/// is long enough to have one.
fn correlation_id(frame: &[u8], at: usize) -> Option<i32> {
    frame.get(at..at + 4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Copies what passes of a SASL frame, up to [`OBSERVE_LIMIT`].
fn copy_observed(frame: &mut Vec<u8>, bytes: &[u8]) {
    let room = OBSERVE_LIMIT.saturating_sub(frame.len());
    frame.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

fn api_name(api_key: i16) -> String {
    kafka_protocol::messages::ApiKey::try_from(api_key)
        .map_or_else(|_| format!("API {api_key}"), |key| format!("{key:?}"))
}
