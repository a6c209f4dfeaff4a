//! The head of a frame: what must be known before any of its bytes may pass.
//!
//! ```text
//! request  := int32 size | int16 api_key | int16 api_version | int32 correlation_id
//!             | client_id (int16 string) | [tagged fields: header v2] | body
//! response := int32 size | int32 correlation_id | [tagged fields: header v1] | body
//! ```
//!
//! A request's head is its first 12 bytes, except for Produce, whose head reaches its
//! `acks` (acks=0 means the broker sends no response, so no slot is reserved for one).
//! Its client id is read too (who-selectors match it): a head is complete only once the
//! client id has arrived whole, though the head's bytes (`head_len`) stop before it.

use super::wire::{Reader, Short};
use super::ProtocolError;

pub const PRODUCE: i16 = 0;
pub const SIZE_PREFIX: usize = 4;
/// size + api_key + api_version + correlation_id.
pub const REQUEST_FIXED_HEAD: usize = 12;
/// size + correlation_id.
pub const RESPONSE_HEAD: usize = 8;
/// Where a request's client id starts (its int16 length; its bytes two later).
const CLIENT_ID_AT: usize = REQUEST_FIXED_HEAD;

/// A request's client id as its head found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientIdField {
    /// A null client id (length -1).
    Null,
    /// This many bytes, from the frame's byte `CLIENT_ID_AT + 2`.
    Bytes(usize),
    /// Its length runs past the frame: malformed, for the broker to refuse.
    Unreadable,
}

impl ClientIdField {
    /// The client id's bytes in `frame` (the frame from its size prefix, as much of it as
    /// the head was parsed from); None when it is null or unreadable.
    pub fn bytes<'a>(&self, frame: &'a [u8]) -> Option<&'a [u8]> {
        match *self {
            ClientIdField::Bytes(len) => frame.get(CLIENT_ID_AT + 2..CLIENT_ID_AT + 2 + len),
            ClientIdField::Null | ClientIdField::Unreadable => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    /// The frame's length without its size prefix.
    pub size: usize,
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// Produce's acks (None for other APIs).
    pub acks: Option<i16>,
    pub client_id: ClientIdField,
    /// Bytes of the frame (from its size prefix) the head spans.
    pub head_len: usize,
}

impl RequestHead {
    /// Whether the broker answers this request (Produce with acks=0 gets no response).
    pub fn expects_response(&self) -> bool {
        self.acks != Some(0)
    }

    pub fn frame_len(&self) -> usize {
        SIZE_PREFIX + self.size
    }
}

/// What parsing a prefix of a frame found.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<H> {
    Head(H),
    /// At least this many bytes of the frame (from its size prefix) are needed.
    NeedAtLeast(usize),
}

/// The size prefix, checked against `max_frame_size`.
pub fn frame_size(buf: &[u8], min: usize, max_frame_size: usize) -> Result<Option<usize>, ProtocolError> {
    if buf.len() < SIZE_PREFIX {
        return Ok(None);
    }
    let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if size < 0 || (size as usize) < min {
        return Err(ProtocolError::BadFrameSize(size as i64));
    }
    let size = size as usize;
    if size > max_frame_size {
        return Err(ProtocolError::FrameTooLarge { size, max: max_frame_size });
    }
    Ok(Some(size))
}

