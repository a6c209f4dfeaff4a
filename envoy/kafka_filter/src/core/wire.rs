//! Kafka's primitive types, read from a byte slice without copying.
//!
//! `Reader` never panics: running out of bytes is [`Short`], which callers turn into
//! "need more bytes" (while parsing the head of a frame still arriving) or into a
//! protocol violation (inside a complete frame).

/// The slice ended before the value did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short;

pub type Read<T> = Result<T, Short>;

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn take(&mut self, n: usize) -> Read<&'a [u8]> {
        if self.remaining() < n {
            return Err(Short);
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn skip(&mut self, n: usize) -> Read<()> {
        self.take(n).map(|_| ())
    }

    pub fn i16(&mut self) -> Read<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    pub fn i32(&mut self) -> Read<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned varint (at most 5 bytes for a u32); an over-long one is malformed,
    /// which callers see as a value too large for the frame.
    pub fn uvarint(&mut self) -> Read<u64> {
        let mut value: u64 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Ok(u64::MAX)
    }

    /// A length-prefixed (int16) nullable string: skipped.
    pub fn skip_string(&mut self) -> Read<()> {
        let len = self.i16()?;
        if len > 0 {
            self.skip(len as usize)?;
        }
        Ok(())
    }

    /// A compact (uvarint length + 1) nullable string or byte array: skipped.
    pub fn skip_compact_bytes(&mut self) -> Read<()> {
        let len = self.uvarint()?;
        if len > 1 {
            self.skip(usize::try_from(len - 1).map_err(|_| Short)?)?;
        }
        Ok(())
    }

    /// A compact array's element count (None for a null array).
    pub fn compact_len(&mut self) -> Read<Option<usize>> {
        let len = self.uvarint()?;
        if len == 0 {
            return Ok(None);
        }
        Ok(Some(usize::try_from(len - 1).map_err(|_| Short)?))
    }

    /// A tagged-field section: calls `seen(tag)` for each and skips its value.
    pub fn tagged_fields(&mut self, mut seen: impl FnMut(u64)) -> Read<()> {
        let count = self.uvarint()?;
        for _ in 0..count {
            let tag = self.uvarint()?;
            let size = self.uvarint()?;
            seen(tag);
            self.skip(usize::try_from(size).map_err(|_| Short)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_and_varints() {
        let mut r = Reader::new(&[0x01, 0x02, 0x00, 0x00, 0x00, 0x03, 0xac, 0x02]);
        assert_eq!(r.i16(), Ok(0x0102));
        assert_eq!(r.i32(), Ok(3));
        assert_eq!(r.uvarint(), Ok(300));
        assert_eq!(r.i16(), Err(Short));
    }

    #[test]
    fn overlong_varint_is_huge_not_a_panic() {
        let mut r = Reader::new(&[0xff; 8]);
        assert_eq!(r.uvarint(), Ok(u64::MAX));
    }
}
