//! The interest table: which requests the Python service must see, per rule-set
//! version (computed by Python from its filter chain, delivered in the module's config).
//!
//! ```json
//! {"version": "7", "requests": [[0, 0, 32767], [1, 4, 17]], "failure_mode_allow": false,
//!  "endpoints": ["127.0.0.1:5001"], "handoff_timeout_ms": 2000,
//!  "max_bytes_per_connection": 16777216, "max_bytes": 268435456}
//! ```
//!
//! A request whose (api_key, version) is in `requests` is handed off; everything else
//! passes natively. A range may carry a fourth element, a topic selector
//! (`[0, 0, 13, {"exact": ["payments"], "prefix": [], "regex": []}]`, Produce, Fetch and
//! ShareFetch only): a request of that range is handed off only when one of its topics is selected
//! ([`super::topics`]); versions whose topics the module cannot read are handed off
//! whatever their topics. The fifth element, an object, may say `"unvouched"` (a topic
//! selector, [`super::vouch`]), `"who"` (a who-selector, [`super::who`]: only requests
//! it admits are handed off; the topic selector may then be `null`, and any API may
//! have one) and, on a Produce range only safeguards act on, `"safeguards"` (what a
//! request must keep to pass without a hand-off, [`super::safeguard`]). Responses are handed off only when the Python service's
//! reply to their request asked for them (`want_response`). `fail_open` lists ranges
//! (`[api_key, min, max]`) whose failed hand-off forwards the request (and its answer)
//! even when `failure_mode_allow` is false: those only the service's learners (or
//! dry-run rules) want. A Produce range there may carry a topic selector
//! (`[0, 3, 13, {"exact": ["secret"], ...}]`): a request of it fails open unless it names
//! one of those topics (the ones a rule that is no dry run may act on).

use std::sync::Arc;

use serde::Deserialize;

use super::head::PRODUCE;
use super::safeguard::ProduceChecks;
use super::stats::{api_slot, OTHER_API};
use super::topics::{self, SelectorReading, Selection, TopicSelector};
use super::vouch::Vouching;
use super::who::{Requester, WhoSelector};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterest {
    #[serde(default)]
    version: String,
    #[serde(default)]
    requests: Vec<serde_json::Value>,
    #[serde(default)]
    failure_mode_allow: bool,
    #[serde(default)]
    fail_open: Vec<serde_json::Value>,
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default = "default_timeout_ms")]
    handoff_timeout_ms: u64,
    #[serde(default = "default_per_connection")]
    max_bytes_per_connection: usize,
    #[serde(default = "default_max_bytes")]
    max_bytes: usize,
}

fn default_timeout_ms() -> u64 {
    2000
}

fn default_per_connection() -> usize {
    16 << 20
}

fn default_max_bytes() -> usize {
    256 << 20
}

/// Versions min..=max of an API, their topic selector (None: every request), where
/// vouched schema ids apply ([`super::vouch`]; None: nowhere), and who sends the
/// requests handed off ([`super::who`]; None: anyone).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    min: i16,
    max: i16,
    selector: Option<Arc<TopicSelector>>,
    vouching: Option<Arc<Vouching>>,
    who: Option<Arc<WhoSelector>>,
    /// Produce requests that keep these pass ([`super::safeguard`]; None: none does).
    checks: Option<Arc<ProduceChecks>>,
    /// Requests these clauses admit are handed off whatever their topics (rules of the
    /// range that name no topics); `selector` and `who` are then those of the rules that
    /// name topics.
    whole: Option<Arc<WhoSelector>>,
}

