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
//! passes natively. Responses are handed off only when the Python service's reply to
//! their request asked for them (`want_response`).

use serde::Deserialize;

use super::stats::{api_slot, OTHER_API};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterest {
    #[serde(default)]
    version: String,
    #[serde(default)]
    requests: Vec<(i16, i16, i16)>,
    #[serde(default)]
    failure_mode_allow: bool,
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

/// The interest of one rule-set version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interest {
    pub version: String,
    /// Per API slot (see [`api_slot`]), the version ranges handed off.
    ranges: Vec<Vec<(i16, i16)>>,
    pub failure_mode_allow: bool,
    /// `host:port` of the Python service's workers.
    pub endpoints: Vec<String>,
    pub handoff_timeout_ms: u64,
    /// Bytes a connection may have handed off or queued behind hand-offs before the
    /// module stops reading from its client.
    pub max_bytes_per_connection: usize,
    /// The same for every connection of the process; beyond it a hand-off is not made
    /// and fails at once (fail-closed or fail-open).
    pub max_bytes: usize,
}

impl Default for Interest {
    fn default() -> Self {
        Interest {
            version: String::new(),
            ranges: vec![Vec::new(); OTHER_API + 1],
            failure_mode_allow: false,
            endpoints: Vec::new(),
            handoff_timeout_ms: default_timeout_ms(),
            max_bytes_per_connection: default_per_connection(),
            max_bytes: default_max_bytes(),
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
        for (api_key, min, max) in raw.requests {
            if api_key < 0 || min < 0 || min > max {
                return Err(format!("interest: request range [{api_key}, {min}, {max}] is not an API key with min <= max"));
            }
            interest.ranges[api_slot(api_key)].push((min, max));
        }
        if interest.wants_any() && interest.endpoints.is_empty() {
            return Err("interest: requests to hand off but no endpoints to hand them to".into());
        }
        if interest.handoff_timeout_ms == 0 {
            return Err("interest: handoff_timeout_ms must be positive".into());
        }
        Ok(interest)
    }

    /// Whether a request of this API and version goes to the Python service.
    pub fn wants(&self, api_key: i16, api_version: i16) -> bool {
        // Keys above the table's bound share the "other" slot: only exact matches count.
        let slot = api_slot(api_key);
        slot != OTHER_API && self.ranges[slot].iter().any(|&(min, max)| min <= api_version && api_version <= max)
    }

    pub fn wants_any(&self) -> bool {
        self.ranges.iter().any(|r| !r.is_empty())
    }
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
    fn bad_tables_say_what_is_wrong() {
        let err = Interest::parse(serde_json::json!({"requests": [[0, 5, 1]], "endpoints": ["h:1"]})).unwrap_err();
        assert!(err.contains("min <= max"), "{err}");
        let err = Interest::parse(serde_json::json!({"requests": [[0, 0, 1]]})).unwrap_err();
        assert!(err.contains("no endpoints"), "{err}");
        assert!(Interest::parse(serde_json::json!({"request": []})).unwrap_err().contains("unknown field"));
    }
}
