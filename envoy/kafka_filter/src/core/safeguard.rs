//! Produce safeguards the module can show a request keeps, so it need not be handed off.
//!
//! A `safeguard` rule refuses Produce requests that break producer hygiene (acks=0, a
//! producer without idempotence or transactions, oversized batches, a codec the policy
//! refuses). The Python chain judges them; but the checks read only the request's head
//! and its 61-byte batch headers, so the module can read them too, and a request that
//! keeps every check of every safeguard of its range passes natively: only the ones
//! that may break one are handed off (the Python chain then refuses them with the
//! API's error, per topic, as it always did). The interest range says so (computed by
//! `ext_proc.filters.rules.safeguard_checks`, present only when safeguards alone may act
//! on the range):
//!
//! ```json
//! [0, 3, 13, null, {"safeguards": {"acks_not_zero": true, "idempotent": true,
//!   "transactional": false, "max_batch_bytes": 1048576,
//!   "compression": [{"refused": [0, 1, 2], "uncompressed_below": 4096}]}}]
//! ```
//!
//! The checks are the union of every safeguard's, applied to every topic of the request
//! (a rule's topics narrow where the Python side applies it: a batch of another topic
//! that breaks a check only costs a hand-off). Whatever the walk cannot read whole (a
//! batch of an older magic, one cut short, an unknown codec, a version the module does
//! not walk) is handed off.

use serde::Deserialize;

use super::topics::{produce_walk, Walk, PRODUCE_VERSIONS};
use super::vouch::{ATTRIBUTES_AT, BATCH_HEADER, BATCH_LENGTH_AT, CODEC_MASK, MAGIC_AT};

/// Where a batch's producer id is (the other offsets are the vouch walk's).
const PRODUCER_ID_AT: usize = 43;
/// baseOffset and batchLength: a batch's bytes are these and its length.
const LOG_OVERHEAD: usize = 12;
/// Kafka's codecs: none, gzip, snappy, lz4, zstd.
const CODECS: u8 = 5;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Compression {
    /// Codec ids a batch must not be written with.
    refused: Vec<u8>,
    /// An uncompressed batch smaller than this (bytes, batch header included) passes.
    #[serde(default)]
    uncompressed_below: usize,
}

impl Compression {
    /// `filter_rules.model.CompressionPolicy.refuses`.
    fn refuses(&self, codec: u8, batch_bytes: usize) -> bool {
        if codec == 0 && batch_bytes < self.uncompressed_below {
            return false;
        }
        self.refused.contains(&codec)
    }
}

/// What a Produce request must show for no safeguard of its range to act on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceChecks {
    /// acks must not be 0.
    #[serde(default)]
    acks_not_zero: bool,
    /// Every batch's producer id must be set (>= 0).
    #[serde(default)]
    idempotent: bool,
    /// The request must carry a transactional id.
    #[serde(default)]
    transactional: bool,
    /// No batch may be larger (bytes, its 12-byte log overhead included).
    #[serde(default)]
    max_batch_bytes: Option<usize>,
    /// Every policy must accept every batch's codec.
    #[serde(default)]
    compression: Vec<Compression>,
}

impl ProduceChecks {
    pub fn read(value: serde_json::Value) -> Result<ProduceChecks, String> {
        let checks: ProduceChecks = serde_json::from_value(value).map_err(|e| format!("safeguards: {e}"))?;
        if let Some(codec) = checks.compression.iter().flat_map(|c| &c.refused).find(|&&c| c >= CODECS) {
            return Err(format!("safeguards: {codec} is not a Kafka compression codec (0-4)"));
        }
        Ok(checks)
    }

    /// Whether a whole Produce request (size prefix included) of `version` keeps every
    /// check: then no safeguard can act on it and it passes natively.
    pub fn passes(&self, frame: &[u8], version: i16) -> bool {
        if !PRODUCE_VERSIONS.contains(&version) {
            return false;
        }
        let mut w = Walk { buf: frame, pos: 0 };
        let kept = produce_walk(&mut w, version,
                                |transactional_id, acks| {
                                    let breaks = (self.transactional && transactional_id.is_none())
                                        || (self.acks_not_zero && acks == 0);
                                    !breaks
                                },
                                |records| self.batches_pass(records));
        let flexible = version >= 9;
        matches!(kept, Ok(true)) && (!flexible || w.tagged_fields().is_ok()) && w.pos == frame.len()
    }

    /// Whether every batch of a partition's records keeps the batch checks; a batch the
    /// walk cannot read whole (magic other than 2, cut short, unknown codec) does not.
    fn batches_pass(&self, records: &[u8]) -> bool {
        let mut pos = 0;
        while pos < records.len() {
            let Some(header) = records.get(pos..pos + BATCH_HEADER) else { return false };
            let length = i32::from_be_bytes([header[BATCH_LENGTH_AT], header[BATCH_LENGTH_AT + 1],
                                             header[BATCH_LENGTH_AT + 2], header[BATCH_LENGTH_AT + 3]]);
            let Ok(length) = usize::try_from(length) else { return false };
            let end = pos + LOG_OVERHEAD + length;
            if header[MAGIC_AT] != 2 || end > records.len() || end < pos + BATCH_HEADER {
                return false;
            }
            let batch_bytes = end - pos;
            if self.max_batch_bytes.is_some_and(|max| batch_bytes > max) {
                return false;
            }
            let attributes = i16::from_be_bytes([header[ATTRIBUTES_AT], header[ATTRIBUTES_AT + 1]]);
            let codec = (attributes & CODEC_MASK) as u8;
            if codec >= CODECS || self.compression.iter().any(|c| c.refuses(codec, batch_bytes)) {
                return false;
            }
            let producer_id = i64::from_be_bytes(header[PRODUCER_ID_AT..PRODUCER_ID_AT + 8].try_into().unwrap_or([0xff; 8]));
            if self.idempotent && producer_id < 0 {
                return false;
            }
            pos = end;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compression_policies_read_as_python_writes_them() {
        let c = ProduceChecks::read(json!({"compression": [{"refused": [0, 1, 2], "uncompressed_below": 100}]})).unwrap();
        assert!(!c.compression[0].refuses(0, 99), "small uncompressed batches pass");
        assert!(c.compression[0].refuses(0, 100) && c.compression[0].refuses(1, 10));
        assert!(!c.compression[0].refuses(3, 10_000) && !c.compression[0].refuses(4, 10_000));
        for (bad, says) in [(json!({"compression": [{"refused": [7]}]}), "not a Kafka compression codec"),
                            (json!({"acks": true}), "unknown field"),
                            (json!({"max_batch_bytes": -1}), "invalid value")] {
            let err = ProduceChecks::read(bad).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
