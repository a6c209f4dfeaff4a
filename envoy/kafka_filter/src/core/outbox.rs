//! What waits behind a frame handed off to the Python service, per direction.
//!
//! A handed-off frame keeps its place: nothing after it may leave before its answer
//! does (requests must not overtake it to the broker, responses must reach the client in
//! request order). While one is pending, everything that follows it in that direction
//! is queued here, copied (Envoy's buffers are Envoy's once a hook returns); the
//! answer takes the frame's place and the queue drains up to the next pending frame.

use std::collections::VecDeque;

use super::{Output, Piece};

#[derive(Debug)]
enum Item {
    Bytes(Vec<u8>),
    Pending(u64),
}

#[derive(Debug, Default)]
pub struct Outbox {
    items: VecDeque<Item>,
    bytes: usize,
}

impl Outbox {
    /// True when nothing waits (output may leave at once).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes queued (the frames still pending are not counted here).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn push_bytes(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.bytes += bytes.len();
        if let Some(Item::Bytes(last)) = self.items.back_mut() {
            last.extend_from_slice(bytes);
        } else {
            self.items.push_back(Item::Bytes(bytes.to_vec()));
        }
    }

    fn push_owned(&mut self, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        if let Some(Item::Bytes(last)) = self.items.back_mut() {
            self.bytes += bytes.len();
            last.extend_from_slice(&bytes);
        } else {
            self.bytes += bytes.len();
            self.items.push_back(Item::Bytes(bytes));
        }
    }

    /// Moves the pieces of `out` from `start` on that cannot leave yet into the queue:
    /// all of them when something already waits, else those from the first hand-off on.
    /// Input ranges are copied out of `input`.
    pub fn route(&mut self, input: &[u8], out: &mut Output, start: usize) {
        let from = if self.is_empty() {
            match out.pieces[start..].iter().position(|p| matches!(p, Piece::HandOff(_))) {
                Some(offset) => start + offset,
                None => return,
            }
        } else {
            start
        };
        for piece in out.pieces.drain(from..) {
            match piece {
                Piece::Input(range) => self.push_bytes(&input[range]),
                Piece::Owned(bytes) => self.push_owned(bytes),
                Piece::HandOff(id) => self.items.push_back(Item::Pending(id)),
            }
        }
    }

    /// The answer to hand-off `id` takes its place; false when `id` is not pending here.
    pub fn fill(&mut self, id: u64, bytes: Vec<u8>) -> bool {
        let Some(item) = self.items.iter_mut().find(|i| matches!(i, Item::Pending(p) if *p == id)) else {
            return false;
        };
        self.bytes += bytes.len();
        *item = Item::Bytes(bytes);
        true
    }

    /// Whether hand-off `id` waits in this queue.
    pub fn holds(&self, id: u64) -> bool {
        self.items.iter().any(|i| matches!(i, Item::Pending(p) if *p == id))
    }

    /// Appends what may leave now (up to the first pending frame) to `out`.
    pub fn drain_ready(&mut self, out: &mut Output) {
        while let Some(Item::Bytes(_)) = self.items.front() {
            if let Some(Item::Bytes(bytes)) = self.items.pop_front() {
                self.bytes -= bytes.len();
                out.owned(bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(out: &Output) -> Vec<u8> {
        let mut v = Vec::new();
        out.write_to(&[], &mut v);
        v
    }

    #[test]
    fn everything_after_a_pending_frame_waits_for_its_answer() {
        let input = b"abcdef";
        let mut out = Output::default();
        out.pass(0..2);
        out.pieces.push(Piece::HandOff(1));
        out.pass(4..6);
        let mut outbox = Outbox::default();
        outbox.route(input, &mut out, 0);
        assert_eq!(out.pieces, vec![Piece::Input(0..2)], "what precedes the hand-off leaves now");
        assert_eq!(outbox.bytes(), 2);
        let mut later = Output::default();
        later.owned(b"gh".to_vec());
        outbox.route(b"", &mut later, 0);
        assert!(later.is_empty(), "a queue that waits takes everything");
        let mut ready = Output::default();
        outbox.drain_ready(&mut ready);
        assert!(ready.is_empty());
        assert!(outbox.fill(1, b"XY".to_vec()));
        outbox.drain_ready(&mut ready);
        assert_eq!(bytes(&ready), b"XYefgh");
        assert!(outbox.is_empty());
        assert_eq!(outbox.bytes(), 0);
        assert!(!outbox.fill(1, vec![]), "an answer is taken once");
    }
}