/// The interest of one rule-set version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interest {
    pub version: String,
    /// Per API slot (see [`api_slot`]), the version ranges handed off, each with its
    /// topic selector (None: every request of the range).
    ranges: Vec<Vec<Range>>,
    pub failure_mode_allow: bool,
    /// Per API slot, version ranges whose hand-off fails open whatever
    /// `failure_mode_allow` says: only filters that may miss frames want them (the
    /// Python side's learners, rules that are all dry runs), so the service being down
    /// must not refuse them.
    fail_open: Vec<Vec<FailOpen>>,
    /// `host:port` of the Python service's workers.
    pub endpoints: Vec<String>,
    pub handoff_timeout_ms: u64,
    /// Bytes a connection may have handed off or queued behind hand-offs before the
    /// module stops reading from its client.
    pub max_bytes_per_connection: usize,
    /// The same for every connection of the process; beyond it a hand-off is not made
    /// and fails at once (fail-closed or fail-open).
    pub max_bytes: usize,
    /// Selectors this module could not apply (their ranges hand off every frame), for
    /// the log.
    pub warnings: Vec<String>,
}

impl Default for Interest {
    fn default() -> Self {
        Interest {
            version: String::new(),
            ranges: vec![Vec::new(); OTHER_API + 1],
            failure_mode_allow: false,
            fail_open: vec![Vec::new(); OTHER_API + 1],
            endpoints: Vec::new(),
            handoff_timeout_ms: default_timeout_ms(),
            max_bytes_per_connection: default_per_connection(),
            max_bytes: default_max_bytes(),
            warnings: Vec::new(),
        }
    }
}

impl Interest {
    pub fn parse(value: serde_json::Value) -> Result<Interest, String> {
        let raw: RawInterest = serde_json::from_value(value).map_err(|e| format!("interest: {e}"))?;
        let mut interest = Interest {
            version: raw.version,
            failure_mode_allow: raw.failure_mode_allow,
            endpoints: raw.endpoints,
            handoff_timeout_ms: raw.handoff_timeout_ms,
            max_bytes_per_connection: raw.max_bytes_per_connection,
            max_bytes: raw.max_bytes,
            ..Interest::default()
        };
        for entry in raw.requests {
            let ParsedRange { api_key, min, max, topics: selection, unvouched, who, checks, whole } = parse_range(entry)?;
            let (mut selection, mut who) = (selection, who);
            let whole = match whole {
                None => None,
                Some(Ok(whole)) => Some(Arc::new(whole)),
                Some(Err(reason)) => {
                    interest.warnings.push(format!(
                        "interest: request range [{api_key}, {min}, {max}]: whole: {reason}; every request of the range is handed off"));
                    (selection, who) = (None, None);
                    None
                }
            };
            let who = match who {
                None => None,
                Some(Ok(who)) => Some(Arc::new(who)),
                Some(Err(reason)) => {
                    interest.warnings.push(format!(
                        "interest: request range [{api_key}, {min}, {max}]: {reason}; requests of the range are handed off whoever sends them"));
                    None
                }
            };
            let selector = match selection {
                None => None,
                Some(SelectorReading::Topics(selector)) => Some(Arc::new(selector)),
                Some(SelectorReading::Everything(reason)) => {
                    interest.warnings.push(format!(
                        "interest: request range [{api_key}, {min}, {max}]: {reason}; every request of the range is handed off"));
                    None
                }
            };
            let vouching = match (&selector, unvouched) {
                (Some(selector), Some(SelectorReading::Topics(unvouched))) => {
                    Some(Arc::new(Vouching { selector: selector.clone(), unvouched: Arc::new(unvouched) }))
                }
                (_, Some(SelectorReading::Everything(reason))) => {
                    interest.warnings.push(format!(
                        "interest: request range [{api_key}, {min}, {max}]: {reason}; no vouched schema ids there"));
                    None
                }
                _ => None,
            };
            let checks = checks.map(Arc::new);
            interest.ranges[api_slot(api_key)].push(Range { min, max, selector, vouching, who, checks, whole });
        }
        for entry in raw.fail_open {
            let ParsedRange { api_key, min, max, topics, unvouched, who, checks, whole } = parse_range(entry)?;
            if unvouched.is_some() || who.is_some() || checks.is_some() || whole.is_some() {
                return Err(format!("interest: fail_open range [{api_key}, {min}, {max}] takes no options"));
            }
            let unless = match topics {
                None => None,
                // Produce only: its topics are all in the request (a Fetch's answer may
                // carry topics its request does not name).
                Some(_) if api_key != PRODUCE => {
                    return Err(format!("interest: fail_open range [{api_key}, {min}, {max}] takes a topic selector on Produce only"));
                }
                Some(SelectorReading::Topics(selector)) => Some(Arc::new(selector)),
                Some(SelectorReading::Everything(reason)) => {
                    interest.warnings.push(format!(
                        "interest: fail_open range [{api_key}, {min}, {max}]: {reason}; the range fails as the table says"));
                    continue;
                }
            };
            interest.fail_open[api_slot(api_key)].push(FailOpen { min, max, unless });
        }
        if interest.wants_any() && interest.endpoints.is_empty() {
            return Err("interest: requests to hand off but no endpoints to hand them to".into());
        }
        if interest.handoff_timeout_ms == 0 {
            return Err("interest: handoff_timeout_ms must be positive".into());
        }
        Ok(interest)
    }

