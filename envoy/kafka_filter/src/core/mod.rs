//! The protocol core: no Envoy types, no I/O. Bytes in, decisions and bytes out (h11's
//! shape): [`Session::feed_requests`] and [`Session::feed_responses`] take what arrived
//! in one direction and say, as [`Output`], what to send on: ranges of the input (pass
//! through, never copied by the core) and bytes of its own (rewritten or held frames,
//! answers it gives itself).

pub mod handoff;
pub mod head;
pub mod identity;
pub mod inflate;
pub mod tls_principal;
pub mod interest;
pub mod meter;
pub mod outbox;
pub mod payload;
pub mod rewrite;
pub mod safeguard;
pub mod session;
pub mod skim;
pub mod stats;
pub mod topics;
pub mod vouch;
pub mod who;
pub mod wire;

use std::fmt;
use std::ops::Range;

pub use handoff::{Direction, HandOff, Resolution};
pub use session::{Disposition, ForwardAll, RequestPolicy, Session, SessionLimits};
pub use who::{Peer, Requester};

/// The peer broke the protocol (or the gateway cannot serve it): close the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    BadFrameSize(i64),
    FrameTooLarge { size: usize, max: usize },
    Malformed(&'static str),
    UnexpectedResponse { correlation_id: i32, expected: Option<i32> },
    NoRoute(i32),
    /// The Python service's answer cannot be applied (or it asked to close).
    HandOff(String),
    /// The client is refused, as a broker would refuse it (a client certificate no
    /// principal mapping rule applies to).
    Refused(String),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::BadFrameSize(size) => write!(f, "invalid frame size {size}"),
            ProtocolError::FrameTooLarge { size, max } => {
                write!(f, "frame of {size} bytes exceeds the limit of {max}")
            }
            ProtocolError::Malformed(what) => write!(f, "malformed frame: {what}"),
            ProtocolError::UnexpectedResponse { correlation_id, expected: Some(e) } => {
                write!(f, "response {correlation_id} where {e} was expected")
            }
            ProtocolError::UnexpectedResponse { correlation_id, expected: None } => {
                write!(f, "response {correlation_id} without a request")
            }
            ProtocolError::NoRoute(node) => write!(f, "no gateway route for broker {node}"),
            ProtocolError::HandOff(why) => write!(f, "hand-off: {why}"),
            ProtocolError::Refused(why) => write!(f, "client refused: {why}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// A piece of output: a range of the input just fed, or bytes the core owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Input(Range<usize>),
    Owned(Vec<u8>),
    /// The place of a frame handed off (internal: never in an output a caller gets,
    /// see [`outbox::Outbox::route`]).
    HandOff(u64),
}

/// What to send on, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Output {
    pub pieces: Vec<Piece>,
}

impl Output {
    pub fn clear(&mut self) {
        self.pieces.clear();
    }

    pub fn pass(&mut self, range: Range<usize>) {
        if range.is_empty() {
            return;
        }
        if let Some(Piece::Input(last)) = self.pieces.last_mut() {
            if last.end == range.start {
                last.end = range.end;
                return;
            }
        }
        self.pieces.push(Piece::Input(range));
    }

    pub fn owned(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.pieces.push(Piece::Owned(bytes));
        }
    }

    /// True when the output is exactly the whole input (the zero-copy case).
    pub fn is_whole(&self, input_len: usize) -> bool {
        match self.pieces.as_slice() {
            [] => input_len == 0,
            [Piece::Input(r)] => r.start == 0 && r.end == input_len,
            _ => false,
        }
    }

    pub fn len(&self) -> usize {
        self.pieces.iter().map(|p| match p {
            Piece::Input(r) => r.len(),
            Piece::Owned(b) => b.len(),
            Piece::HandOff(_) => 0,
        }).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the output's bytes to `dst`.
    pub fn write_to(&self, input: &[u8], dst: &mut Vec<u8>) {
        for piece in &self.pieces {
            match piece {
                Piece::Input(r) => dst.extend_from_slice(&input[r.clone()]),
                Piece::Owned(b) => dst.extend_from_slice(b),
                Piece::HandOff(_) => {}
            }
        }
    }
}
