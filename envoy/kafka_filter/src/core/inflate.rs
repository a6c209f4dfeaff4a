//! Decompressing a record batch's records for reading, within a byte budget.
//!
//! Kafka's codecs (the batch attributes' low 3 bits): 1 gzip, 2 snappy (raw, as
//! librdkafka writes it, or xerial's block framing, as the Java producer writes it), 3
//! lz4 (the LZ4 frame format), 4 zstd. Each is read with its well-kept crate through
//! a cap: a payload of a few KiB may expand to gigabytes (a "bomb"), so reading stops
//! one byte past what the budget allows and the batch is not read at all. The work a
//! frame may cause is bounded by the budget the caller passes, gzip (the slowest to
//! decode, ~4x lz4's time per byte) charged [`GZIP_WEIGHT`] times its output.
//!
//! What cannot be read (an unknown codec, a corrupt payload, past the budget) is
//! `None`: the caller hands the frame to the Python service, which decides (and, for a
//! corrupt batch, refuses it as the broker would).

use std::io::Read;

pub const GZIP: i16 = 1;
pub const SNAPPY: i16 = 2;
pub const LZ4: i16 = 3;
pub const ZSTD: i16 = 4;
/// What a byte of gzip output costs of the budget.
pub const GZIP_WEIGHT: usize = 4;

const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER: usize = 16; // magic, version int32, compatible version int32

/// The records of a batch compressed with `codec`, if they fit in `budget` (which is
/// charged for them).
pub fn inflate(codec: i16, payload: &[u8], budget: &mut usize) -> Option<Vec<u8>> {
    let weight = if codec == GZIP { GZIP_WEIGHT } else { 1 };
    let cap = *budget / weight;
    let out = match codec {
        GZIP => read_capped(flate2::read::MultiGzDecoder::new(payload), cap)?,
        SNAPPY if payload.starts_with(XERIAL_MAGIC) => xerial(&payload[XERIAL_HEADER.min(payload.len())..], cap)?,
        SNAPPY => raw_snappy(payload, cap)?,
        LZ4 => read_capped(lz4_flex::frame::FrameDecoder::new(payload), cap)?,
        ZSTD => read_capped(zstd::stream::read::Decoder::with_buffer(payload).ok()?, cap)?,
        _ => return None,
    };
    *budget -= out.len() * weight;
    Some(out)
}

/// Everything `reader` yields, or None past `cap` bytes or on an error.
fn read_capped(reader: impl Read, cap: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    reader.take(cap as u64 + 1).read_to_end(&mut out).ok()?;
    (out.len() <= cap).then_some(out)
}

/// One raw snappy block: its length is declared up front, checked before any work.
fn raw_snappy(block: &[u8], cap: usize) -> Option<Vec<u8>> {
    let len = snap::raw::decompress_len(block).ok()?;
    if len > cap {
        return None;
    }
    snap::raw::Decoder::new().decompress_vec(block).ok()
}

/// xerial's framing: `int32 length + raw snappy block`, repeated.
fn xerial(mut blocks: &[u8], cap: usize) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    while !blocks.is_empty() {
        let len = usize::try_from(i32::from_be_bytes(blocks.get(..4)?.try_into().ok()?)).ok()?;
        let block = blocks.get(4..4usize.checked_add(len)?)?;
        out.extend(raw_snappy(block, cap.checked_sub(out.len())?)?);
        blocks = &blocks[4 + len..];
    }
    Some(out)
}
