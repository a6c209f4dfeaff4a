//! Topic-selective hand-off: which topics a Produce, Fetch or ShareFetch request names, read without
//! decoding it, and whether the interest table's topic selector wants one of them.
//!
//! The Python side computes, per interest range, the union of the topic matchers of
//! every rule that may act on the API (`ext_proc.frames.interest_ranges`). A request of
//! such a range goes to the Python chain only if one of its topics is selected;
//! everything the walk cannot vouch for (a version it does not know, a malformed or
//! truncated frame, a name that is not UTF-8, an id never seen in a Metadata answer,
//! an incremental Fetch, too many topics) is handed off: a missed hand-off would be a
//! rule bypassed, an extra one only costs time.
//!
//! The walk reads fixed-size fields and lengths only: records are skipped by their
//! length, so the cost is per topic and partition, not per byte. Layouts (Kafka 4.1's
//! schemas; flexible versions use compact lengths and tagged fields):
//!
//! ```text
//! header:  size int32 | api_key int16 | api_version int16 | correlation_id int32
//!          | client_id int16 string | [tagged fields: Produce v9+, Fetch v12+]
//! Produce v3-13: transactional_id nullable string | acks int16 | timeout_ms int32
//!          | topic_data: array of
//!              name string (v3-12) | topic_id uuid (v13+)
//!              partition_data: array of index int32 | records nullable bytes | [tags]
//!              [tags]
//! Fetch v4-18: [replica_id int32: v4-14] | max_wait_ms int32 | min_bytes int32
//!          | max_bytes int32 | isolation_level int8 | [session_id int32 | session_epoch
//!          int32: v7+] | topics: array of
//!              topic string (v4-12) | topic_id uuid (v13+)
//!              partitions: array of partition int32 | [current_leader_epoch int32: v9+]
//!                | fetch_offset int64 | [last_fetched_epoch int32: v12+]
//!                | [log_start_offset int64: v5+] | partition_max_bytes int32 | [tags]
//!              [tags]
//! ShareFetch v1 (flexible): group_id nullable string | member_id nullable string
//!          | share_session_epoch int32 | max_wait_ms int32 | min_bytes int32
//!          | max_bytes int32 | max_records int32 | batch_size int32 | topics:
//!          array of topic_id uuid | partitions: array of partition_index int32
//!            | acknowledgement_batches: array of
//!            (first_offset int64 | last_offset int64 | acknowledge_types int8 array
//!            | [tags]) | [tags]
//!          [tags] | forgotten_topics_data (not read)
//! ```
//!
//! Share sessions (KIP-932) are judged like fetch sessions: a ShareFetch opening one
//! (epoch 0) by the topics it names, its answer carries those alone; one in a session
//! (any other epoch) naming no selected topic by its answer
//! (`vouch::answer_unselected`).
//!
//! Fetch sessions (KIP-227): an incremental Fetch (session epoch > 0) names only the
//! partitions that changed, while its answer carries records of every partition of the
//! session. One naming a selected topic is handed off; one naming none is
//! [`Selection::ByAnswer`]: it goes to the broker and its answer is read for topics
//! before any byte of it reaches the client (`vouch::answer_unselected`): an answer
//! naming a selected topic (or one the walk cannot vouch for) goes to the Python chain
//! after the request, replayed. The answer, not the module's idea of the session, is what
//! is judged: a session is the broker's, and another connection may change it. A full
//! Fetch (epoch 0 or -1, or v4-6) is answered for exactly the partitions it names.
//!
//! Topic ids (Produce v13+, Fetch v13+) are named by a process-wide map learned from the
//! Metadata answers the module rewrites anyway ([`learn_topic_id`]); an id it has not
//! seen (or not kept: the map is bounded) is handed off.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};

use regex::bytes::{RegexBuilder, RegexSet, RegexSetBuilder};
use serde::Deserialize;

use super::head::PRODUCE;

pub const FETCH: i16 = 1;
pub const SHARE_FETCH: i16 = 78;
/// The versions whose layout the walk knows (Kafka 4.1's valid versions; ShareFetch v0,
/// Kafka 4.0's early access, is handed off whole).
pub(super) const PRODUCE_VERSIONS: std::ops::RangeInclusive<i16> = 3..=13;
pub(super) const FETCH_VERSIONS: std::ops::RangeInclusive<i16> = 4..=18;
pub(super) const SHARE_FETCH_VERSIONS: std::ops::RangeInclusive<i16> = 1..=1;

/// The APIs whose requests may carry topic selectors.
pub fn selects_topics(api_key: i16) -> bool {
    matches!(api_key, PRODUCE | FETCH | SHARE_FETCH)
}

