//! Vouched schema ids: batches the module passes itself where a `schema` rule (ids
//! only) is all that applies, because the Python service vouched for their ids.
//!
//! The service decides, with the registry, whether a schema id may be produced to (or
//! fetched from) a topic; after each frame it hands back, per topic whose every rule is
//! such a check, the ids its rules pass now and for how long (`keg.vouched` in its
//! reply, a second at most). A connection keeps them ([`Vouched`]); a later Produce
//! (Fetch answer) whose selected topics are all vouchable and whose every record of
//! those topics carries, in Confluent framing (magic byte 0, 4-byte id), a vouched id
//! is forwarded without a hand-off. Where the rule also checks payloads, the service
//! sends the id's JSON Schema with it and each payload is checked here too
//! ([`super::payload`]). Anything else (another id, a null or short value,
//! a compressed or control batch, an old magic, a frame the walk cannot read) is
//! handed off as before, so the service stays the one who refuses: a pass here only
//! repeats a verdict the service gave, never invents one.
//!
//! Which topics: the interest range's selector (topics some rule may act on) minus
//! its `unvouched` selector (topics some rule other than an ids-only schema check may
//! act on); computed by the Python side (`ext_proc.frames.interest_ranges`).
//!
//! The walk reads each record's length, key length and value prefix: the cost is per
//! record, with no copy of an uncompressed batch. A compressed batch is decompressed
//! for the walk ([`super::inflate`]), at most [`MAX_INFLATED`] bytes per frame (past
//! that the frame is handed off); the bytes that go on are always the ones that came.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::head::PRODUCE;
use super::inflate::inflate;
use super::payload::{PayloadSchema, MAX_VALIDATED};
use super::topics::{
    fetch_answer_head, fetch_answer_partition, fetch_partition_size, share_fetch_answer_head, share_fetch_answer_partition,
    share_fetch_answer_tail, Stop, TopicSelector, Walk, FETCH, FETCH_VERSIONS, SHARE_FETCH, SHARE_FETCH_VERSIONS,
    MAX_PARTITIONS, MAX_TOPICS, PRODUCE_VERSIONS,
};

/// Topics a connection remembers vouches for, per direction, and ids per topic.
pub const MAX_TOPICS_VOUCHED: usize = 256;
pub const MAX_IDS: usize = 64;
/// The longest a vouch is kept, whatever the service says (it says a second at most).
pub const MAX_TTL: Duration = Duration::from_secs(5);
/// Bytes of compressed batches a frame's walk may decompress. A consumer's Fetch answer
/// carries up to 1 MiB of compressed batches per partition (its default
/// max.partition.fetch.bytes), 10-30 MiB of text once decompressed; measured
/// (`examples/inflate_cost.rs`): see docs/native.md. Gzip is weighted ([`super::inflate`]).
pub const MAX_INFLATED: usize = 32 << 20;

/// The service's word on one topic: records whose value carries one of `ids` pass,
/// those of an id in `schemas` when their payload is valid for its JSON Schema too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vouch {
    pub topic: String,
    pub ids: Vec<u32>,
    pub ttl_ms: u64,
    pub schemas: Vec<(u32, Arc<PayloadSchema>)>,
}

/// The ids a topic's records may carry (sorted), each with the schema its payload must
/// meet, if any.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    ids: Vec<u32>,
    schemas: Vec<Option<Arc<PayloadSchema>>>,
    /// Whether some id's payloads are checked against a schema (read per batch).
    validates: bool,
}

impl Allowed {
    /// Ids alone (no payload checks).
    pub fn ids(ids: &[u32]) -> Self {
        Self::of(ids.iter().map(|&id| (id, None)).collect())
    }

    /// At most [`MAX_IDS`] ids, each with its schema, if any.
    pub fn of(mut pairs: Vec<(u32, Option<Arc<PayloadSchema>>)>) -> Self {
        pairs.truncate(MAX_IDS);
        pairs.sort_unstable_by_key(|(id, _)| *id);
        pairs.dedup_by_key(|(id, _)| *id);
        let (ids, schemas): (Vec<u32>, Vec<_>) = pairs.into_iter().unzip();
        let validates = schemas.iter().any(Option::is_some);
        Self { ids, schemas, validates }
    }