    /// Whether a request of this API and version may go to the Python service.
    pub fn wants(&self, api_key: i16, api_version: i16) -> bool {
        self.want(api_key, api_version) != Want::No
    }

    /// Which requests of this API and version go to the Python service, whoever sends
    /// them.
    pub fn want(&self, api_key: i16, api_version: i16) -> Want {
        self.want_of(api_key, api_version, None)
    }

    /// Which requests of this API and version from `from` go to the Python service.
    pub fn want_from(&self, api_key: i16, api_version: i16, from: &Requester<'_>) -> Want {
        self.want_of(api_key, api_version, Some(from))
    }

    fn want_of(&self, api_key: i16, api_version: i16, from: Option<&Requester<'_>>) -> Want {
        // Keys above the table's bound share the "other" slot: only exact matches count.
        let slot = api_slot(api_key);
        if slot == OTHER_API {
            return Want::No;
        }
        let mut matching = self.ranges[slot].iter().filter(|r| r.min <= api_version && api_version <= r.max);
        let Some(range) = matching.next() else { return Want::No };
        if matching.next().is_some() {
            return Want::All; // Two ranges for one version (Python makes none): the safe side.
        }
        // A rule naming no topics acts on every request of those it names.
        let whole = range.whole.as_ref().is_some_and(|whole| from.is_none_or(|from| whole.admits(from)));
        if whole {
            return match &range.checks {
                Some(checks) => Want::Checked(None, checks.clone()),
                None => Want::All,
            };
        }
        if let (Some(who), Some(from)) = (&range.who, from) {
            if !who.admits(from) {
                return Want::No; // No rule of the range may act for this connection.
            }
        }
        if let Some(checks) = &range.checks {
            let selector = range.selector.as_ref().filter(|_| topics::readable(api_key, api_version));
            return Want::Checked(selector.cloned(), checks.clone());
        }
        match &range.selector {
            Some(s) if topics::readable(api_key, api_version) => Want::Topics(s.clone(), range.vouching.clone()),
            // No selector, or a version whose topics the module cannot read: every request.
            _ => Want::All,
        }
    }

    /// Whether a failed hand-off of a request of this API and version forwards it.
    pub fn fails_open(&self, api_key: i16, api_version: i16) -> bool {
        self.failure_mode_allow
            || self.fail_open_ranges(api_key, api_version).any(|range| range.unless.is_none())
    }

    /// Whether a failed hand-off of this whole Produce `frame` (from its size prefix)
    /// forwards it: it names no topic of a `fail_open` range's `unless` selector (the
    /// topics a rule that is no dry run may act on).
    pub fn fails_open_for(&self, api_key: i16, api_version: i16, frame: &[u8]) -> bool {
        api_key == PRODUCE
            && topics::readable(api_key, api_version)
            && self.fail_open_ranges(api_key, api_version).any(|range| {
                range.unless.as_ref().is_some_and(|strict| {
                    topics::select(api_key, api_version, frame, frame.len(), strict) == Selection::Pass
                })
            })
    }

    fn fail_open_ranges(&self, api_key: i16, api_version: i16) -> impl Iterator<Item = &FailOpen> {
        let slot = api_slot(api_key);
        let ranges = if slot == OTHER_API { &[][..] } else { &self.fail_open[slot][..] };
        ranges.iter().filter(move |range| range.min <= api_version && api_version <= range.max)
    }

