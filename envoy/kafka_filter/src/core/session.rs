//! One Kafka connection, both directions.
//!
//! Contract (what the FFI layer, and later phases, rely on):
//! - Ordering: a slot is reserved in the in-flight queue when a request's head has been
//!   read, before any of its bytes pass; responses leave in the order of those slots,
//!   whether the broker answers, the gateway answers ([`Disposition::Answer`]) or a
//!   response is held to be examined. A broker response whose correlation id is not the
//!   oldest forwarded request's is a protocol violation.
//! - Pass-through: a frame nobody needs is forwarded as ranges of the input as it arrives
//!   (its head first, so a decision is always made before the first byte leaves).
//! - Bounds: every frame's size is checked against `max_frame_size` when its size prefix
//!   arrives; the core holds at most one partial head and one held frame per direction
//!   plus the gateway's own pending answers ([`Session::held_bytes`]).
//! - Errors: any malformed input is a [`ProtocolError`]; the caller closes the
//!   connection. The core never panics on input (property-tested).
//!
//! Phase 2 hooks: [`RequestPolicy::decide`] is where native request rules answer; a
//! `Hold` disposition (hand a frame to the Python service, resume later) fits the same
//! queue: its slot is reserved at the head and later requests queue behind it.

use std::collections::VecDeque;

use super::head::{parse_request_head, parse_response_head, Parsed, RequestHead, ResponseHead, RESPONSE_HEAD};
use super::rewrite::{self, Plan, RewriteReport, RouteView};
use super::skim;
use super::stats::{ApiCounter, Counter, Stats};
use super::{Output, ProtocolError};

const SASL_HANDSHAKE: i16 = 17;
/// Held frames grow as their bytes arrive, from this much.
const INITIAL_HOLD_CAPACITY: usize = 64 * 1024;

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
}

pub trait RequestPolicy {
    fn decide(&mut self, head: &RequestHead) -> Disposition;
}

/// Phase 1's policy: every request goes to the broker.
#[derive(Debug, Default, Clone, Copy)]
pub struct ForwardAll;

impl RequestPolicy for ForwardAll {
    fn decide(&mut self, _: &RequestHead) -> Disposition {
        Disposition::Forward
    }
}

impl RequestPolicy for Box<dyn RequestPolicy + Send> {
    fn decide(&mut self, head: &RequestHead) -> Disposition {
        (**self).decide(head)
    }
}

#[derive(Debug)]
enum Reply {
    Broker(Plan),
    Local(Vec<u8>),
}