    fn from_vouch(ids: Vec<u32>, schemas: Vec<(u32, Arc<PayloadSchema>)>) -> Self {
        let schema_of = |id: u32| schemas.iter().find(|(i, _)| *i == id).map(|(_, s)| s.clone());
        Self::of(ids.into_iter().map(|id| (id, schema_of(id))).collect())
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether a value (Confluent prefix included) passes: its id is allowed and its
    /// payload meets that id's schema, if any (within `budget`'s bytes to validate).
    fn passes(&self, value: &[u8], budget: &mut Budget) -> bool {
        let Some([0, a, b, c, d]) = value.get(..5) else { return false };
        let Ok(at) = self.ids.binary_search(&u32::from_be_bytes([*a, *b, *c, *d])) else { return false };
        match &self.schemas[at] {
            None => true,
            Some(schema) => {
                let payload = &value[5..];
                let Some(left) = budget.validated.checked_sub(payload.len()) else { return false };
                budget.validated = left;
                schema.accepts(payload)
            }
        }
    }
}

/// What one frame's walk may spend: bytes of compressed batches it decompresses, and of
/// payloads it validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub inflated: usize,
    pub validated: usize,
}

impl Budget {
    pub fn frame() -> Self {
        Self { inflated: MAX_INFLATED, validated: MAX_VALIDATED }
    }
}

/// Where a range's vouches apply: its selected topics that `unvouched` does not select.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vouching {
    pub selector: Arc<TopicSelector>,
    pub unvouched: Arc<TopicSelector>,
}

#[derive(Debug)]
struct Entry {
    allowed: Allowed,
    until: Instant,
}

/// One connection's vouches, in one direction (records produced, or fetched), under one
/// interest table: a rule change (a new table, new [`Vouching`]s) drops them all, so a
/// changed rule is never answered with the old rules' word.
#[derive(Debug, Default)]
pub struct Vouched {
    topics: HashMap<Box<[u8]>, Entry>,
    under: Option<Arc<Vouching>>,
}

impl Vouched {
    /// Takes the vouches of one reply to a frame handed off under `under`; each replaces
    /// what was known of its topic.
    pub fn learn(&mut self, vouches: Vec<Vouch>, under: &Arc<Vouching>, now: Instant) {
        if !self.under.as_ref().is_some_and(|known| Arc::ptr_eq(known, under)) {
            self.topics.clear();
            self.under = Some(under.clone());
        }
        for vouch in vouches {
            if self.topics.len() >= MAX_TOPICS_VOUCHED {
                self.topics.retain(|_, e| e.until > now);
                if self.topics.len() >= MAX_TOPICS_VOUCHED {
                    self.topics.clear();
                }
            }
            let until = now + Duration::from_millis(vouch.ttl_ms).min(MAX_TTL);
            let Vouch { topic, ids, schemas, .. } = vouch;
            let allowed = Allowed::from_vouch(ids, schemas);
            self.topics.insert(topic.into_bytes().into_boxed_slice(), Entry { allowed, until });
        }
    }

    /// Whether any vouch may apply to a frame of `vouching`'s range (the same table).
    pub fn applies_to(&self, vouching: &Vouching) -> bool {
        !self.topics.is_empty() && self.under.as_ref().is_some_and(|known| std::ptr::eq(Arc::as_ptr(known), vouching))
    }

    fn allowed(&self, topic: &[u8], now: Instant) -> Option<&Allowed> {
        self.topics.get(topic).filter(|e| e.until > now).map(|e| &e.allowed)
    }
}

