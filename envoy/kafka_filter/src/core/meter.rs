//! Labelled traffic counts, the series the ext_proc data path exports too
//! (`keg_requests_total{api,version,client_id,principal}`,
//! `keg_topic_requests_total` and `keg_topic_record_bytes_total{api,topic,client_id,principal}`,
//! see ext_proc/metrics.py), kept per connection without I/O.
//!
//! Envoy's network-filter ABI (1.40) defines its counters when a configuration loads and
//! has no labelled ones, so these cannot be Envoy stats: a connection's [`Meter`]
//! accumulates deltas, the FFI layer drains them after each callback into the module's
//! process-wide exporter (`crate::metrics`), which bounds each label's cardinality and
//! serves Prometheus' text format.
//!
//! Costs, only when the configuration asks for these metrics: a request's client id is
//! compared with the connection's previous one (read from the bytes the head arrived
//! in); a Produce request's topics are read as its bytes stream past by
//! [`ProduceSkim`], which skips record batches by their length: it never holds or
//! copies a frame, only the few bytes of a structure cut between two reads.

use std::sync::Arc;

use super::head::PRODUCE;
use super::who::ClientId;
use super::wire::{Read, Reader, Short};

/// The longest structure (a topic's name, a header's tagged fields) the skim keeps
/// across reads; a Produce request with a longer one is not counted per topic.
pub const MAX_CARRY: usize = 64 << 10;

/// A topic as a Produce request names it: by name, or by id from v13 on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TopicKey {
    Name(Box<str>),
    Id([u8; 16]),
}

/// Where the counts of a connection go (the exporter; a test's recorder).
pub trait MeterSink {
    fn requests(&mut self, api_key: i16, api_version: i16, client_id: &str, principal: &str, count: u64);
    fn topic(&mut self, topic: &TopicKey, client_id: &str, principal: &str, requests: u64, record_bytes: u64);
}

/// The label pair requests are counted under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Who {
    client_id: Arc<str>,
    principal: Arc<str>,
}

impl Who {
    fn same(&self, other: &Who) -> bool {
        (Arc::ptr_eq(&self.client_id, &other.client_id) || self.client_id == other.client_id)
            && (Arc::ptr_eq(&self.principal, &other.principal) || self.principal == other.principal)
    }
}

/// Topics of one batch: (topic, requests, record bytes). Few per connection, so a
/// vector searched by bytes beats hashing, and a name is allocated once per drain.
type TopicCounts = Vec<(TopicKey, u64, u64)>;

/// Counts under one label pair, in the order they came.
#[derive(Debug)]
struct Batch {
    who: Who,
    /// ((api key, version), requests): a handful of distinct pairs per connection.
    requests: Vec<((i16, i16), u64)>,
    topics: TopicCounts,
}

impl Batch {
    fn new(who: Who) -> Self {
        Batch { who, requests: Vec::new(), topics: Vec::new() }
    }

    fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.topics.is_empty()
    }
}

/// One connection's counts since the last drain.
#[derive(Debug)]
pub struct Meter {
    topics_enabled: bool,
    who: Who,
    /// The identity epoch `who.principal` was read at.
    identity_epoch: Option<u64>,
    /// The current label pair's counts (kept across drains: its vectors are reused).
    current: Batch,
    /// Batches of earlier label pairs not drained yet (a client id changed mid-read).
    earlier: Vec<Batch>,
    skim: Option<ProduceSkim>,
}

impl Meter {
    /// `topics`: read Produce requests for the topic series.
    pub fn new(topics: bool) -> Self {
        let who = Who { client_id: Arc::from(""), principal: Arc::from("User:ANONYMOUS") };
        Meter {
            topics_enabled: topics,
            current: Batch::new(who.clone()),
            who,
            identity_epoch: None,
            earlier: Vec::new(),
            skim: None,
        }
    }

    /// The principal as of identity `epoch` (read only when the epoch moved).
    pub fn principal(&mut self, epoch: u64, principal: impl FnOnce() -> String) {
        if self.identity_epoch != Some(epoch) {
            self.identity_epoch = Some(epoch);
            let principal = principal();
            if *self.who.principal != *principal {
                self.who.principal = Arc::from(principal);
            }
        }
    }

    /// A request with this client id (as its head read it: a null one is "", an unread
    /// one leaves the connection's previous one standing) and `body_len` bytes after its
    /// head. The body's bytes come to [`Meter::body`].
    pub fn request(&mut self, api_key: i16, api_version: i16, client_id: ClientId<'_>, body_len: usize) {
        let client_id = match client_id {
            ClientId::Null => Some(&b""[..]),
            ClientId::Bytes(bytes) => Some(bytes),
            ClientId::Unknown => None,
        };
        if let Some(client_id) = client_id {
            if client_id != self.who.client_id.as_bytes() {
                self.who.client_id = Arc::from(String::from_utf8_lossy(client_id));
            }
        }
        if !self.current.who.same(&self.who) {
            let next = Batch::new(self.who.clone());
            let done = std::mem::replace(&mut self.current, next);
            if !done.is_empty() {
                self.earlier.push(done);
            }
        }
        let key = (api_key, api_version);
        match self.current.requests.iter_mut().find(|(k, _)| *k == key) {
            Some((_, count)) => *count += 1,
            None => self.current.requests.push((key, 1)),
        }
        self.skim = (api_key == PRODUCE && self.topics_enabled && body_len > 0)
            .then(|| ProduceSkim::new(api_version, body_len));
    }