    pub fn wants_any(&self) -> bool {
        self.ranges.iter().any(|r| !r.is_empty())
    }
}

/// Versions whose failed hand-off forwards the request; with `unless`, only a Produce
/// that names none of its topics.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FailOpen {
    min: i16,
    max: i16,
    unless: Option<Arc<TopicSelector>>,
}

/// What the interest table says of a request's API and version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// It passes natively.
    No,
    /// Every such request is handed off.
    All,
    /// Handed off when one of its topics is selected; the rest of the frame's fate may
    /// be decided by vouched schema ids ([`super::vouch`]).
    Topics(Arc<TopicSelector>, Option<Arc<Vouching>>),
    /// Handed off (when one of its topics is selected, with a selector) unless it keeps
    /// every safeguard check ([`super::safeguard`]).
    Checked(Option<Arc<TopicSelector>>, Arc<ProduceChecks>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOptions {
    #[serde(default)]
    unvouched: Option<serde_json::Value>,
    #[serde(default)]
    who: Option<serde_json::Value>,
    #[serde(default)]
    safeguards: Option<serde_json::Value>,
    #[serde(default)]
    whole: Option<serde_json::Value>,
}

struct ParsedRange {
    api_key: i16,
    min: i16,
    max: i16,
    topics: Option<SelectorReading>,
    unvouched: Option<SelectorReading>,
    /// Err: a selector this module cannot apply, with the reason.
    who: Option<Result<WhoSelector, String>>,
    checks: Option<ProduceChecks>,
    /// Err: as `who`.
    whole: Option<Result<WhoSelector, String>>,
}

/// `[api_key, min, max]`, `[api_key, min, max, topics]` or `[api_key, min, max, topics
/// or null, {"unvouched": selector, "who": clauses}]`.
fn parse_range(entry: serde_json::Value) -> Result<ParsedRange, String> {
    let text = entry.to_string();
    let serde_json::Value::Array(mut items) = entry else {
        return Err(format!("interest: request range {text} is not a list"));
    };
    if !(3..=5).contains(&items.len()) {
        return Err(format!(
            "interest: request range {text} is not [api_key, min, max], [api_key, min, max, topics] or [api_key, min, max, topics, vouching]"));
    }
    let options = if items.len() == 5 { items.pop() } else { None };
    let selector = if items.len() == 4 { items.pop() } else { None };
    let number = |v: &serde_json::Value| v.as_i64().and_then(|n| i16::try_from(n).ok());
    let (Some(api_key), Some(min), Some(max)) = (number(&items[0]), number(&items[1]), number(&items[2])) else {
        return Err(format!("interest: request range {text}: api key and versions are int16 numbers"));
    };
    if api_key < 0 || min < 0 || min > max {
        return Err(format!("interest: request range [{api_key}, {min}, {max}] is not an API key with min <= max"));
    }
    let selector = match selector {
        None | Some(serde_json::Value::Null) => None,
        Some(_) if !topics::selects_topics(api_key) => {
            return Err(format!("interest: request range {text}: topic selectors are read for Produce, Fetch and ShareFetch only"));
        }
        Some(value) => Some(TopicSelector::read(value).map_err(|e| format!("interest: request range [{api_key}, {min}, {max}]: {e}"))?),
    };
    let RawOptions { unvouched, who, safeguards, whole } = match options {
        None => RawOptions { unvouched: None, who: None, safeguards: None, whole: None },
        Some(value) => serde_json::from_value(value)
            .map_err(|e| format!("interest: request range [{api_key}, {min}, {max}]: options: {e}"))?,
    };
    let unvouched = unvouched.map(TopicSelector::read).transpose()
        .map_err(|e| format!("interest: request range [{api_key}, {min}, {max}]: unvouched {e}"))?;
    let who = who.map(WhoSelector::read).transpose()
        .map_err(|e| format!("interest: request range [{api_key}, {min}, {max}]: {e}"))?;
    let whole = whole.map(WhoSelector::read).transpose()
        .map_err(|e| format!("interest: request range [{api_key}, {min}, {max}]: whole: {e}"))?;
    let checks = match safeguards {
        None => None,
        Some(_) if api_key != PRODUCE || unvouched.is_some() => {
            return Err(format!("interest: request range {text}: safeguards are read for Produce ranges without vouching only"));
        }
        Some(value) => Some(ProduceChecks::read(value).map_err(|e| format!("interest: request range [{api_key}, {min}, {max}]: {e}"))?),
    };
    Ok(ParsedRange { api_key, min, max, topics: selector, unvouched, who, checks, whole })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_in_a_range_are_wanted() {
        let interest = Interest::parse(serde_json::json!({
            "version": "3", "requests": [[0, 0, 32767], [1, 12, 17]], "endpoints": ["h:1"]})).unwrap();
        assert!(interest.wants(0, 3) && interest.wants(0, 13));
        assert!(interest.wants(1, 12) && !interest.wants(1, 11) && !interest.wants(1, 18));
        assert!(!interest.wants(3, 12));
        assert!(!interest.wants(-1, 0) && !interest.wants(500, 0));
        assert_eq!(interest.handoff_timeout_ms, 2000);
        assert!(!Interest::default().wants_any());
    }

    #[test]
    fn learning_ranges_fail_open_and_the_rest_as_the_table_says() {
        let interest = Interest::parse(serde_json::json!({
            "requests": [[3, 0, 32767], [0, 0, 13]], "fail_open": [[3, 0, 13]], "endpoints": ["h:1"]})).unwrap();
        assert!(interest.fails_open(3, 0) && interest.fails_open(3, 13));
        assert!(!interest.fails_open(3, 14), "a version the service cannot read fails closed");
        assert!(!interest.fails_open(0, 9) && !interest.fails_open(500, 0));
        let open = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13]], "failure_mode_allow": true, "endpoints": ["h:1"]})).unwrap();
        assert!(open.fails_open(0, 9));
        // A Produce range may fail open unless the request names a topic of its selector.
        let unless = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13]], "fail_open": [[0, 0, 13, {"exact": ["t"]}]], "endpoints": ["h:1"]})).unwrap();
        assert!(!unless.fails_open(0, 9), "decided by the request's topics (fails_open_for)");
        let err = Interest::parse(serde_json::json!({
            "requests": [[1, 0, 17]], "fail_open": [[1, 0, 17, {"exact": ["t"]}]], "endpoints": ["h:1"]})).unwrap_err();
        assert!(err.contains("Produce only"), "{err}");
    }

    #[test]
    fn bad_tables_say_what_is_wrong() {
        let err = Interest::parse(serde_json::json!({"requests": [[0, 5, 1]], "endpoints": ["h:1"]})).unwrap_err();
        assert!(err.contains("min <= max"), "{err}");
        let err = Interest::parse(serde_json::json!({"requests": [[0, 0, 1]]})).unwrap_err();
        assert!(err.contains("no endpoints"), "{err}");
        assert!(Interest::parse(serde_json::json!({"request": []})).unwrap_err().contains("unknown field"));
        for (bad, says) in [
            (serde_json::json!([0, 0]), "is not [api_key"),
            (serde_json::json!([0, 0, 1, {}, {}, 5]), "is not [api_key"),
            (serde_json::json!([0, 0, 1, {}, 5]), "options: invalid type"),
            (serde_json::json!([0, 0, 1, {}, {"whom": []}]), "unknown field"),
            (serde_json::json!([3, 0, 1, null, {"who": [{}]}]), "names no principals"),
            (serde_json::json!([0, 0, 1, {}, {"unvouched": {"regex": 5}}]), "unvouched topic selector"),
            (serde_json::json!([0, "0", 1]), "int16"),
            (serde_json::json!([0, 0, 40000]), "int16"),
            (serde_json::json!(7), "not a list"),
            (serde_json::json!([3, 0, 12, {"exact": ["t"]}]), "Produce, Fetch and ShareFetch only"),
            (serde_json::json!([0, 0, 13, {"names": ["a"]}]), "unknown field"),
        ] {
            let err = Interest::parse(serde_json::json!({"requests": [bad], "endpoints": ["h:1"]})).unwrap_err();
            assert!(err.contains(says), "{err} (expected {says:?})");
        }
    }

    #[test]
    fn a_range_with_a_who_selector_hands_off_only_what_its_clauses_admit() {
        use crate::core::identity::Identity;
        use crate::core::who::{ClientId, Peer, Requester};
        let interest = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"exact": ["payments"]}, {"who": [{"listeners": ["127.0.0.1:19092"]}]}],
                         [11, 0, 9, null, {"who": [{"client_addresses": ["10.0.0.0/8"]}]}],
                         [11, 5, 9, null, {"who": [{"listeners": ["127.0.0.1:29092"]}]}],
                         [12, 0, 4, null, {"who": [{"principals": {"regex": ["("]}}]}]],
            "endpoints": ["h:1"]})).unwrap();
        let identity = Identity::default();
        let on = |host: &str, listener: &str| Peer::new(Some(host), Some(listener.to_string()));
        let (ours, other) = (on("10.1.2.3", "127.0.0.1:19092"), on("192.168.1.1", "127.0.0.1:29092"));
        let want = |key, version, peer: &Peer| interest.want_from(key, version, &Requester { identity: &identity, peer, client_id: ClientId::Null });
        assert!(matches!(want(0, 9, &ours), Want::Topics(_, _)), "admitted: its topics decide");
        assert_eq!(want(0, 9, &other), Want::No, "another listener: no rule may act for it");
        assert_eq!(want(11, 3, &ours), Want::All);
        assert_eq!(want(11, 3, &other), Want::No);
        assert_eq!(want(11, 7, &other), Want::All, "two ranges for one version: the safe side");
        assert_eq!(want(12, 1, &other), Want::All, "a pattern the module cannot compile admits everyone");
        assert!(interest.warnings.iter().any(|w| w.contains("whoever sends them")), "{:?}", interest.warnings);
        assert!(matches!(interest.want(0, 9), Want::Topics(_, _)), "whoever sends it");
        let err = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13]], "fail_open": [[3, 0, 13, null, {"who": [{"listeners": ["a:1"]}]}]],
            "endpoints": ["h:1"]})).unwrap_err();
        assert!(err.contains("takes no options"), "{err}");
    }

    #[test]
    fn a_range_with_topics_hands_off_by_topic_where_the_module_reads_them() {
        let interest = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"exact": ["payments"]}], [0, 14, 32767], [1, 0, 32767, {"prefix": ["p"]}],
                         [3, 0, 12]],
            "endpoints": ["h:1"]})).unwrap();
        assert!(matches!(interest.want(0, 9), Want::Topics(s, _) if s.selects(b"payments") && !s.selects(b"orders")));
        assert!(matches!(interest.want(0, 13), Want::Topics(_, _)));
        assert_eq!(interest.want(0, 2), Want::All, "Produce v0-2: the module does not read its topics");
        assert_eq!(interest.want(0, 14), Want::All);
        assert!(matches!(interest.want(1, 4), Want::Topics(_, _)) && matches!(interest.want(1, 18), Want::Topics(_, _)));
        assert_eq!(interest.want(1, 19), Want::All);
        assert_eq!(interest.want(3, 12), Want::All);
        assert_eq!(interest.want(3, 13), Want::No);
        assert!(interest.wants(0, 9) && interest.wants(1, 3) && !interest.wants(2, 0));
        // Overlapping ranges (Python makes none): the one without topics wins.
        let both = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"exact": ["a"]}], [0, 5, 6, {"exact": ["b"]}]], "endpoints": ["h:1"]})).unwrap();
        assert_eq!(both.want(0, 5), Want::All);
        assert!(matches!(both.want(0, 7), Want::Topics(_, _)));
    }

    #[test]
    fn a_fifth_element_says_where_vouched_ids_apply() {
        let interest = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"prefix": ["s."]}, {"unvouched": {"exact": ["s.masked"]}}],
                         [1, 0, 18, {"prefix": ["s."]}, {"unvouched": {"regex": ["(a"]}}]],
            "endpoints": ["h:1"]})).unwrap();
        let Want::Topics(selector, Some(vouching)) = interest.want(0, 9) else { panic!("{:?}", interest.want(0, 9)) };
        assert!(selector.selects(b"s.orders") && vouching.unvouched.selects(b"s.masked") && !vouching.unvouched.selects(b"s.orders"));
        // An unvouched selector the module cannot compile: no vouching (every selected
        // topic is handed off), said in the warnings.
        assert!(matches!(interest.want(1, 9), Want::Topics(_, None)));
        assert!(interest.warnings.iter().any(|w| w.contains("no vouched schema ids")), "{:?}", interest.warnings);
    }

    #[test]
    fn a_pattern_the_module_cannot_compile_hands_off_every_request_of_its_range() {
        // Refusing the table would keep Envoy on the previous one, which may lack the
        // rule: the range is handed off whole instead, and the reason is kept for the log.
        let interest = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"regex": ["(a"]}], [1, 0, 18, {"exact": ["x"]}]],
            "endpoints": ["h:1"]})).unwrap();
        assert_eq!(interest.want(0, 9), Want::All);
        assert!(matches!(interest.want(1, 9), Want::Topics(_, _)));
        assert_eq!(interest.warnings.len(), 1);
        assert!(interest.warnings[0].contains("does not compile") && interest.warnings[0].contains("[0, 0, 13]"),
                "{:?}", interest.warnings);
    }

    #[test]
    fn a_range_only_safeguards_act_on_says_what_its_requests_must_keep() {
        let interest = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"prefix": ["orders."]}, {"safeguards": {"acks_not_zero": true}}],
                         [0, 14, 32767, null, {"safeguards": {"idempotent": true}}]],
            "endpoints": ["h:1"]})).unwrap();
        assert!(matches!(interest.want(0, 9), Want::Checked(Some(s), _) if s.selects(b"orders.1")));
        assert!(matches!(interest.want(0, 2), Want::Checked(None, _)), "topics not read: every request checked");
        assert!(matches!(interest.want(0, 14), Want::Checked(None, _)));
        for (bad, says) in [
            (serde_json::json!([1, 0, 18, null, {"safeguards": {"acks_not_zero": true}}]), "Produce ranges"),
            (serde_json::json!([0, 0, 13, {"exact": ["a"]}, {"unvouched": {"exact": []}, "safeguards": {}}]), "without vouching"),
            (serde_json::json!([0, 0, 13, null, {"safeguards": {"acks": 1}}]), "unknown field"),
        ] {
            let err = Interest::parse(serde_json::json!({"requests": [bad], "endpoints": ["h:1"]})).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn rules_naming_no_topics_hand_off_every_request_of_those_they_name() {
        use crate::core::identity::Identity;
        use crate::core::who::{ClientId, Peer, Requester};
        let interest = Interest::parse(serde_json::json!({
            "requests": [[0, 0, 13, {"prefix": ["payments."]}, {"whole": [{"listeners": ["127.0.0.1:29092"]}]}],
                         [1, 0, 18, {"prefix": ["payments."]}, {"whole": [{"principals": {"regex": ["("]}}]}]],
            "endpoints": ["h:1"]})).unwrap();
        let identity = Identity::default();
        let on = |listener: &str| Peer::new(Some("10.0.0.1"), Some(listener.to_string()));
        let (partner, ours) = (on("127.0.0.1:29092"), on("127.0.0.1:19092"));
        let want = |peer: &Peer| interest.want_from(0, 9, &Requester { identity: &identity, peer, client_id: ClientId::Null });
        assert_eq!(want(&partner), Want::All, "a rule naming the listener and no topics");
        assert!(matches!(want(&ours), Want::Topics(_, _)), "the others: their topics decide");
        assert_eq!(interest.want(0, 9), Want::All, "whoever sends it");
        assert_eq!(interest.want_from(1, 9, &Requester { identity: &identity, peer: &ours, client_id: ClientId::Null }),
                   Want::All, "an unreadable whole: every request");
        assert!(interest.warnings.iter().any(|w| w.contains("whole")), "{:?}", interest.warnings);
    }
}