/// The APIs a request of which may be judged by its answer (sessions: Fetch, ShareFetch).
pub fn judged_by_answer(api_key: i16) -> bool {
    matches!(api_key, FETCH | SHARE_FETCH)
}
/// Beyond this many topics, or partitions in all, a request is handed off instead of
/// walked (a bound on the work per request; clients name a few).
pub const MAX_TOPICS: usize = 1000;
pub const MAX_PARTITIONS: usize = 10_000;
/// Topic ids remembered per process (Envoy's workers are threads of one process).
pub const MAX_TOPIC_IDS: usize = 100_000;
/// The longest pattern accepted (as the Python side's `MAX_PATTERN_LENGTH`).
const MAX_PATTERN_LENGTH: usize = 4096;
/// Compiled size allowed per pattern and per set (the crate's default is 10 MiB).
const REGEX_SIZE_LIMIT: usize = 32 << 20;

/// A topic as a frame names it: its name as read, or the name its id is known by.
pub(super) enum Named<'a> {
    Read(&'a [u8]),
    Known(Arc<str>),
}

impl Named<'_> {
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Named::Read(name) => name,
            Named::Known(name) => name.as_bytes(),
        }
    }
}

/// The fixed size of one partition of a Fetch request (its tagged fields aside):
/// partition, [current_leader_epoch: v9+], fetch_offset, [last_fetched_epoch: v12+],
/// [log_start_offset: v5+], partition_max_bytes.
pub(super) fn fetch_partition_size(version: i16) -> usize {
    4 + if version >= 9 { 4 } else { 0 } + 8 + if version >= 12 { 4 } else { 0 } + if version >= 5 { 8 } else { 0 } + 4
}

