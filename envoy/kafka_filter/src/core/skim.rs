//! Walk a Fetch v16+ response to its top-level tagged fields without decoding it.
//!
//! KIP-951's `NodeEndpoints` (tag 0) sits after every record of the response. Records
//! are skipped by their length; only fixed-size fields and counts are read, so the cost
//! is per partition, not per byte. Layout (all versions 16-18, flexible):
//!
//! ```text
//! header:  correlation_id int32 | tagged fields
//! body:    throttle_time_ms int32 | error_code int16 | session_id int32
//!          responses: compact array of
//!            topic_id uuid
//!            partitions: compact array of
//!              partition_index int32 | error_code int16 | high_watermark int64
//!              last_stable_offset int64 | log_start_offset int64
//!              aborted_transactions: compact nullable array of
//!                producer_id int64 | first_offset int64 | tagged fields
//!              preferred_read_replica int32
//!              records: compact nullable bytes
//!              tagged fields
//!            tagged fields
//!          tagged fields  <- NodeEndpoints is tag 0
//! ```

use super::wire::{Read, Reader, Short};

pub const NODE_ENDPOINTS_TAG: u64 = 0;

/// Whether a complete Fetch response frame (with its size prefix) of `version` >= 16
/// carries NodeEndpoints; `Err` when the frame does not follow the layout.
pub fn fetch_has_node_endpoints(frame: &[u8]) -> Result<bool, Short> {
    let mut r = Reader::new(frame.get(4..).ok_or(Short)?);
    r.i32()?; // correlation id
    r.tagged_fields(|_| ())?;
    r.skip(4 + 2 + 4)?;
    let topics = r.compact_len()?.unwrap_or(0);
    for _ in 0..topics {
        r.skip(16)?;
        let partitions = r.compact_len()?.unwrap_or(0);
        for _ in 0..partitions {
            skip_partition(&mut r)?;
        }
        r.tagged_fields(|_| ())?;
    }
    let mut found = false;
    r.tagged_fields(|tag| found |= tag == NODE_ENDPOINTS_TAG)?;
    if r.remaining() != 0 {
        return Err(Short); // trailing bytes: not the layout we know
    }
    Ok(found)
}

fn skip_partition(r: &mut Reader<'_>) -> Read<()> {
    r.skip(4 + 2 + 8 + 8 + 8)?;
    let aborted = r.compact_len()?.unwrap_or(0);
    for _ in 0..aborted {
        r.skip(16)?;
        r.tagged_fields(|_| ())?;
    }
    r.skip(4)?;
    r.skip_compact_bytes()?;
    r.tagged_fields(|_| ())
}