/// Parses a request head from the first bytes of a frame.
pub fn parse_request_head(buf: &[u8], max_frame_size: usize) -> Result<Parsed<RequestHead>, ProtocolError> {
    let Some(size) = frame_size(buf, REQUEST_FIXED_HEAD - SIZE_PREFIX, max_frame_size)? else {
        return Ok(Parsed::NeedAtLeast(SIZE_PREFIX));
    };
    if buf.len() < REQUEST_FIXED_HEAD {
        return Ok(Parsed::NeedAtLeast(REQUEST_FIXED_HEAD));
    }
    let api_key = i16::from_be_bytes([buf[4], buf[5]]);
    let api_version = i16::from_be_bytes([buf[6], buf[7]]);
    let correlation_id = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
    let frame_end = SIZE_PREFIX + size;
    // Never read past the frame: what runs past it is malformed.
    let visible = &buf[..buf.len().min(frame_end)];
    let mut r = Reader::new(&visible[CLIENT_ID_AT..]);
    let client_id = match client_id_field(&mut r) {
        Ok(field) => field,
        Err(Short) if buf.len() >= frame_end => ClientIdField::Unreadable,
        Err(Short) => return Ok(Parsed::NeedAtLeast(client_id_end(buf).min(frame_end))),
    };
    let mut head = RequestHead { size, api_key, api_version, correlation_id, acks: None, client_id,
                                 head_len: REQUEST_FIXED_HEAD };
    if api_key != PRODUCE {
        return Ok(Parsed::Head(head));
    }
    if client_id == ClientIdField::Unreadable {
        return Err(ProtocolError::Malformed("Produce request ends before its acks"));
    }
    match produce_acks(&mut r, api_version) {
        Ok(acks) => {
            head.acks = Some(acks);
            head.head_len = CLIENT_ID_AT + r.position();
            Ok(Parsed::Head(head))
        }
        Err(Short) if buf.len() >= frame_end => Err(ProtocolError::Malformed("Produce request ends before its acks")),
        Err(Short) => Ok(Parsed::NeedAtLeast((buf.len() + 1).min(frame_end))),
    }
}

/// The client id (a nullable int16 string in every request header keg reads).
fn client_id_field(r: &mut Reader<'_>) -> Result<ClientIdField, Short> {
    let len = r.i16()?;
    if len < 0 {
        return Ok(ClientIdField::Null);
    }
    r.skip(len as usize)?;
    Ok(ClientIdField::Bytes(len as usize))
}

/// Where the client id of a frame starting with `buf` ends (at least its length).
fn client_id_end(buf: &[u8]) -> usize {
    match buf.get(CLIENT_ID_AT..CLIENT_ID_AT + 2) {
        Some(len) => CLIENT_ID_AT + 2 + usize::from(u16::from_be_bytes([len[0], len[1]]) & 0x7fff),
        None => CLIENT_ID_AT + 2,
    }
}

/// The rest of a Produce request's header after its client id, then its body up to `acks`.
fn produce_acks(r: &mut Reader<'_>, version: i16) -> Result<i16, Short> {
    if version >= 9 {
        r.tagged_fields(|_| ())?; // request header v2
    }
    if version >= 9 {
        r.skip_compact_bytes()?; // transactional_id
    } else if version >= 3 {
        r.skip_string()?;
    }
    r.i16()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    pub size: usize,
    pub correlation_id: i32,
}

impl ResponseHead {
    pub fn frame_len(&self) -> usize {
        SIZE_PREFIX + self.size
    }
}