/// Whether the walk reads this request's topics (other versions are handed off whole).
pub fn readable(api_key: i16, api_version: i16) -> bool {
    match api_key {
        PRODUCE => PRODUCE_VERSIONS.contains(&api_version),
        FETCH => FETCH_VERSIONS.contains(&api_version),
        SHARE_FETCH => SHARE_FETCH_VERSIONS.contains(&api_version),
        _ => false,
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelector {
    #[serde(default)]
    exact: Vec<String>,
    #[serde(default)]
    prefix: Vec<String>,
    #[serde(default)]
    regex: Vec<String>,
}

/// A selector as the module reads it (see [`TopicSelector::read`]).
#[derive(Debug)]
pub enum SelectorReading {
    Topics(TopicSelector),
    /// Every frame of the range, with the reason the selector could not be applied.
    Everything(String),
}

/// Topic names as keg's rules match them: equal to one of `exact`, starting with one
/// of `prefix`, or matched whole by one of `regex` (RE2 on the Python side; the Python
/// side only sends patterns of a subset both engines read alike, `portable_regex`).
///
/// Only ASCII names are matched: every valid Kafka topic name is ASCII
/// (`[a-zA-Z0-9._-]`), and on ASCII text RE2 and Rust's `regex` in its ASCII mode
/// (`\w`, `\d`, `.` and `(?i)` as RE2 reads them there) agree. Any other name is
/// selected (handed off): no broker stores records under it, and the Python side
/// judges it.
#[derive(Debug, Clone)]
pub struct TopicSelector {
    exact: HashSet<String>,
    prefix: Vec<String>,
    regex: Option<RegexSet>,
    /// The patterns as given (equality of tables).
    patterns: Vec<String>,
}

impl PartialEq for TopicSelector {
    fn eq(&self, other: &Self) -> bool {
        self.exact == other.exact && self.prefix == other.prefix && self.patterns == other.patterns
    }
}

impl Eq for TopicSelector {}

impl TopicSelector {
    /// Parses `{"exact": [...], "prefix": [...], "regex": [...]}`, strictly: a selector
    /// that is malformed or has a pattern that does not compile is an error.
    pub fn parse(value: serde_json::Value) -> Result<TopicSelector, String> {
        match Self::read(value)? {
            SelectorReading::Topics(selector) => Ok(selector),
            SelectorReading::Everything(reason) => Err(reason),
        }
    }

    /// What the module makes of a selector in its configuration: a malformed one is an
    /// error (the configuration is refused), but one whose pattern this module cannot
    /// compile selects everything. Refusing the table there would leave Envoy on the
    /// previous one, which may lack a rule the Python side already enforces (a topic
    /// it never hands off: a bypass); handing off every frame of the range is slower,
    /// never wrong. The Python side sends only patterns both engines read alike
    /// (`portable_regex`), so this is the exception, logged as a warning.
    pub fn read(value: serde_json::Value) -> Result<SelectorReading, String> {
        let raw: RawSelector = serde_json::from_value(value).map_err(|e| format!("topic selector: {e}"))?;
        Ok(match Self::build(raw) {
            Ok(selector) => SelectorReading::Topics(selector),
            Err(reason) => SelectorReading::Everything(reason),
        })
    }

    fn build(raw: RawSelector) -> Result<TopicSelector, String> {
        let mut anchored = Vec::with_capacity(raw.regex.len());
        for pattern in &raw.regex {
            if pattern.len() > MAX_PATTERN_LENGTH {
                return Err(format!("topic selector: pattern longer than {MAX_PATTERN_LENGTH} bytes"));
            }
            // Whole-name matches, as RE2's fullmatch on the Python side.
            let whole = format!(r"\A(?:{pattern})\z");
            RegexBuilder::new(&whole).unicode(false).size_limit(REGEX_SIZE_LIMIT).build()
                .map_err(|e| format!("topic selector: pattern {pattern:?} does not compile: {e}"))?;
            anchored.push(whole);
        }
        let regex = if anchored.is_empty() {
            None
        } else {
            Some(RegexSetBuilder::new(&anchored).unicode(false).size_limit(REGEX_SIZE_LIMIT).build()
                .map_err(|e| format!("topic selector: patterns do not compile together: {e}"))?)
        };
        Ok(TopicSelector { exact: raw.exact.into_iter().collect(), prefix: raw.prefix, regex, patterns: raw.regex })
    }

    /// Whether a topic name (as the request carries it) is selected. A name that is not
    /// UTF-8 is (the Python side would read it otherwise, or refuse the request).
    pub fn selects(&self, name: &[u8]) -> bool {
        if !name.is_ascii() {
            return true;
        }
        let Ok(text) = std::str::from_utf8(name) else { return true };
        self.exact.contains(text)
            || self.prefix.iter().any(|p| text.starts_with(p.as_str()))
            || self.regex.as_ref().is_some_and(|r| r.is_match(name))
    }
}

/// What to do with a request, from the part of it read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Hand it off: a topic is selected, or its topics cannot be vouched for.
    HandOff,
    /// No topic of it is selected: it passes natively.
    Pass,
    /// The topics read so far select nothing; more of the frame is needed.
    NeedMore,
    /// An incremental Fetch naming no selected topic: it goes to the broker, and its
    /// answer decides (see the module's documentation).
    ByAnswer,
}

/// Decides a Produce or Fetch request from `buf`, its first bytes (from the size prefix;
/// `frame_len` in all, prefix included).
pub fn select(api_key: i16, api_version: i16, buf: &[u8], frame_len: usize, selector: &TopicSelector) -> Selection {
    let complete = buf.len() >= frame_len;
    let mut walk = Walk { buf: &buf[..buf.len().min(frame_len)], pos: 0 };
    let result = match api_key {
        PRODUCE if PRODUCE_VERSIONS.contains(&api_version) => walk.produce(api_version, selector),
        FETCH if FETCH_VERSIONS.contains(&api_version) => walk.fetch(api_version, selector),
        SHARE_FETCH if SHARE_FETCH_VERSIONS.contains(&api_version) => walk.share_fetch(selector),
        _ => Err(Stop::HandOff),
    };
    match result {
        Ok(Found::Nothing) => Selection::Pass,
        Ok(Found::NothingInSession) => Selection::ByAnswer,
        Ok(Found::Selected) | Err(Stop::HandOff) => Selection::HandOff,
        // Short of a complete frame: malformed, the Python side judges it.
        Err(Stop::Short) if complete => Selection::HandOff,
        Err(Stop::Short) => Selection::NeedMore,
    }
}

/// What the walk of a request's topics found.
enum Found {
    Selected,
    Nothing,
    /// Nothing, in an incremental Fetch: its answer may carry other topics.
    NothingInSession,
}

pub(super) enum Stop {
    /// The bytes read end before the value does.
    Short,
    /// Hand it off (selected, unreadable, or not to be judged by its topics).
    HandOff,
}

pub(super) type Step<T> = Result<T, Stop>;

/// A cursor over a frame's first bytes; skipping may pass their end (records are
/// skipped by length before they arrived), reading there is [`Stop::Short`].
pub(super) struct Walk<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Walk<'a> {
    pub(super) fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(Stop::HandOff)?;
        let bytes = self.buf.get(self.pos..end).ok_or(Stop::Short)?;
        self.pos = end;
        Ok(bytes)
    }

    fn skip(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n);
    }

    fn i8(&mut self) -> Step<i8> {
        Ok(self.take(1)?[0] as i8)
    }

    pub(super) fn i16(&mut self) -> Step<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub(super) fn i32(&mut self) -> Step<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned varint of at most 5 bytes (Kafka's limit for lengths and counts).
    pub(super) fn uvarint(&mut self) -> Step<u32> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.i8()? as u8;
            if shift == 28 && byte > 0x0f {
                return Err(Stop::HandOff); // over 32 bits: malformed
            }
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Stop::HandOff)
    }

    /// A nullable length: compact (unsigned varint, 0 = null), else int16 (strings) or
    /// int32 (bytes) with -1 = null.
    fn nullable_len(&mut self, compact: bool, int32: bool) -> Step<Option<usize>> {
        if compact {
            return Ok(match self.uvarint()? {
                0 => None,
                n => Some((n - 1) as usize),
            });
        }
        match if int32 { self.i32()? } else { i32::from(self.i16()?) } {
            -1 => Ok(None),
            n if n < 0 => Err(Stop::HandOff),
            n => Ok(Some(n as usize)),
        }
    }

    /// A string's bytes (int16 or compact length); None when null.
    pub(super) fn string(&mut self, compact: bool) -> Step<Option<&'a [u8]>> {
        match self.nullable_len(compact, false)? {
            None => Ok(None),
            Some(len) => self.take(len).map(Some),
        }
    }

    /// Nullable bytes (records), read whole; None when null.
    pub(super) fn bytes(&mut self, compact: bool) -> Step<Option<&'a [u8]>> {
        match self.nullable_len(compact, true)? {
            None => Ok(None),
            Some(len) => self.take(len).map(Some),
        }
    }

    /// Nullable bytes (records): skipped by their length.
    fn skip_bytes(&mut self, compact: bool) -> Step<()> {
        let len = self.nullable_len(compact, true)?.unwrap_or(0);
        self.skip(len);
        Ok(())
    }

    /// A non-nullable array's count (a null one is malformed).
    pub(super) fn count(&mut self, compact: bool) -> Step<usize> {
        if compact {
            match self.uvarint()? {
                0 => Err(Stop::HandOff),
                n => Ok((n - 1) as usize),
            }
        } else {
            match self.i32()? {
                n if n < 0 => Err(Stop::HandOff),
                n => Ok(n as usize),
            }
        }
    }

    pub(super) fn tagged_fields(&mut self) -> Step<()> {
        let count = self.uvarint()?;
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()?;
            // A tag's value must be there: a frame whose tags run past the bytes read
            // so far needs more of them, never a guess.
            self.take(size as usize)?;
        }
        Ok(())
    }

    /// The request header through client_id (and its tagged fields when flexible).
    pub(super) fn header(&mut self, flexible: bool) -> Step<()> {
        self.take(4 + 2 + 2 + 4)?;
        self.string(false)?; // client_id: never compact (KIP-482)
        if flexible {
            self.tagged_fields()?;
        }
        Ok(())
    }

    /// One topic's name, or its id named from the Metadata answers: an id never seen
    /// named, or a null name, is [`Stop::HandOff`].
    pub(super) fn topic_name(&mut self, ids: bool, compact: bool) -> Step<Named<'a>> {
        if ids {
            let id: [u8; 16] = self.take(16)?.try_into().map_err(|_| Stop::HandOff)?;
            return topic_name(&id).map(Named::Known).ok_or(Stop::HandOff);
        }
        self.string(compact)?.map(Named::Read).ok_or(Stop::HandOff)
    }

    /// One topic's name or id: selected?
    fn topic(&mut self, ids: bool, compact: bool, selector: &TopicSelector) -> Step<bool> {
        Ok(selector.selects(self.topic_name(ids, compact)?.as_bytes()))
    }

    fn produce(&mut self, version: i16, selector: &TopicSelector) -> Step<Found> {
        Ok(if self.produce_selects(version, selector)? { Found::Selected } else { Found::Nothing })
    }

    /// true: a topic is selected; false: every topic was read, none is.
    fn produce_selects(&mut self, version: i16, selector: &TopicSelector) -> Step<bool> {
        let flexible = version >= 9;
        self.header(flexible)?;
        self.string(flexible)?; // transactional_id
        self.take(2 + 4)?; // acks, timeout_ms
        self.any_selected(version >= 13, flexible, selector, |w| {
            w.take(4)?; // index
            w.skip_bytes(flexible)?; // records
            if flexible {
                w.tagged_fields()?;
            }
            Ok(())
        })
    }

    fn fetch(&mut self, version: i16, selector: &TopicSelector) -> Step<Found> {
        let flexible = version >= 12;
        self.header(flexible)?;
        if version <= 14 {
            self.take(4)?; // replica_id
        }
        self.take(4 + 4 + 4 + 1)?; // max_wait_ms, min_bytes, max_bytes, isolation_level
        // Incremental (KIP-227): its answer is not bounded by the topics it names.
        let incremental = version >= 7 && {
            self.take(4)?; // session_id
            !matches!(self.i32()?, 0 | -1)
        };
        let partition_size = fetch_partition_size(version);
        let selected = self.any_selected(version >= 13, flexible, selector, |w| {
            w.take(partition_size)?;
            if flexible {
                w.tagged_fields()?;
            }
            Ok(())
        })?;
        Ok(found(selected, incremental))
    }

    fn share_fetch(&mut self, selector: &TopicSelector) -> Step<Found> {
        let epoch = share_fetch_head(self)?;
        let selected = self.any_selected(true, true, selector, share_fetch_partition)?;
        // A share session's answer (epoch other than 0) is not bounded by the topics
        // its request names.
        Ok(found(selected, epoch != 0))
    }

    /// A request's topics array: true when a topic is selected; false when every topic
    /// was read and none is. `partition` reads one partition entry (its tags included).
    fn any_selected(&mut self, ids: bool, flexible: bool, selector: &TopicSelector,
                    partition: impl Fn(&mut Self) -> Step<()>) -> Step<bool> {
        let topics = self.count(flexible)?;
        if topics > MAX_TOPICS {
            return Err(Stop::HandOff);
        }
        let mut partitions_seen = 0usize;
        for i in 0..topics {
            if self.topic(ids, flexible, selector)? {
                return Ok(true);
            }
            if i + 1 == topics {
                return Ok(false); // the last name: what follows cannot select
            }
            let partitions = self.count(flexible)?;
            partitions_seen += partitions;
            if partitions_seen > MAX_PARTITIONS {
                return Err(Stop::HandOff);
            }
            for _ in 0..partitions {
                partition(self)?;
            }
            if flexible {
                self.tagged_fields()?;
            }
        }
        Ok(false)
    }
}

