//! [`HeaderEdits`] as the ordered header operations a host applies one by one: the one protocol
//! by which every host (nginx, Lua and both Envoy adapters) edits a response's head.

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

/// How the host writes `Vary: Accept-Encoding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodingVary {
    /// In the one Vary field line the edits add.
    InLine,
    /// In a Vary operation of its own, which a host with its own way to say it may take that way:
    /// nginx's `gzip_vary` writes it once for every module that varies by it.
    OwnLine,
}

impl HeaderEdits {
    /// The edits in the order a host applies them: Vary's values come out as the node's, then
    /// `Accept`, then `Accept-Encoding`, then `Available-Dictionary`, added as one field line
    /// (`Accept-Encoding` apart from the others where `encoding_vary` says so).
    pub fn operations(&self, encoding_vary: EncodingVary) -> Vec<HeaderOp<'_>> {
        let mut ops = Vec::new();
        if let Some(content_type) = self.content_type {
            ops.push(HeaderOp::Set("content-type", Cow::Borrowed(content_type.as_bytes())));
        }
        // with Accept, Vary goes first (the body's type changed); otherwise after the framing
        let own_line = encoding_vary == EncodingVary::OwnLine && self.add_vary;
        let vary = [self.vary(self.add_vary && !own_line), own_line.then_some("Accept-Encoding")];
        let vary = vary.into_iter().flatten().map(|vary| HeaderOp::Append("vary", vary));
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

    /// What the edits add to Vary, as one field line; `encoding`: `Accept-Encoding` among it.
    fn vary(&self, encoding: bool) -> Option<&'static str> {
        Some(match (self.add_vary_accept, encoding, self.vary_dictionary) {
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
            edits.operations(EncodingVary::InLine),
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
        assert!(HeaderEdits::default().operations(EncodingVary::InLine).is_empty());
        assert!(HeaderEdits::default().operations(EncodingVary::OwnLine).is_empty());
    }

    #[test]
    fn a_host_that_varies_by_encoding_its_own_way_gets_accept_encoding_in_an_operation_of_its_own() {
        let vary = |edits: &HeaderEdits, encoding_vary| {
            let ops = edits.operations(encoding_vary).into_iter();
            ops.filter_map(|op| if let HeaderOp::Append("vary", vary) = op { Some(vary) } else { None }).collect::<Vec<_>>()
        };
        let dcz = HeaderEdits { add_vary: true, add_vary_accept: true, vary_dictionary: true, ..HeaderEdits::default() };
        assert_eq!(vary(&dcz, EncodingVary::InLine), ["Accept, Accept-Encoding, Available-Dictionary"]);
        assert_eq!(vary(&dcz, EncodingVary::OwnLine), ["Accept, Available-Dictionary", "Accept-Encoding"]);
        let encoding = HeaderEdits { add_vary: true, ..HeaderEdits::default() };
        assert_eq!(vary(&encoding, EncodingVary::OwnLine), ["Accept-Encoding"]);
        let accept = HeaderEdits { add_vary_accept: true, ..HeaderEdits::default() };
        assert_eq!(vary(&accept, EncodingVary::OwnLine), ["Accept"]);
    }
}