    /// More bytes of the current request's body (after what [`Meter::request`] saw).
    pub fn body(&mut self, bytes: &[u8]) {
        if let Some(skim) = &mut self.skim {
            skim.feed(bytes, &mut self.current.topics);
            if skim.finished() {
                self.skim = None;
            }
        }
    }

    /// Hands the counts to `sink` and forgets them.
    pub fn drain(&mut self, sink: &mut impl MeterSink) {
        for batch in self.earlier.drain(..) {
            drain_batch(&batch, sink);
        }
        drain_batch(&self.current, sink);
        self.current.requests.clear();
        // A Produce still streaming keeps its topic's entry (emptied): the record bytes
        // of its next partitions count there, after the drain between two reads.
        let streaming = self.skim.as_ref().and_then(|s| s.topic).and_then(|i| self.current.topics.get(i).cloned());
        self.current.topics.clear();
        if let (Some((topic, _, _)), Some(skim)) = (streaming, self.skim.as_mut()) {
            self.current.topics.push((topic, 0, 0));
            skim.topic = Some(0);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty() && self.earlier.is_empty()
    }
}

fn drain_batch(batch: &Batch, sink: &mut impl MeterSink) {
    for &((api_key, api_version), count) in &batch.requests {
        sink.requests(api_key, api_version, &batch.who.client_id, &batch.who.principal, count);
    }
    for (topic, requests, bytes) in &batch.topics {
        sink.topic(topic, &batch.who.client_id, &batch.who.principal, *requests, *bytes);
    }
}

/// Where a Produce request's body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// timeout_ms and the topic count.
    Start,
    Topic { topics_left: usize },
    Partition { topics_left: usize, partitions_left: usize },
    PartitionTags { topics_left: usize, partitions_left: usize },
    TopicTags { topics_left: usize },
    Tail,
    Done,
    /// A structure longer than [`MAX_CARRY`], or nonsense: the rest is not counted.
    GaveUp,
}

/// Reads a Produce request's topics and record bytes from its body (after `acks`, where
/// the head ends) as it streams past, in any cut.
#[derive(Debug)]
pub struct ProduceSkim {
    flexible: bool,
    topic_ids: bool,
    step: Step,
    /// Body bytes not yet seen.
    left: usize,
    /// Record bytes to skip before the next structure.
    skip: usize,
    /// The start of a structure cut by the end of a read.
    carry: Vec<u8>,
    /// The current topic's entry in the batch's counts.
    topic: Option<usize>,
}

impl ProduceSkim {
    /// A Produce request of `version` whose body (after acks) is `body_len` bytes.
    pub fn new(version: i16, body_len: usize) -> Self {
        ProduceSkim {
            flexible: version >= 9,
            topic_ids: version >= 13,
            step: Step::Start,
            left: body_len,
            skip: 0,
            carry: Vec::new(),
            topic: None,
        }
    }

    pub fn finished(&self) -> bool {
        self.left == 0 || matches!(self.step, Step::Done | Step::GaveUp)
    }

    fn feed(&mut self, bytes: &[u8], topics: &mut TopicCounts) {
        let mut input = &bytes[..bytes.len().min(self.left)];
        self.left -= input.len();
        while !input.is_empty() && !matches!(self.step, Step::Done | Step::GaveUp) {
            if self.skip > 0 {
                let n = self.skip.min(input.len());
                self.skip -= n;
                input = &input[n..];
                continue;
            }
            if self.carry.is_empty() {
                match self.step_over(input, topics) {
                    Ok(used) => input = &input[used..],
                    Err(Short) => {
                        self.keep(input);
                        input = &[];
                    }
                }
                continue;
            }
            // Grow the carried structure by what it may need (doubling), not by the read.
            let old = self.carry.len();
            let take = input.len().min(old.max(64));
            self.carry.extend_from_slice(&input[..take]);
            let carry = std::mem::take(&mut self.carry);
            match self.step_over(&carry, topics) {
                Ok(used) => input = &input[used - old..],
                Err(Short) => {
                    input = &input[take..];
                    self.carry = carry;
                    if self.carry.len() > MAX_CARRY {
                        self.give_up();
                    }
                }
            }
        }
    }

    fn keep(&mut self, tail: &[u8]) {
        if tail.len() > MAX_CARRY {
            self.give_up();
        } else {
            self.carry.extend_from_slice(tail);
        }
    }

    fn give_up(&mut self) {
        self.step = Step::GaveUp;
        self.carry = Vec::new();
    }