/// What a request's topics found: in a session (an incremental Fetch, a ShareFetch
/// after the first), naming nothing selected leaves the answer to decide.
fn found(selected: bool, in_session: bool) -> Found {
    match (selected, in_session) {
        (true, _) => Found::Selected,
        (false, true) => Found::NothingInSession,
        (false, false) => Found::Nothing,
    }
}

/// A ShareFetch request (v1) through its fields before the topics; its share session
/// epoch.
fn share_fetch_head(w: &mut Walk<'_>) -> Step<i32> {
    w.header(true)?;
    w.string(true)?; // group_id
    w.string(true)?; // member_id
    let epoch = w.i32()?;
    w.take(4 + 4 + 4 + 4 + 4)?; // max_wait_ms, min_bytes, max_bytes, max_records, batch_size
    Ok(epoch)
}

/// One partition of a ShareFetch request, its acknowledgements and tags included.
fn share_fetch_partition(w: &mut Walk<'_>) -> Step<()> {
    w.take(4)?; // partition_index
    let batches = w.count(true)?;
    for _ in 0..batches {
        w.take(8 + 8)?; // first_offset, last_offset
        let types = w.count(true)?;
        w.take(types)?; // acknowledge_types
        w.tagged_fields()?;
    }
    w.tagged_fields()
}

