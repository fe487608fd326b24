//! [`HeaderEdits`] as the ordered header operations a host applies one by one, so that every
//! host that edits a header map in place (the Envoy adapters) edits it the same way.

use std::borrow::Cow;

use crate::exchange::{EtagEdit, HeaderEdits, LengthEdit};

/// One change to the response headers (names in lower case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderOp<'a> {
    /// Set the header to this value, replacing any of that name.
    Set(&'a str, Cow<'a, [u8]>),
    /// Add a value beside those already there.
    Append(&'static str, &'static str),
    Remove(&'static str),
}

impl HeaderEdits {
    /// The edits in the order a host applies them: Vary's values come out as the node's, then
    /// `Accept`, then `Accept-Encoding`, then `Available-Dictionary`, added as one field line.
    pub fn operations(&self) -> Vec<HeaderOp<'_>> {
        let mut ops = Vec::new();
        if let Some(content_type) = self.content_type {
            ops.push(HeaderOp::Set("content-type", Cow::Borrowed(content_type.as_bytes())));
        }
        // with Accept, Vary goes first (the body's type changed); otherwise after the framing
        let vary = self.vary().map(|vary| HeaderOp::Append("vary", vary));
        if self.add_vary_accept {
            ops.extend(vary.clone());
        }
        for (name, value) in &self.set {
            ops.push(HeaderOp::Set(name, Cow::Borrowed(value)));
        }
        match self.content_encoding {
            Some(coding) => ops.push(HeaderOp::Set("content-encoding", Cow::Borrowed(coding.token().as_bytes()))),
            None if self.remove_content_encoding => ops.push(HeaderOp::Remove("content-encoding")),
            None => {}
        }
        match self.content_length {
            LengthEdit::Keep => {}
            LengthEdit::Set(length) => ops.push(HeaderOp::Set("content-length", Cow::Owned(length.to_string().into()))),
            LengthEdit::Remove => ops.push(HeaderOp::Remove("content-length")),
        }
        if !self.add_vary_accept {
            ops.extend(vary);
        }
        match &self.etag {
            EtagEdit::Keep => {}
            EtagEdit::Set(etag) => ops.push(HeaderOp::Set("etag", Cow::Borrowed(etag))),
            EtagEdit::Remove => ops.push(HeaderOp::Remove("etag")),
        }
        if self.remove_accept_ranges {
            ops.push(HeaderOp::Remove("accept-ranges"));
        }
        ops
    }

    /// What the edits add to Vary, as one field line.
    pub fn vary(&self) -> Option<&'static str> {
        Some(match (self.add_vary_accept, self.add_vary, self.vary_dictionary) {
            (true, true, true) => "Accept, Accept-Encoding, Available-Dictionary",
            (true, true, false) => "Accept, Accept-Encoding",
            (true, false, true) => "Accept, Available-Dictionary",
            (true, false, false) => "Accept",
            (false, true, true) => "Accept-Encoding, Available-Dictionary",
            (false, true, false) => "Accept-Encoding",
            (false, false, true) => "Available-Dictionary",
            (false, false, false) => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Coding;

    #[test]
    fn a_compressed_transcoded_body_edits_in_order() {
        let edits = HeaderEdits {
            content_encoding: Some(Coding::Gzip),
            content_length: LengthEdit::Set(42),
            content_type: Some("application/octet-stream"),
            add_vary: true,
            add_vary_accept: true,
            vary_dictionary: false,
            set: vec![("X-Rpcedge-Jsonrpc-Id", b"1".to_vec())],
            etag: EtagEdit::Remove,
            remove_accept_ranges: true,
            remove_content_encoding: true,
        };
        assert_eq!(
            edits.operations(),
            [
                HeaderOp::Set("content-type", Cow::Borrowed(&b"application/octet-stream"[..])),
                HeaderOp::Append("vary", "Accept, Accept-Encoding"),
                HeaderOp::Set("X-Rpcedge-Jsonrpc-Id", Cow::Borrowed(&b"1"[..])),
                HeaderOp::Set("content-encoding", Cow::Borrowed(&b"gzip"[..])),
                HeaderOp::Set("content-length", Cow::Owned(b"42".to_vec())),
                HeaderOp::Remove("etag"),
                HeaderOp::Remove("accept-ranges"),
            ]
        );
        assert!(HeaderEdits::default().operations().is_empty());
    }
}