#[derive(Debug)]
struct InFlight {
    correlation_id: i32,
    api_key: i16,
    api_version: i16,
    reply: Reply,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestState {
    Head,
    Pass(usize),
    Drop(usize),
    Opaque,
}

#[derive(Debug)]
enum ResponseState {
    Head,
    Pass { remaining: usize, api_key: i16, api_version: i16 },
    Hold { remaining: usize, api_key: i16, api_version: i16, plan: Plan, frame: Vec<u8> },
    Opaque,
}

pub struct Session<P: RequestPolicy = ForwardAll> {
    limits: SessionLimits,
    policy: P,
    in_flight: VecDeque<InFlight>,
    request: RequestState,
    request_head: Vec<u8>,
    /// A SaslHandshake v0 passed: raw SASL tokens follow that request.
    requests_turn_opaque: bool,
    response: ResponseState,
    response_head: Vec<u8>,
    pub stats: Stats,
}

impl Session<ForwardAll> {
    pub fn new(limits: SessionLimits) -> Self {
        Session::with_policy(limits, ForwardAll)
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
            requests_turn_opaque: false,
            response: ResponseState::Head,
            response_head: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// Bytes the core holds for this connection.
    pub fn held_bytes(&self) -> usize {
        let held = match &self.response {
            ResponseState::Hold { frame, .. } => frame.len(),
            _ => 0,
        };
        let local: usize = self.in_flight.iter().map(|e| match &e.reply {
            Reply::Local(bytes) => bytes.len(),
            Reply::Broker(_) => 0,
        }).sum();
        self.request_head.len() + self.response_head.len() + held + local
    }

    /// Requests whose responses have not left yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    // -- client -> broker -------------------------------------------------------------

    /// Feeds bytes from the client; `out` receives what to forward to the broker.
    pub fn feed_requests(&mut self, input: &[u8], out: &mut Output) -> Result<(), ProtocolError> {
        let mut pos = 0;
        while pos < input.len() {
            match self.request {
                RequestState::Opaque => {
                    out.pass(pos..input.len());
                    pos = input.len();
                }
                RequestState::Pass(remaining) => {
                    let n = remaining.min(input.len() - pos);
                    out.pass(pos..pos + n);
                    pos += n;
                    self.request_continues(remaining - n, false);
                }
                RequestState::Drop(remaining) => {
                    let n = remaining.min(input.len() - pos);
                    pos += n;
                    self.request_continues(remaining - n, true);
                }
                RequestState::Head => {
                    let Some(head) = self.request_head(input, &mut pos)? else {
                        return Ok(());
                    };
                    self.on_request_head(head, &mut pos, out);
                }
            }
        }
        Ok(())
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

    fn on_request_head(&mut self, head: RequestHead, pos: &mut usize, out: &mut Output) {
        let frame_len = head.frame_len();
        self.stats.api(head.api_key, ApiCounter::Requests, 1);
        self.stats.api(head.api_key, ApiCounter::RequestBytes, frame_len as u64);
        let disposition = self.policy.decide(&head);
        let drop = matches!(disposition, Disposition::Answer(_));
        match disposition {
            Disposition::Forward => {
                if head.expects_response() {
                    let (plan, unreadable) = rewrite::plan(head.api_key, head.api_version);
                    if unreadable {
                        self.stats.add(Counter::UnreadableVersions, 1);
                    }
                    self.in_flight.push_back(InFlight {
                        correlation_id: head.correlation_id,
                        api_key: head.api_key,
                        api_version: head.api_version,
                        reply: Reply::Broker(plan),
                    });
                }
                if head.api_key == SASL_HANDSHAKE && head.api_version == 0 {
                    self.requests_turn_opaque = true;
                }
            }
            Disposition::Answer(response) => {
                self.stats.add(Counter::LocalAnswers, 1);
                if head.expects_response() {
                    self.in_flight.push_back(InFlight {
                        correlation_id: head.correlation_id,
                        api_key: head.api_key,
                        api_version: head.api_version,
                        reply: Reply::Local(response),
                    });
                }
            }
        }
        let consumed = if self.request_head.is_empty() {
            let start = *pos;
            *pos += head.head_len;
            if !drop {
                out.pass(start..*pos);
            }
            head.head_len
        } else {
            let buffered = std::mem::take(&mut self.request_head);
            let n = buffered.len();
            if !drop {
                out.owned(buffered);
            }
            n
        };
        self.request_continues(frame_len - consumed, drop);
    }

    fn request_continues(&mut self, remaining: usize, drop: bool) {
        self.request = if remaining > 0 {
            if drop { RequestState::Drop(remaining) } else { RequestState::Pass(remaining) }
        } else if self.requests_turn_opaque {
            RequestState::Opaque
        } else {
            RequestState::Head
        };
    }

    // -- broker -> client -------------------------------------------------------------

    /// The gateway's own answers that may leave now (the response stream is between
    /// frames and they are the oldest outstanding): call after feeding requests.
    pub fn ready_responses(&mut self, out: &mut Output) {
        if !matches!(self.response, ResponseState::Head) || !self.response_head.is_empty() {
            return;
        }
        while let Some(InFlight { reply: Reply::Local(_), .. }) = self.in_flight.front() {
            if let Some(InFlight { reply: Reply::Local(bytes), .. }) = self.in_flight.pop_front() {
                out.owned(bytes);
            }
        }
    }

    /// Feeds bytes from the broker; `out` receives what to send to the client.
    pub fn feed_responses(&mut self, input: &[u8], view: RouteView<'_>, out: &mut Output) -> Result<(), ProtocolError> {
        self.ready_responses(out);
        let mut pos = 0;
        while pos < input.len() {
            match &mut self.response {
                ResponseState::Opaque => {
                    out.pass(pos..input.len());
                    pos = input.len();
                }
                ResponseState::Pass { remaining, api_key, api_version } => {
                    let n = (*remaining).min(input.len() - pos);
                    out.pass(pos..pos + n);
                    pos += n;
                    *remaining -= n;
                    if *remaining == 0 {
                        let (key, version) = (*api_key, *api_version);
                        self.response_done(key, version, out);
                    }
                }
                ResponseState::Hold { remaining, frame, .. } => {
                    let n = (*remaining).min(input.len() - pos);
                    frame.extend_from_slice(&input[pos..pos + n]);
                    pos += n;
                    *remaining -= n;
                    if *remaining == 0 {
                        let ResponseState::Hold { api_key, api_version, plan, frame, .. } =
                            std::mem::replace(&mut self.response, ResponseState::Head)
                        else {
                            unreachable!()
                        };
                        let sent = self.examine(api_key, api_version, plan, frame, view)?;
                        out.owned(sent);
                        self.response_done(api_key, api_version, out);
                    }
                }
                ResponseState::Head => {
                    let Some(head) = self.response_head(input, &mut pos)? else {
                        return Ok(());
                    };
                    self.on_response_head(head, input, &mut pos, out, view)?;
                }
            }
        }
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
            Some(entry @ InFlight { reply: Reply::Broker(_), .. }) if entry.correlation_id == head.correlation_id => entry,
            other => {
                return Err(ProtocolError::UnexpectedResponse {
                    correlation_id: head.correlation_id,
                    expected: other.map(|e| e.correlation_id),
                })
            }
        };
        let Reply::Broker(plan) = entry.reply else { unreachable!() };
        let frame_len = head.frame_len();
        self.stats.api(entry.api_key, ApiCounter::ResponseBytes, frame_len as u64);
        let head_bytes = if self.response_head.is_empty() {
            let start = *pos;
            *pos += RESPONSE_HEAD;
            HeadBytes::Input(start)
        } else {
            HeadBytes::Kept(std::mem::take(&mut self.response_head))
        };
        let remaining = frame_len - RESPONSE_HEAD;
        if plan == Plan::Pass {
            match head_bytes {
                HeadBytes::Input(start) => out.pass(start..start + RESPONSE_HEAD),
                HeadBytes::Kept(bytes) => out.owned(bytes),
            }
            if remaining == 0 {
                self.response_done(entry.api_key, entry.api_version, out);
            } else {
                self.response = ResponseState::Pass { remaining, api_key: entry.api_key, api_version: entry.api_version };
            }
            return Ok(());
        }
        let mut frame = Vec::with_capacity(frame_len.min(INITIAL_HOLD_CAPACITY));
        match head_bytes {
            HeadBytes::Input(start) => frame.extend_from_slice(&input[start..start + RESPONSE_HEAD]),
            HeadBytes::Kept(bytes) => frame.extend_from_slice(&bytes),
        }
        if remaining == 0 {
            let sent = self.examine(entry.api_key, entry.api_version, plan, frame, view)?;
            out.owned(sent);
            self.response_done(entry.api_key, entry.api_version, out);
        } else {
            self.response = ResponseState::Hold {
                remaining,
                api_key: entry.api_key,
                api_version: entry.api_version,
                plan,
                frame,
            };
        }
        Ok(())
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

    fn response_done(&mut self, api_key: i16, api_version: i16, out: &mut Output) {
        self.response = ResponseState::Head;
        if api_key == SASL_HANDSHAKE && api_version == 0 {
            self.response = ResponseState::Opaque;
            self.stats.add(Counter::OpaqueConnections, 1);
            return;
        }
        self.ready_responses(out);
    }
}

enum HeadBytes {
    Input(usize),
    Kept(Vec<u8>),
}