/// A ShareFetch response (v1) through its top-level fields before the topics: size,
/// correlation id, header tags, throttle_time_ms, error_code, error_message,
/// acquisition_lock_timeout_ms.
pub(super) fn share_fetch_answer_head(w: &mut Walk<'_>) -> Step<()> {
    w.take(4 + 4)?; // size, correlation_id
    w.tagged_fields()?; // response header v1
    w.take(4 + 2)?; // throttle_time_ms, error_code
    w.string(true)?; // error_message
    w.take(4)?; // acquisition_lock_timeout_ms
    Ok(())
}

/// One partition of a ShareFetch response: its error code and records (None when null).
/// partition_index, error_code, error_message, acknowledge_error_code,
/// acknowledge_error_message, current_leader (leader_id, leader_epoch, tags), records,
/// acquired_records (first_offset, last_offset, delivery_count, tags), tags.
pub(super) fn share_fetch_answer_partition<'a>(w: &mut Walk<'a>) -> Step<(i16, Option<&'a [u8]>)> {
    w.take(4)?; // partition_index
    let error = w.i16()?;
    w.string(true)?; // error_message
    w.take(2)?; // acknowledge_error_code
    w.string(true)?; // acknowledge_error_message
    w.take(4 + 4)?; // current_leader
    w.tagged_fields()?;
    let records = w.bytes(true)?;
    let acquired = w.count(true)?;
    for _ in 0..acquired {
        w.take(8 + 8 + 2)?;
        w.tagged_fields()?;
    }
    w.tagged_fields()?;
    Ok((error, records))
}

/// A ShareFetch response's node_endpoints and top-level tags (after its topics).
pub(super) fn share_fetch_answer_tail(w: &mut Walk<'_>) -> Step<()> {
    let nodes = w.count(true)?;
    for _ in 0..nodes {
        w.take(4)?; // node_id
        w.string(true)?; // host
        w.take(4)?; // port
        w.string(true)?; // rack
        w.tagged_fields()?;
    }
    w.tagged_fields()
}

/// A Fetch response through its top-level fields before the topics: size, correlation
/// id, [header tags: v12+], throttle_time_ms, [error_code, session_id: v7+].
pub(super) fn fetch_answer_head(w: &mut Walk<'_>, version: i16) -> Step<()> {
    w.take(4 + 4)?; // size, correlation_id
    if version >= 12 {
        w.tagged_fields()?; // response header v1
    }
    w.take(4)?; // throttle_time_ms
    if version >= 7 {
        w.take(2 + 4)?; // error_code, session_id
    }
    Ok(())
}