pub fn parse_response_head(buf: &[u8], max_frame_size: usize) -> Result<Parsed<ResponseHead>, ProtocolError> {
    let Some(size) = frame_size(buf, RESPONSE_HEAD - SIZE_PREFIX, max_frame_size)? else {
        return Ok(Parsed::NeedAtLeast(SIZE_PREFIX));
    };
    if buf.len() < RESPONSE_HEAD {
        return Ok(Parsed::NeedAtLeast(RESPONSE_HEAD));
    }
    let correlation_id = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Ok(Parsed::Head(ResponseHead { size, correlation_id }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produce(version: i16, acks: i16) -> Vec<u8> {
        let mut body = vec![];
        body.extend(0i16.to_be_bytes()); // api key
        body.extend(version.to_be_bytes());
        body.extend(7i32.to_be_bytes());
        body.extend(3i16.to_be_bytes());
        body.extend(b"cli");
        if version >= 9 {
            body.push(0); // no tagged fields
            body.push(4); // transactional id "txn"
            body.extend(b"txn");
        } else if version >= 3 {
            body.extend((-1i16).to_be_bytes());
        }
        body.extend(acks.to_be_bytes());
        body.extend([0u8; 8]);
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend(body);
        frame
    }

    #[test]
    fn produce_head_reaches_acks_in_every_header_layout() {
        for version in [0, 2, 3, 8, 9, 12] {
            for acks in [0, 1, -1] {
                let frame = produce(version, acks);
                let Parsed::Head(head) = parse_request_head(&frame, 1 << 20).unwrap() else {
                    panic!("incomplete");
                };
                assert_eq!(head.acks, Some(acks), "v{version}");
                assert_eq!(head.expects_response(), acks != 0);
                // Every strict prefix asks for more, never for less than it has.
                for cut in 0..head.head_len {
                    match parse_request_head(&frame[..cut], 1 << 20).unwrap() {
                        Parsed::NeedAtLeast(n) => assert!(n > cut && n <= frame.len()),
                        Parsed::Head(_) => panic!("head from {cut} of {} bytes", head.head_len),
                    }
                }
            }
        }
    }

    fn request(api_key: i16, client_id: Option<&[u8]>, body: &[u8]) -> Vec<u8> {
        let mut rest = api_key.to_be_bytes().to_vec();
        rest.extend(2i16.to_be_bytes());
        rest.extend(9i32.to_be_bytes());
        match client_id {
            Some(id) => {
                rest.extend((id.len() as i16).to_be_bytes());
                rest.extend(id);
            }
            None => rest.extend((-1i16).to_be_bytes()),
        }
        rest.extend(body);
        let mut frame = (rest.len() as i32).to_be_bytes().to_vec();
        frame.extend(rest);
        frame
    }

    #[test]
    fn a_request_head_is_complete_once_its_client_id_has_arrived() {
        for (client_id, field) in [(Some(&b"billing"[..]), ClientIdField::Bytes(7)), (Some(b""), ClientIdField::Bytes(0)),
                                   (None, ClientIdField::Null)] {
            let frame = request(3, client_id, &[0; 5]);
            let Parsed::Head(head) = parse_request_head(&frame, 1 << 20).unwrap() else { panic!("incomplete") };
            assert_eq!((head.client_id, head.head_len), (field, REQUEST_FIXED_HEAD), "{client_id:?}");
            assert_eq!(head.client_id.bytes(&frame), client_id.filter(|_| field != ClientIdField::Null));
            let end = CLIENT_ID_AT + 2 + client_id.map_or(0, <[u8]>::len);
            for cut in 0..end {
                match parse_request_head(&frame[..cut], 1 << 20).unwrap() {
                    Parsed::NeedAtLeast(n) => assert!(n > cut && n <= end, "{cut}: {n}"),
                    Parsed::Head(_) => panic!("head from {cut} of {end} bytes"),
                }
            }
        }
        // A length past the frame: the head stands (the broker refuses the frame), its
        // client id unreadable; a Produce cannot reach its acks.
        let mut frame = request(3, Some(b"x"), &[]);
        frame[13] = 50;
        let Parsed::Head(head) = parse_request_head(&frame, 1 << 20).unwrap() else { panic!("incomplete") };
        assert_eq!(head.client_id, ClientIdField::Unreadable);
        let mut produce = request(PRODUCE, Some(b"x"), &[]);
        produce[13] = 50;
        assert!(matches!(parse_request_head(&produce, 1 << 20), Err(ProtocolError::Malformed(_))));
    }

    #[test]
    fn sizes_are_bounded() {
        let big = [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(matches!(parse_request_head(&big, 1024), Err(ProtocolError::FrameTooLarge { .. })));
        let negative = [0xff, 0xff, 0xff, 0xff];
        assert!(matches!(parse_response_head(&negative, 1024), Err(ProtocolError::BadFrameSize(-1))));
        let tiny = [0, 0, 0, 3];
        assert!(matches!(parse_request_head(&tiny, 1024), Err(ProtocolError::BadFrameSize(3))));
    }
}
