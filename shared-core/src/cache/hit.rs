//! A hit's reply, as a host sends it instead of asking the node: its body and its headers, made
//! from a stored entry.

use super::Entry;
use crate::negotiate::Coding;

/// A hit to send instead of asking the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitResponse {
    pub body: Vec<u8>,
    /// The body's Content-Encoding; `None`: plain.
    pub coding: Option<Coding>,
    /// Its headers, besides `Content-Length` (the body's length) and the status header, names in
    /// lower case: `content-type`, `content-encoding` when coded, `vary` (what the node's answer
    /// varies on, and Accept-Encoding), then the node's end-to-end headers as it sent them.
    pub headers: Vec<(String, String)>,
}

impl HitResponse {
    /// A hit's status: only a node's 200 is kept.
    pub const STATUS: u16 = 200;
}

/// A hit's headers: its type and encoding, what it varies on (what the entry's answer varied on,
/// then `varies`), and the node's headers that the entry kept.
pub(super) fn hit_headers(entry: &Entry, content_type: &str, coding: Option<Coding>, varies: &[&str]) -> Vec<(String, String)> {
    let mut headers = vec![("content-type".to_string(), content_type.to_string())];
    if let Some(coding) = coding {
        headers.push(("content-encoding".into(), coding.token().into()));
    }
    let varies = entry.vary.iter().map(|(name, _)| *name).chain(varies.iter().copied());
    headers.push(("vary".into(), varies.collect::<Vec<_>>().join(", ")));
    let kept = entry.headers.iter().filter(|(name, _)| *name != "content-type");
    headers.extend(kept.map(|(name, value)| (name.to_string(), value.to_string())));
    headers
}