/// One partition of a Fetch response: its error code and records (None when null).
/// partition_index, error_code, high_watermark, last_stable_offset, [log_start_offset:
/// v5+], aborted_transactions, [preferred_read_replica: v11+], records, [tags].
pub(super) fn fetch_answer_partition<'a>(w: &mut Walk<'a>, version: i16) -> Step<(i16, Option<&'a [u8]>)> {
    let flexible = version >= 12;
    w.take(4)?; // partition_index
    let error = w.i16()?;
    w.take(8 + 8)?; // high_watermark, last_stable_offset
    if version >= 5 {
        w.take(8)?; // log_start_offset
    }
    // aborted_transactions: a nullable array of (producer_id, first_offset)
    let aborted = if flexible { (w.uvarint()? as usize).saturating_sub(1) } else { usize::try_from(w.i32()?).unwrap_or(0) };
    for _ in 0..aborted {
        w.take(8 + 8)?;
        if flexible {
            w.tagged_fields()?;
        }
    }
    if version >= 11 {
        w.take(4)?; // preferred_read_replica
    }
    let records = w.bytes(flexible)?;
    if flexible {
        w.tagged_fields()?;
    }
    Ok((error, records))
}

/// The topic ids a whole Produce (v13+) or Fetch (v13+) request names that the module
/// knows by name: handed to the Python service with the frame, since the Metadata
/// answer that taught them may have gone to another worker of its pool (each learns
/// ids only from the answers it sees; without this, a consumer's first Fetch on a
/// connection served by another worker got UNKNOWN_TOPIC_ID and backed off 500 ms).
/// At most [`MAX_TOPICS`]; an unreadable frame names none.
pub fn named_ids(api_key: i16, api_version: i16, frame: &[u8]) -> Vec<([u8; 16], Arc<str>)> {
    let mut named = Vec::new();
    if api_key == SHARE_FETCH && readable(api_key, api_version) {
        let mut w = Walk { buf: frame, pos: 0 };
        let mut walk = || -> Step<()> {
            share_fetch_head(&mut w)?;
            known_ids(&mut w, &mut named, share_fetch_partition)
        };
        let _ = walk(); // what was read before a malformed part still names its topics
        return named;
    }
    if api_version < 13 || !readable(api_key, api_version) {
        return named;
    }
    let mut w = Walk { buf: frame, pos: 0 };
    let mut walk = || -> Step<()> {
        w.header(true)?;
        let partition_size = if api_key == PRODUCE {
            w.string(true)?; // transactional_id
            w.take(2 + 4)?; // acks, timeout_ms
            None
        } else {
            if api_version <= 14 {
                w.take(4)?; // replica_id
            }
            w.take(4 + 4 + 4 + 1 + 4 + 4)?; // max_wait_ms .. isolation_level, session id, epoch
            Some(fetch_partition_size(api_version))
        };
        known_ids(&mut w, &mut named, |w| {
            match partition_size {
                Some(size) => {
                    w.take(size)?;
                }
                None => {
                    w.take(4)?; // index
                    w.skip_bytes(true)?; // records
                }
            }
            w.tagged_fields()
        })
    };
    let _ = walk(); // what was read before a malformed part still names its topics
    named
}

/// The topic ids a whole Fetch (v13+) or ShareFetch response names that the module
/// knows by name (as [`named_ids`]): an answer in a fetch or share session carries
/// partitions its request did not name, and the worker that reads it may never have
/// seen them named.
pub fn answer_named_ids(api_key: i16, api_version: i16, frame: &[u8]) -> Vec<([u8; 16], Arc<str>)> {
    let mut named = Vec::new();
    let share = api_key == SHARE_FETCH && SHARE_FETCH_VERSIONS.contains(&api_version);
    let fetch = api_key == FETCH && (13..=*FETCH_VERSIONS.end()).contains(&api_version);
    if !(share || fetch) {
        return named;
    }
    let mut w = Walk { buf: frame, pos: 0 };
    let mut walk = || -> Step<()> {
        if share {
            share_fetch_answer_head(&mut w)?;
            return known_ids(&mut w, &mut named, |w| share_fetch_answer_partition(w).map(|_| ()));
        }
        fetch_answer_head(&mut w, api_version)?;
        known_ids(&mut w, &mut named, |w| fetch_answer_partition(w, api_version).map(|_| ()))
    };
    let _ = walk(); // as named_ids: what was read names its topics
    named
}

/// The topics array of a v13+ (flexible) frame: the ids it names that the module knows
/// go to `named`; `partition` reads one partition entry (its tagged fields included).
fn known_ids<'a>(w: &mut Walk<'a>, named: &mut Vec<([u8; 16], Arc<str>)>,
                 partition: impl Fn(&mut Walk<'a>) -> Step<()>) -> Step<()> {
    let topics = w.count(true)?.min(MAX_TOPICS);
    for _ in 0..topics {
        let id: [u8; 16] = w.take(16)?.try_into().map_err(|_| Stop::HandOff)?;
        if let Some(name) = topic_name(&id) {
            named.push((id, name));
        }
        let partitions = w.count(true)?;
        if partitions > MAX_PARTITIONS {
            return Err(Stop::HandOff);
        }
        for _ in 0..partitions {
            partition(w)?;
        }
        w.tagged_fields()?;
    }
    Ok(())
}