/// Whether a whole Produce request may go to the broker without a hand-off: every
/// record of its vouchable topics carries a vouched id, and it has no other selected
/// topic.
pub fn produce_passes(frame: &[u8], version: i16, vouching: &Vouching, vouched: &Vouched, now: Instant) -> bool {
    if !PRODUCE_VERSIONS.contains(&version) || !vouched.applies_to(vouching) {
        return false;
    }
    let flexible = version >= 9;
    let mut w = Walk { buf: frame, pos: 0 };
    let mut walk = || -> Result<Walked, Stop> {
        w.header(flexible)?;
        w.string(flexible)?; // transactional_id
        w.take(2 + 4)?; // acks, timeout_ms
        let check = Check { vouching, vouched, now, tail: Tail::Malformed };
        let walked = topics(&mut w, version >= 13, flexible, &check, |w| {
            w.take(4)?; // index
            let records = w.bytes(flexible)?;
            if flexible {
                w.tagged_fields()?;
            }
            Ok(records)
        })?;
        if flexible {
            w.tagged_fields()?;
        }
        Ok(walked)
    };
    // A Produce is never cut (Tail::Malformed): it passes whole or not at all.
    matches!(walk(), Ok(Walked::Pass { .. })) && w.pos == frame.len()
}

/// What becomes of a Fetch answer read for vouched ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchVerdict {
    /// Every record it carries passes: it goes to the client as it came.
    Pass,
    /// Its records pass up to a batch boundary where what one frame may validate
    /// ([`Budget`]) ran out: these bytes go instead, the same answer with the later
    /// batches of that partition, and the records of the checked partitions after it,
    /// left out. The consumer fetches them again from where it stopped, as after a
    /// broker's answer cut by its byte limits; the next answer is read the same way.
    Cut(Vec<u8>),
    /// The service reads it.
    HandOff,
}

/// Whether a whole Fetch response (size prefix included) may go to the client without
/// a hand-off (as [`produce_passes`]; partitions answered with an error carry no
/// records the service would read).
pub fn fetch_passes(frame: &[u8], version: i16, vouching: &Vouching, vouched: &Vouched, now: Instant) -> bool {
    fetch_verdict(frame, version, vouching, vouched, now) == FetchVerdict::Pass
}

/// What becomes of a whole Fetch response (size prefix included): see [`FetchVerdict`].
pub fn fetch_verdict(frame: &[u8], version: i16, vouching: &Vouching, vouched: &Vouched, now: Instant) -> FetchVerdict {
    if !FETCH_VERSIONS.contains(&version) || !vouched.applies_to(vouching) {
        return FetchVerdict::HandOff;
    }
    fetch_walk(frame, version, &Check { vouching, vouched, now, tail: Tail::Dropped })
}

/// Whether a whole Fetch response names no topic `selector` selects: every topic read
/// (by name, or by an id the module knows), none selected. Anything else (a selected
/// topic, an unknown id, a frame the walk cannot read whole) is false: the service
/// reads it. What a [`Selection::ByAnswer`](super::topics::Selection) request's answer is
/// judged by.
/// A ShareFetch response is read the same way (its records are not checked: no
/// vouching applies to share groups).
pub fn answer_unselected(api_key: i16, frame: &[u8], version: i16, selector: &Arc<TopicSelector>) -> bool {
    // Every selected topic is "unvouched", and nothing is vouched for: the walk passes
    // only an answer whose topics are all unselected.
    let vouching = Vouching { selector: selector.clone(), unvouched: selector.clone() };
    let check = Check { vouching: &vouching, vouched: &Vouched::default(), now: Instant::now(), tail: Tail::Dropped };
    match api_key {
        FETCH if FETCH_VERSIONS.contains(&version) => fetch_walk(frame, version, &check) == FetchVerdict::Pass,
        SHARE_FETCH if SHARE_FETCH_VERSIONS.contains(&version) => share_fetch_walk(frame, &check),
        _ => false,
    }
}

/// Whether a whole ShareFetch response passes `check` (read whole, nothing after it).
fn share_fetch_walk(frame: &[u8], check: &Check<'_>) -> bool {
    let mut w = Walk { buf: frame, pos: 0 };
    let mut walk = || -> Result<Walked, Stop> {
        share_fetch_answer_head(&mut w)?;
        let walked = topics(&mut w, true, true, check, |w| share_fetch_answer_partition(w).map(|_| None))?;
        share_fetch_answer_tail(&mut w)?;
        Ok(walked)
    };
    matches!(walk(), Ok(Walked::Pass { .. })) && w.pos == frame.len()
}

