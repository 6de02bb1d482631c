//! Netlink attribute writing (with back-patched nests) and reading (a checked iterator).

use super::CodecError;
use crate::consts::*;

/// Appends netlink messages to one contiguous buffer. Nested attributes and message lengths are
/// back-patched when closed, so encoding never copies.
#[derive(Debug, Default, Clone)]
pub struct MsgWriter {
    /// The encoded bytes: whole netlink messages once every `begin` has its `end`.
    pub buf: Vec<u8>,
    /// First attribute that overflowed 64 KiB, reported by [`MsgWriter::end_msg`].
    overflow: Option<(u16, usize)>,
}

/// Start of an open message or nest, returned by `begin_*` and passed back to `end_*`.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct Mark(usize);

impl MsgWriter {
    /// An empty writer.
    pub fn new() -> MsgWriter {
        MsgWriter::default()
    }

    /// An empty writer whose buffer holds `n` bytes before it grows.
    pub fn with_capacity(n: usize) -> MsgWriter {
        MsgWriter {
            buf: Vec::with_capacity(n),
            overflow: None,
        }
    }

    /// Opens a message: nlmsghdr + nfgenmsg (`res_id` big-endian, as nfnetlink reads it).
    pub fn begin_msg(&mut self, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Mark {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(NFNETLINK_V0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        Mark(start)
    }

    /// Closes a message: writes its length. Fails if an attribute inside overflowed 64 KiB.
    pub fn end_msg(&mut self, m: Mark) -> Result<(), CodecError> {
        let len = self.buf.len() - m.0;
        self.buf[m.0..m.0 + 4].copy_from_slice(&(len as u32).to_ne_bytes());
        match self.overflow.take() {
            Some((ty, len)) => Err(CodecError::TooLarge {
                what: format!("attribute {ty}"),
                len,
            }),
            None => Ok(()),
        }
    }

    fn pad(&mut self) {
        while self.buf.len() % 4 != 0 {
            self.buf.push(0);
        }
    }

    /// One attribute with raw bytes.
    pub fn put(&mut self, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        if len > NLA_MAX_LEN {
            self.overflow.get_or_insert((ty, len));
        }
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    /// One attribute whose bytes are `parts`, one after the other.
    pub fn put_parts(&mut self, ty: u16, parts: &[&[u8]]) {
        let len = 4 + parts.iter().map(|p| p.len()).sum::<usize>();
        if len > NLA_MAX_LEN {
            self.overflow.get_or_insert((ty, len));
        }
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.pad();
    }

    /// A one-byte attribute (`NLA_U8`).
    pub fn put_u8(&mut self, ty: u16, v: u8) {
        self.put(ty, &[v]);
    }

    /// A 16-bit attribute in network byte order (the kernel reads it with `nla_get_be16`).
    pub fn put_be16(&mut self, ty: u16, v: u16) {
        self.put(ty, &v.to_be_bytes());
    }

    /// A 32-bit attribute in network byte order (`nla_get_be32`): nf_tables' flags,
    /// registers, offsets and lengths.
    pub fn put_be32(&mut self, ty: u16, v: u32) {
        self.put(ty, &v.to_be_bytes());
    }

    /// A 64-bit attribute in network byte order (`nla_get_be64`): handles, counters, rates.
    pub fn put_be64(&mut self, ty: u16, v: u64) {
        self.put(ty, &v.to_be_bytes());
    }

    /// A NUL-terminated string attribute (`NLA_STRING` / `NLA_NUL_STRING`).
    pub fn put_str(&mut self, ty: u16, s: &str) {
        let len = 4 + s.len() + 1;
        if len > NLA_MAX_LEN {
            self.overflow.get_or_insert((ty, len));
        }
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    /// Opens a nested attribute (`NLA_F_NESTED` set, as libnftnl does).
    pub fn begin_nest(&mut self, ty: u16) -> Mark {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        Mark(start)
    }

    /// Closes a nested attribute opened by [`MsgWriter::begin_nest`]: writes its length. One
    /// over 64 KiB is remembered and reported by [`MsgWriter::end_msg`].
    pub fn end_nest(&mut self, m: Mark) {
        let len = self.buf.len() - m.0;
        if len > NLA_MAX_LEN {
            let ty = u16::from_ne_bytes([self.buf[m.0 + 2], self.buf[m.0 + 3]]) & NLA_TYPE_MASK;
            self.overflow.get_or_insert((ty, len));
        }
        self.buf[m.0..m.0 + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    }

    /// `ty { NFTA_DATA_VALUE { bytes } }`: a register value.
    pub fn put_data_value(&mut self, ty: u16, data: &[u8]) {
        let n = self.begin_nest(ty);
        self.put(NFTA_DATA_VALUE, data);
        self.end_nest(n);
    }
}

/// One attribute: its type (flags masked off) and value.
#[derive(Debug, Clone, Copy)]
pub struct Attr<'a> {
    /// Attribute type (`nla_type` without `NLA_F_NESTED` / `NLA_F_NET_BYTEORDER`).
    pub ty: u16,
    /// The payload, without header or padding.
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    fn fixed<const N: usize>(&self, what: &'static str) -> Result<[u8; N], CodecError> {
        self.data.try_into().map_err(|_| CodecError::BadLength {
            what,
            attr: self.ty,
            len: self.data.len(),
        })
    }

    /// The value of a one-byte attribute; `what` names the object in a length error.
    pub fn u8(&self, what: &'static str) -> Result<u8, CodecError> {
        Ok(self.fixed::<1>(what)?[0])
    }

    /// The value of a 16-bit big-endian attribute.
    pub fn be16(&self, what: &'static str) -> Result<u16, CodecError> {
        Ok(u16::from_be_bytes(self.fixed(what)?))
    }

    /// The value of a 32-bit big-endian attribute.
    pub fn be32(&self, what: &'static str) -> Result<u32, CodecError> {
        Ok(u32::from_be_bytes(self.fixed(what)?))
    }

    /// The value of a 64-bit big-endian attribute.
    pub fn be64(&self, what: &'static str) -> Result<u64, CodecError> {
        Ok(u64::from_be_bytes(self.fixed(what)?))
    }

    /// A string attribute; the trailing NUL (and anything after it) is dropped.
    pub fn str(&self, what: &'static str) -> Result<String, CodecError> {
        self.str_ref(what).map(str::to_owned)
    }

    /// [`Attr::str`], borrowed from the message (no allocation: dumps compare names in place).
    pub fn str_ref(&self, what: &'static str) -> Result<&'a str, CodecError> {
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.data.len());
        std::str::from_utf8(&self.data[..end]).map_err(|_| CodecError::Utf8 {
            what,
            attr: self.ty,
        })
    }

    /// The attributes nested in this one.
    pub fn nested(&self) -> Attrs<'a> {
        Attrs::new(self.data)
    }

    /// The bytes inside `{ NFTA_DATA_VALUE { .. } }`.
    pub fn data_value(&self, what: &'static str) -> Result<Vec<u8>, CodecError> {
        self.data_value_ref(what).map(<[u8]>::to_vec)
    }

    /// [`Attr::data_value`], borrowed from the message.
    pub fn data_value_ref(&self, what: &'static str) -> Result<&'a [u8], CodecError> {
        for a in self.nested() {
            let a = a?;
            if a.ty == NFTA_DATA_VALUE {
                return Ok(a.data);
            }
        }
        Err(CodecError::Missing {
            what,
            attr: NFTA_DATA_VALUE,
        })
    }
}

/// Iterator over the attributes of a buffer; yields an error (once) on a malformed header.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    data: &'a [u8],
}

impl<'a> Attrs<'a> {
    /// The attributes of `data`: a message's payload after its family header, or a nest's.
    pub fn new(data: &'a [u8]) -> Attrs<'a> {
        Attrs { data }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.data[0], self.data[1]]) as usize;
        let ty = u16::from_ne_bytes([self.data[2], self.data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.data.len() {
            self.data = &[];
            return Some(Err(CodecError::Truncated { what: "attribute" }));
        }
        let attr = Attr {
            ty,
            data: &self.data[4..len],
        };
        let next = (len + 3) & !3;
        self.data = &self.data[next.min(self.data.len())..];
        Some(Ok(attr))
    }
}