/// Whether a whole Produce request frame has at most [`MAX_TOPICS`] topics and
/// [`MAX_PARTITIONS`] partitions, all within the frame: what must hold before
/// kafka-protocol decodes a client's request (it reserves room for as many entries as a
/// count says: a forged count would be an allocation of gigabytes, an abort no
/// `catch_unwind` stops).
pub fn produce_is_bounded(frame: &[u8], version: i16) -> bool {
    PRODUCE_VERSIONS.contains(&version)
        && matches!(produce_walk(&mut Walk { buf: frame, pos: 0 }, version, |_, _| true, |_| true), Ok(true))
}

/// The most a Fetch request whose answer the service may read asks the broker for
/// (its `max_bytes`). The service reads such an answer whole, within its record-work
/// budget and the hand-off timeout: a consumer of 32 partitions of small JSON records
/// (Java's defaults: 1 MiB a partition, 50 MiB a fetch) was answered 32 MiB at a time,
/// which took longer to mask than the timeout allows, so every fetch failed and the
/// consumer asked for the same offsets for ever. A broker answers at least one batch
/// whatever `max_bytes` says (KIP-74), so a smaller answer is always progress.
pub const HANDOFF_FETCH_MAX_BYTES: i32 = 4 << 20;

/// Lowers a whole Fetch request's `max_bytes` to `cap` in place (the field sits at a
/// fixed place after the header); returns whether it did. A frame too short to hold it,
/// or a version outside those read here, is left as it is.
pub fn cap_fetch_max_bytes(frame: &mut [u8], version: i16, cap: i32) -> bool {
    if !(3..=*FETCH_VERSIONS.end()).contains(&version) {
        return false;
    }
    let mut w = Walk { buf: frame, pos: 0 };
    // replica_id (to v14; then a tagged field), max_wait_ms, min_bytes.
    let skipped = w.header(version >= 12).and_then(|()| w.take(if version <= 14 { 4 } else { 0 } + 4 + 4));
    let at = w.pos;
    if skipped.is_err() {
        return false;
    }
    let Some(field) = frame.get_mut(at..at + 4) else {
        return false;
    };
    let asked = i32::from_be_bytes([field[0], field[1], field[2], field[3]]);
    if asked <= cap {
        return false;
    }
    field.copy_from_slice(&cap.to_be_bytes());
    true
}

/// Whether a whole Fetch request may be decoded by kafka-protocol, which reserves room
/// for each array as its count says: within [`MAX_TOPICS`] topics (and as many
/// forgotten ones) and [`MAX_PARTITIONS`] partitions, every one present.
pub fn fetch_is_bounded(frame: &[u8], version: i16) -> bool {
    FETCH_VERSIONS.contains(&version) && fetch_bounds(&mut Walk { buf: frame, pos: 0 }, version).is_ok()
}

fn fetch_bounds(w: &mut Walk<'_>, version: i16) -> Step<()> {
    let flexible = version >= 12;
    w.header(flexible)?;
    // replica_id (to v14), max_wait_ms, min_bytes, max_bytes, isolation_level, and
    // session_id and session_epoch (v7+).
    w.take(if version <= 14 { 4 } else { 0 } + 13 + if version >= 7 { 8 } else { 0 })?;
    let mut partitions_seen = 0usize;
    let mut topics = |w: &mut Walk<'_>, partition_size: usize, tagged: bool| -> Step<()> {
        let topics = w.count(flexible)?;
        if topics > MAX_TOPICS {
            return Err(Stop::HandOff);
        }
        for _ in 0..topics {
            if version >= 13 { w.take(16)?; } else { w.string(flexible)?; }
            let partitions = w.count(flexible)?;
            partitions_seen += partitions;
            if partitions_seen > MAX_PARTITIONS {
                return Err(Stop::HandOff);
            }
            for _ in 0..partitions {
                w.take(partition_size)?;
                if tagged {
                    w.tagged_fields()?;
                }
            }
            if flexible {
                w.tagged_fields()?;
            }
        }
        Ok(())
    };
    topics(w, fetch_partition_size(version), flexible)?;
    if version >= 7 {
        topics(w, 4, false)?; // forgotten topics: their partitions' indexes
    }
    if version >= 11 {
        w.string(flexible)?; // rack_id
    }
    if flexible {
        w.tagged_fields()?;
    }
    Ok(())
}