fn fetch_walk(frame: &[u8], version: i16, check: &Check<'_>) -> FetchVerdict {
    let flexible = version >= 12;
    let mut w = Walk { buf: frame, pos: 0 };
    let mut walk = || -> Result<Walked, Stop> {
        fetch_answer_head(&mut w, version)?;
        let walked = topics(&mut w, version >= 13, flexible, check, |w| {
            let (error, records) = fetch_answer_partition(w, version)?;
            Ok(if error == 0 { records } else { None })
        })?;
        if flexible {
            w.tagged_fields()?;
        }
        Ok(walked)
    };
    match walk() {
        Ok(Walked::Pass { cuts }) if w.pos == frame.len() => {
            if cuts.is_empty() {
                FetchVerdict::Pass
            } else {
                cut(frame, &cuts, flexible).map_or(FetchVerdict::HandOff, FetchVerdict::Cut)
            }
        }
        _ => FetchVerdict::HandOff,
    }
}

/// A checked partition's records (at `at` in the frame, `len` bytes) of which only the
/// first `keep` bytes (whole batches) go on.
#[derive(Debug, Clone, Copy)]
struct Cut {
    at: usize,
    len: usize,
    keep: usize,
}

/// The frame with each cut partition's records shortened (its length field rewritten)
/// and the size prefix set again; None if a length field is not where it should be.
fn cut(frame: &[u8], cuts: &[Cut], flexible: bool) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(frame.len());
    let mut pos = 0;
    for c in cuts {
        let field = if flexible { uvarint_len(c.len as u64 + 1) } else { 4 };
        let start = c.at.checked_sub(field)?;
        let written = frame.get(start..c.at)?;
        let mut expected = Vec::with_capacity(5);
        put_length(&mut expected, c.len, flexible)?;
        if start < pos || written != expected.as_slice() {
            return None; // not the minimal encoding the walk assumed
        }
        out.extend_from_slice(&frame[pos..start]);
        put_length(&mut out, c.keep, flexible)?;
        out.extend_from_slice(frame.get(c.at..c.at + c.keep)?);
        pos = c.at + c.len;
    }
    out.extend_from_slice(frame.get(pos..)?);
    let size = i32::try_from(out.len() - 4).ok()?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Some(out)
}

// (kafka-protocol 0.18's varint encoder is behind a private trait: written out here.)
fn uvarint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

