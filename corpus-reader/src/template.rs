//! A recorded response serialised once into compact bytes, with the spots where the live
//! request's ids go. Serving it only stitches `Bytes` handles together: a 42 MiB body is
//! never copied or re-serialised per request.

use std::ops::Range;

use bytes::{Bytes, BytesMut};

use crate::json::Json;

/// Bodies up to this size are joined into one buffer: a single small write is cheaper than a
/// list of tiny slices.
const JOIN_BELOW: usize = 16 * 1024;

#[derive(Debug)]
pub struct Template {
    /// The compact response with its recorded ids.
    body: Bytes,
    /// Where the tied ids lie in `body`, in order.
    ids: Vec<IdSpan>,
}

/// The `id` value of a response object, to be replaced by the id of the live call at `call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdSpan {
    pub range: Range<usize>,
    pub call: usize,
}

impl Template {
    /// The compact response as recorded, its ids as they were.
    pub fn recorded(&self) -> &[u8] {
        &self.body
    }

    /// Each response object's `id` is tied to a call of the recorded request: for a single
    /// call, that call; for a batch, the next unclaimed call with an equal id (so duplicate ids
    /// pair up in order). A batch response id that no call claims stays as recorded.
    pub fn build(request: &Json, response: &Json) -> Template {
        let mut out = Vec::new();
        let mut ids = Vec::new();
        let mut calls = CallIds::of(request);
        match response {
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_response_object(&mut out, item, &mut calls, &mut ids);
                }
                out.push(b']');
            }
            other => write_response_object(&mut out, other, &mut calls, &mut ids),
        }
        out.shrink_to_fit();
        Template {
            body: Bytes::from(out),
            ids,
        }
    }

    /// A template from its parts, as [`Template::parts`] gave them; `None` if the spans do
    /// not fit the body (a damaged cache).
    pub fn from_parts(body: Bytes, ids: Vec<IdSpan>) -> Option<Template> {
        let mut at = 0;
        for span in &ids {
            if span.range.start < at
                || span.range.end < span.range.start
                || span.range.end > body.len()
            {
                return None;
            }
            at = span.range.end;
        }
        Some(Template { body, ids })
    }

    pub fn parts(&self) -> (&Bytes, &[IdSpan]) {
        (&self.body, &self.ids)
    }

    /// The body as recorded, ids included.
    pub fn recorded_body(&self) -> Vec<Bytes> {
        vec![self.body.clone()]
    }

    /// The body with each tied id replaced by the id of the live call at the same position.
    pub fn live_body(&self, live_ids: &[Bytes]) -> Vec<Bytes> {
        let mut segments = Vec::with_capacity(2 * self.ids.len() + 1);
        let mut at = 0;
        for span in &self.ids {
            if span.range.start > at {
                segments.push(self.body.slice(at..span.range.start));
            }
            segments.push(
                live_ids
                    .get(span.call)
                    .cloned()
                    .unwrap_or_else(|| self.body.slice(span.range.clone())),
            );
            at = span.range.end;
        }
        if self.body.len() > at {
            segments.push(self.body.slice(at..));
        }
        let total: usize = segments.iter().map(Bytes::len).sum();
        if segments.len() > 1 && total <= JOIN_BELOW {
            let mut joined = BytesMut::with_capacity(total);
            for segment in &segments {
                joined.extend_from_slice(segment);
            }
            return vec![joined.freeze()];
        }
        segments
    }
}

/// The ids of the recorded request's calls, for tying response ids to call positions.
enum CallIds<'r, 'a> {
    Single,
    /// Per call its id, or `None` once claimed (or when the call has none).
    Batch(Vec<Option<&'r Json<'a>>>),
}

impl<'r, 'a> CallIds<'r, 'a> {
    fn of(request: &'r Json<'a>) -> Self {
        match request {
            Json::Array(calls) => CallIds::Batch(calls.iter().map(|call| call.get("id")).collect()),
            _ => CallIds::Single,
        }
    }

    fn claim(&mut self, response_id: &Json) -> Option<usize> {
        match self {
            CallIds::Single => Some(0),
            CallIds::Batch(ids) => {
                let call = ids.iter().position(|id| *id == Some(response_id))?;
                ids[call] = None;
                Some(call)
            }
        }
    }
}

/// Writes one response value compactly; if it is an object with an `id`, records where the
/// id's text lies and which call it belongs to.
fn write_response_object(
    out: &mut Vec<u8>,
    value: &Json,
    calls: &mut CallIds,
    ids: &mut Vec<IdSpan>,
) {
    let Json::Object(members) = value else {
        value.write_compact(out);
        return;
    };
    out.push(b'{');
    for (i, (name, member)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        crate::json::write_string(out, name);
        out.push(b':');
        let start = out.len();
        member.write_compact(out);
        if name == "id" {
            if let Some(call) = calls.claim(member) {
                ids.push(IdSpan {
                    range: start..out.len(),
                    call,
                });
            }
        }
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    fn concat(segments: Vec<Bytes>) -> String {
        String::from_utf8(segments.concat()).unwrap()
    }

    #[test]
    fn single_call_id_is_replaced_everywhere_else_kept() {
        let request = parse(r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#).unwrap();
        let response = parse(r#"{ "id": "1", "jsonrpc": "2.0", "result": {"id": 7} }"#).unwrap();
        let template = Template::build(&request, &response);
        assert_eq!(
            concat(template.recorded_body()),
            r#"{"id":"1","jsonrpc":"2.0","result":{"id":7}}"#
        );
        assert_eq!(
            concat(template.live_body(&[Bytes::from_static(b"\"x\"")])),
            r#"{"id":"x","jsonrpc":"2.0","result":{"id":7}}"#
        );
    }

    #[test]
    fn batch_ids_follow_call_positions_and_duplicates_pair_in_order() {
        let request =
            parse(r#"[{"id":1,"method":"a"},{"id":2,"method":"b"},{"id":1,"method":"c"}]"#)
                .unwrap();
        let response = parse(
            r#"[{"id":2,"result":"b"},{"id":1,"result":"a"},{"id":1,"result":"c"},{"id":9}]"#,
        )
        .unwrap();
        let template = Template::build(&request, &response);
        let live = [
            Bytes::from_static(b"10"),
            Bytes::from_static(b"20"),
            Bytes::from_static(b"30"),
        ];
        assert_eq!(
            concat(template.live_body(&live)),
            r#"[{"id":20,"result":"b"},{"id":10,"result":"a"},{"id":30,"result":"c"},{"id":9}]"#
        );
    }

    #[test]
    fn large_bodies_are_not_joined() {
        let big = "f".repeat(2 * JOIN_BELOW);
        let request = parse(r#"{"id":1}"#).unwrap();
        let response_text = format!(r#"{{"id":1,"result":"{big}"}}"#);
        let template = Template::build(&request, &parse(&response_text).unwrap());
        let body = template.live_body(&[Bytes::from_static(b"2")]);
        assert_eq!(body.len(), 3);
        assert_eq!(concat(body), response_text.replacen(":1,", ":2,", 1));
    }
}