/// Walks a Produce request (`version` one of [`PRODUCE_VERSIONS`]) up to its last
/// partition, within [`MAX_TOPICS`] topics and [`MAX_PARTITIONS`] partitions: `head` is
/// given its transactional id and acks, `records` each partition's records (not null);
/// either stops the walk with false. Beyond the bounds: [`Stop::HandOff`]. The request's
/// own tagged fields, when flexible, are left to the caller.
pub(super) fn produce_walk<'a>(w: &mut Walk<'a>, version: i16, head: impl FnOnce(Option<&'a [u8]>, i16) -> bool,
                               mut records: impl FnMut(&'a [u8]) -> bool) -> Step<bool> {
    let flexible = version >= 9;
    w.header(flexible)?;
    let transactional_id = w.string(flexible)?;
    let acks = w.i16()?;
    if !head(transactional_id, acks) {
        return Ok(false);
    }
    w.take(4)?; // timeout_ms
    let topics = w.count(flexible)?;
    if topics > MAX_TOPICS {
        return Err(Stop::HandOff);
    }
    let mut partitions_seen = 0usize;
    for _ in 0..topics {
        if version >= 13 {
            w.take(16)?; // topic id
        } else {
            w.string(flexible)?;
        }
        let partitions = w.count(flexible)?;
        partitions_seen += partitions;
        if partitions_seen > MAX_PARTITIONS {
            return Err(Stop::HandOff);
        }
        for _ in 0..partitions {
            w.take(4)?; // index
            if let Some(bytes) = w.bytes(flexible)? {
                if !records(bytes) {
                    return Ok(false);
                }
            }
            if flexible {
                w.tagged_fields()?;
            }
        }
        if flexible {
            w.tagged_fields()?;
        }
    }
    Ok(true)
}

// -- topic ids ---------------------------------------------------------------------------

fn topic_ids() -> &'static RwLock<HashMap<[u8; 16], Arc<str>>> {
    static IDS: OnceLock<RwLock<HashMap<[u8; 16], Arc<str>>>> = OnceLock::new();
    IDS.get_or_init(Default::default)
}

/// Remembers a topic's id (from a Metadata answer of the broker). An id names one topic
/// for its whole life (a topic created again gets a new id), so an entry never goes
/// stale; when the map is full, new ids are not kept (their requests are handed off).
pub fn learn_topic_id(id: [u8; 16], name: &str) {
    if id == [0; 16] || name.is_empty() {
        return;
    }
    let map = topic_ids();
    if map.read().unwrap_or_else(|e| e.into_inner()).contains_key(&id) {
        return;
    }
    let mut map = map.write().unwrap_or_else(|e| e.into_inner());
    if map.len() < MAX_TOPIC_IDS {
        map.entry(id).or_insert_with(|| Arc::from(name));
    }
}

/// The APIs besides Produce, Fetch and ShareFetch (read field by field above) whose
/// frames carry topic ids clients send or read (a `uuid` TopicId in Kafka 4.1.1's
/// schemas, either way): OffsetCommit and OffsetFetch (v10), CreateTopics, DeleteTopics,
/// ConsumerGroupHeartbeat, ConsumerGroupDescribe, DescribeTopicPartitions,
/// ShareGroupHeartbeat, ShareGroupDescribe, ShareAcknowledge, StreamsGroupDescribe and
/// Describe/Alter/DeleteShareGroupOffsets.
const ID_CARRIERS: [i16; 14] = [8, 9, 19, 20, 68, 69, 75, 76, 77, 79, 89, 90, 91, 92];
/// How much of such a frame is searched for ids (a group description can be large).
const MAX_ID_SCAN: usize = 256 * 1024;

/// The topic ids the module knows by name that a frame of an [`ID_CARRIERS`] API holds,
/// found by looking up every 16-byte window of its first [`MAX_ID_SCAN`] bytes (these
/// APIs are low-rate: heartbeats, commits, admin calls). Handed to the Python service
/// with the frame, as [`named_ids`] for Produce and Fetch: the worker judging a
/// consumer's heartbeat may never have seen the Metadata answer that named its topics
/// (it went to another worker of the pool), and refused it UNKNOWN_TOPIC_ID, which
/// Java's consumer takes as fatal. A random 16 bytes equal to a known id is as likely
/// as guessing a UUID; at most [`MAX_TOPICS`].
pub fn scanned_ids(api_key: i16, frame: &[u8]) -> Vec<([u8; 16], Arc<str>)> {
    let mut named: Vec<([u8; 16], Arc<str>)> = Vec::new();
    if !ID_CARRIERS.contains(&api_key) {
        return named;
    }
    let map = topic_ids().read().unwrap_or_else(|e| e.into_inner());
    if map.is_empty() {
        return named;
    }
    for window in frame[..frame.len().min(MAX_ID_SCAN)].windows(16) {
        let Ok(id) = <[u8; 16]>::try_from(window) else { continue };
        if let Some(name) = map.get(&id) {
            if !named.iter().any(|(known, _)| *known == id) {
                named.push((id, name.clone()));
                if named.len() >= MAX_TOPICS {
                    break;
                }
            }
        }
    }
    named
}

/// The name of a topic id the module has seen in a Metadata answer.
pub fn topic_name(id: &[u8; 16]) -> Option<Arc<str>> {
    topic_ids().read().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
}

#[cfg(test)]
mod tests;