/// A records length: compact (unsigned varint of length + 1) or an i32.
fn put_length(out: &mut Vec<u8>, len: usize, flexible: bool) -> Option<()> {
    if flexible {
        let mut value = u32::try_from(len).ok()?.checked_add(1)?;
        while value >= 0x80 {
            out.push((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    } else {
        out.extend_from_slice(&i32::try_from(len).ok()?.to_be_bytes());
    }
    Some(())
}

/// Whether a whole Fetch request may go to the broker without a hand-off: every topic
/// of it the range's selector selects is vouchable and has live vouched ids (so its
/// answer will likely pass on them; one that does not is handed off after the request).
pub fn fetch_request_passes(frame: &[u8], version: i16, vouching: &Vouching, vouched: &Vouched, now: Instant) -> bool {
    if !FETCH_VERSIONS.contains(&version) || !vouched.applies_to(vouching) {
        return false;
    }
    let flexible = version >= 12;
    let mut w = Walk { buf: frame, pos: 0 };
    let mut walk = || -> Result<bool, Stop> {
        w.header(flexible)?;
        if version <= 14 {
            w.take(4)?; // replica_id
        }
        w.take(4 + 4 + 4 + 1)?; // max_wait_ms, min_bytes, max_bytes, isolation_level
        if version >= 7 {
            w.take(4 + 4)?; // session_id, session_epoch
        }
        let count = w.count(flexible)?;
        if count > MAX_TOPICS {
            return Ok(false);
        }
        let partition_size = fetch_partition_size(version);
        for _ in 0..count {
            let named = w.topic_name(version >= 13, flexible)?;
            let name = named.as_bytes();
            if vouching.selector.selects(name)
                && (vouching.unvouched.selects(name) || vouched.allowed(name, now).is_none_or(Allowed::is_empty))
            {
                return Ok(false);
            }
            let partitions = w.count(flexible)?;
            if partitions > MAX_PARTITIONS {
                return Ok(false);
            }
            for _ in 0..partitions {
                w.take(partition_size)?;
                if flexible {
                    w.tagged_fields()?;
                }
            }
            if flexible {
                w.tagged_fields()?;
            }
        }
        Ok(true)
    };
    matches!(walk(), Ok(true))
}

/// What a frame's records are checked against.
#[derive(Clone, Copy)]
struct Check<'v> {
    vouching: &'v Vouching,
    vouched: &'v Vouched,
    now: Instant,
    tail: Tail,
}

/// What the walk of a frame's topics found.
enum Walked {
    /// Each topic is unselected or vouchable with every record vouched, up to `cuts`
    /// (a Fetch answer's only: [`FetchVerdict::Cut`]).
    Pass { cuts: Vec<Cut> },
    Fail,
}

/// The topics array of a Produce request or Fetch response. `partition` reads one
/// partition entry and returns its records.
fn topics<'a>(
    w: &mut Walk<'a>,
    ids: bool,
    flexible: bool,
    check: &Check<'_>,
    partition: impl Fn(&mut Walk<'a>) -> Result<Option<&'a [u8]>, Stop>,
) -> Result<Walked, Stop> {
    let Check { vouching, vouched, now, tail } = *check;
    let base = w.buf.as_ptr() as usize;
    let count = w.count(flexible)?;
    if count > MAX_TOPICS {
        return Ok(Walked::Fail);
    }
    let mut cuts = Vec::new();
    // Whether a checked partition with records was read whole: a cut before the first
    // one's first batch would leave the consumer nothing to go on with, answer after
    // answer, so such an answer goes to the service instead.
    let mut read_some = false;
    let mut partitions_seen = 0usize;
    let mut budget = Budget::frame();
    for _ in 0..count {
        let named = w.topic_name(ids, flexible)?;
        let name = named.as_bytes();
        let checked = vouching.selector.selects(name);
        if checked && vouching.unvouched.selects(name) {
            return Ok(Walked::Fail);
        }
        let allowed = if checked { Some(vouched.allowed(name, now).ok_or(Stop::HandOff)?) } else { None };
        let partitions = w.count(flexible)?;
        partitions_seen += partitions;
        if partitions_seen > MAX_PARTITIONS {
            return Ok(Walked::Fail);
        }
        for _ in 0..partitions {
            let records = partition(w)?;
            let (Some(allowed), Some(records)) = (allowed, records) else { continue };
            if records.is_empty() {
                continue;
            }
            let at = records.as_ptr() as usize - base;
            if !cuts.is_empty() {
                cuts.push(Cut { at, len: records.len(), keep: 0 }); // the budget is spent
                continue;
            }
            match records_walk(records, allowed, &mut budget, tail) {
                Reach::All => read_some = true,
                Reach::Fail => return Ok(Walked::Fail),
                Reach::Upto(keep) => {
                    if tail == Tail::Malformed || (keep == 0 && !read_some) {
                        return Ok(Walked::Fail);
                    }
                    cuts.push(Cut { at, len: records.len(), keep });
                }
            }
        }
        if flexible {
            w.tagged_fields()?;
        }
    }
    Ok(Walked::Pass { cuts })
}

/// What a last batch cut short means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// Nothing is read of it (a Fetch answer's): it passes.
    Dropped,
    /// It is malformed (a Produce's): nothing passes.
    Malformed,
}

/// Offsets in a record batch (magic 2) of what the walks read (this one, and
/// [`super::safeguard`]'s).
pub(super) const BATCH_LENGTH_AT: usize = 8;
pub(super) const MAGIC_AT: usize = 16;
pub(super) const ATTRIBUTES_AT: usize = 21;
const RECORDS_COUNT_AT: usize = 57;
pub(super) const BATCH_HEADER: usize = 61;
/// Compression codec bits, and the control flag, of a batch's attributes.
pub(super) const CODEC_MASK: i16 = 0x07;
const CONTROL: i16 = 0x20;

/// Whether every record of every batch in `records` has a value in Confluent framing
/// with one of `allowed`'s ids (and a payload its schema accepts, if any). Control
/// batches carry no user records and pass; a batch of an older magic, cut short, or
/// that does not decompress (validate) within `budget`, charged for what it
/// decompresses (validates), does not.
///
/// `tail`: a last batch cut short passes (a Fetch answer's: the broker slices the log
/// by bytes, and consumers drop that batch and fetch it again from its offset, when it
/// comes whole and is read here).
pub fn records_pass(records: &[u8], allowed: &Allowed, budget: &mut Budget, tail: Tail) -> bool {
    matches!(records_walk(records, allowed, budget, tail), Reach::All)
}

/// How far a partition's records pass.
enum Reach {
    All,
    /// Every batch before this offset passes; the next would outrun what is left to
    /// validate (nothing of it was parsed).
    Upto(usize),
    Fail,
}

fn records_walk(records: &[u8], allowed: &Allowed, budget: &mut Budget, tail: Tail) -> Reach {
    let cut = if tail == Tail::Dropped { Reach::All } else { Reach::Fail };
    let mut pos = 0;
    while pos < records.len() {
        let Some(header) = records.get(pos..pos + BATCH_HEADER) else { return cut };
        let length = i32::from_be_bytes(header[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].try_into().unwrap_or_default());
        let Some(end) = usize::try_from(length).ok().and_then(|l| (pos + 12).checked_add(l)) else { return Reach::Fail };
        if end > records.len() && header[MAGIC_AT] == 2 && end >= pos + BATCH_HEADER {
            return cut;
        }
        if header[MAGIC_AT] != 2 || end > records.len() || end < pos + BATCH_HEADER {
            return Reach::Fail;
        }
        let attributes = i16::from_be_bytes([header[ATTRIBUTES_AT], header[ATTRIBUTES_AT + 1]]);
        if attributes & CONTROL == 0 {
            let count = i32::from_be_bytes(header[RECORDS_COUNT_AT..RECORDS_COUNT_AT + 4].try_into().unwrap_or_default());
            let body = &records[pos + BATCH_HEADER..end];
            // A batch whose records alone would outrun what is left to validate stops
            // the walk before any of its payloads is parsed (no work wasted).
            let fits = |plain: &[u8], budget: &Budget| !allowed.validates || plain.len() <= budget.validated;
            let passes = match attributes & CODEC_MASK {
                0 if !fits(body, budget) => return Reach::Upto(pos),
                0 => batch_records_pass(body, count, allowed, budget),
                codec => match inflate(codec, body, &mut budget.inflated) {
                    Some(plain) if !fits(&plain, budget) => return Reach::Upto(pos),
                    Some(plain) => batch_records_pass(&plain, count, allowed, budget),
                    None => false,
                },
            };
            if !passes {
                return Reach::Fail;
            }
        }
        pos = end;
    }
    Reach::All
}

fn batch_records_pass(mut body: &[u8], count: i32, allowed: &Allowed, budget: &mut Budget) -> bool {
    if count < 0 {
        return false;
    }
    for _ in 0..count {
        let mut pos = 0;
        let Some(length) = varint(body, &mut pos).and_then(|l| usize::try_from(l).ok()) else { return false };
        let Some(record) = body.get(pos..pos.saturating_add(length)) else { return false };
        if !record_passes(record, allowed, budget) {
            return false;
        }
        body = &body[pos + length..];
    }
    body.is_empty()
}

/// One record (after its length): attributes, timestamp delta, offset delta, key, value.
fn record_passes(record: &[u8], allowed: &Allowed, budget: &mut Budget) -> bool {
    let mut pos = 1; // attributes
    let skipped = varint(record, &mut pos).and(varint(record, &mut pos)); // timestamp, offset deltas
    let Some(key_len) = skipped.and_then(|_| varint(record, &mut pos)) else { return false };
    if key_len > 0 {
        pos = pos.saturating_add(key_len as usize);
    }
    let Some(value_len) = varint(record, &mut pos).and_then(|l| usize::try_from(l).ok()) else {
        return false; // null
    };
    pos.checked_add(value_len).and_then(|end| record.get(pos..end)).is_some_and(|value| allowed.passes(value, budget))
}

/// A zigzag varint of at most 10 bytes (a varlong), as records encode their fields.
fn varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

/// Whether `api_key` is one the walk reads for vouches.
pub fn vouchable_api(api_key: i16) -> bool {
    api_key == PRODUCE || api_key == FETCH
}