    /// Reads the structures `buf` begins with, as far as they are whole; returns the
    /// bytes read (records to skip past them are in `self.skip`). Short: not even one.
    fn step_over(&mut self, buf: &[u8], topics: &mut TopicCounts) -> Read<usize> {
        let mut used = 0;
        loop {
            let mut r = Reader::new(&buf[used..]);
            let next = match self.one(&mut r, topics) {
                Ok(next) => next,
                Err(Short) if used > 0 => return Ok(used),
                Err(Short) => return Err(Short),
            };
            used += r.position();
            self.step = next;
            if self.skip > 0 || matches!(next, Step::Done | Step::GaveUp) || used == buf.len() {
                return Ok(used);
            }
        }
    }

    /// One structure: the step after it.
    fn one(&mut self, r: &mut Reader<'_>, topics: &mut TopicCounts) -> Read<Step> {
        Ok(match self.step {
            Step::Start => {
                r.i32()?; // timeout_ms
                match self.count(r)? {
                    Some(n) => Step::Topic { topics_left: n },
                    None => Step::GaveUp,
                }
            }
            Step::Topic { topics_left: 0 } => Step::Tail,
            Step::Topic { topics_left } => {
                let topic = self.topic_key(r)?;
                let Some(partitions) = self.count(r)? else { return Ok(Step::GaveUp) };
                let Some(topic) = topic else { return Ok(Step::GaveUp) };
                let index = match topics.iter().position(|(t, _, _)| topic.is(t)) {
                    Some(index) => index,
                    None => {
                        topics.push((topic.owned(), 0, 0));
                        topics.len() - 1
                    }
                };
                topics[index].1 += 1;
                self.topic = Some(index);
                Step::Partition { topics_left: topics_left - 1, partitions_left: partitions }
            }
            Step::Partition { topics_left, partitions_left: 0 } => {
                if self.flexible {
                    Step::TopicTags { topics_left }
                } else {
                    Step::Topic { topics_left }
                }
            }
            Step::Partition { topics_left, partitions_left } => {
                r.i32()?; // partition index
                let records = if self.flexible {
                    r.compact_len()?
                } else {
                    usize::try_from(r.i32()?).ok()
                };
                let records = records.unwrap_or(0);
                if let Some(entry) = self.topic.and_then(|index| topics.get_mut(index)) {
                    entry.2 = entry.2.saturating_add(records as u64); // a forged length: never an overflow
                }
                self.skip = records;
                let partitions_left = partitions_left - 1;
                if self.flexible {
                    Step::PartitionTags { topics_left, partitions_left }
                } else {
                    Step::Partition { topics_left, partitions_left }
                }
            }
            Step::PartitionTags { topics_left, partitions_left } => {
                tags(r)?;
                Step::Partition { topics_left, partitions_left }
            }
            Step::TopicTags { topics_left } => {
                tags(r)?;
                Step::Topic { topics_left }
            }
            Step::Tail => {
                if self.flexible {
                    tags(r)?;
                }
                Step::Done
            }
            Step::Done | Step::GaveUp => self.step,
        })
    }

    /// An array's length (None: null or negative, nothing to count).
    fn count(&self, r: &mut Reader<'_>) -> Read<Option<usize>> {
        if self.flexible {
            r.compact_len()
        } else {
            Ok(usize::try_from(r.i32()?).ok())
        }
    }

    fn topic_key<'a>(&self, r: &mut Reader<'a>) -> Read<Option<TopicRef<'a>>> {
        if self.topic_ids {
            let id: [u8; 16] = r.take(16)?.try_into().map_err(|_| Short)?;
            return Ok(Some(TopicRef::Id(id)));
        }
        let len = if self.flexible {
            r.compact_len()?
        } else {
            usize::try_from(r.i16()?).ok()
        };
        let Some(len) = len else { return Ok(None) };
        if len > MAX_CARRY {
            return Ok(None);
        }
        Ok(Some(TopicRef::Name(r.take(len)?)))
    }
}

/// A topic as read, before it is counted (a name is allocated only when it is new).
enum TopicRef<'a> {
    Name(&'a [u8]),
    Id([u8; 16]),
}

impl TopicRef<'_> {
    fn is(&self, key: &TopicKey) -> bool {
        match (self, key) {
            (TopicRef::Name(name), TopicKey::Name(known)) => *name == known.as_bytes(),
            (TopicRef::Id(id), TopicKey::Id(known)) => id == known,
            _ => false,
        }
    }

    fn owned(&self) -> TopicKey {
        match self {
            TopicRef::Name(name) => TopicKey::Name(String::from_utf8_lossy(name).into()),
            TopicRef::Id(id) => TopicKey::Id(*id),
        }
    }
}

/// A tagged-field section, skipped whole (it is a structure: its bytes must have arrived).
fn tags(r: &mut Reader<'_>) -> Read<()> {
    r.tagged_fields(|_| ())
}

#[cfg(test)]
mod tests;
