//! JSON-RPC request matching: the key a request is looked up by, the ids a live request
//! carries, and the error answers for requests without a recording.

use bytes::Bytes;

use crate::json::{self, Json};

/// What identifies a request among the recordings: method and canonical params of each call,
/// ignoring `id` and `jsonrpc`. Absent params count as `[]` (clients differ in sending them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestKey(Vec<u8>);

impl RequestKey {
    pub fn of(request: &Json) -> RequestKey {
        // The leading byte keeps a single call apart from a batch that happens to look like it.
        let mut key = Vec::with_capacity(64);
        match request {
            Json::Array(calls) => {
                key.extend_from_slice(b"B[");
                for (i, call) in calls.iter().enumerate() {
                    if i > 0 {
                        key.push(b',');
                    }
                    write_call_key(&mut key, call);
                }
                key.push(b']');
            }
            call => {
                key.push(b'S');
                write_call_key(&mut key, call);
            }
        }
        RequestKey(key)
    }

    /// A key as [`RequestKey::as_bytes`] gave it (the on-disk cache).
    pub fn from_bytes(bytes: Vec<u8>) -> RequestKey {
        RequestKey(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

fn write_call_key(key: &mut Vec<u8>, call: &Json) {
    match call {
        Json::Object(_) => {
            key.push(b'[');
            call.get("method")
                .unwrap_or(&Json::Null)
                .write_canonical(key);
            key.push(b',');
            match call.get("params") {
                Some(params) => params.write_canonical(key),
                None => key.extend_from_slice(b"[]"),
            }
            key.push(b']');
        }
        // Not a call at all (recorded invalid-request tests): the value itself, tagged.
        other => {
            key.extend_from_slice(b"{\"not-a-call\":");
            other.write_canonical(key);
            key.push(b'}');
        }
    }
}

/// The compact id of each call of a live request, in order (`null` where a call has none);
/// a single call gives one.
pub fn live_ids(request: &Json) -> Vec<Bytes> {
    match request {
        Json::Array(calls) => calls.iter().map(id_text).collect(),
        call => vec![id_text(call)],
    }
}

fn id_text(call: &Json) -> Bytes {
    match call.get("id") {
        Some(id) => Bytes::from(id.to_compact()),
        None => Bytes::from_static(b"null"),
    }
}

const METHOD_NOT_FOUND: i32 = -32601;
const INVALID_REQUEST: i32 = -32600;
const PARSE_ERROR: i32 = -32700;

/// The answer to a request that is not a batch (batches: [`batch_answer`]) and that no recording
/// matches: a JSON-RPC error with the call's id, or an invalid-request error for what is no call.
pub fn no_recording_answer(request: &Json) -> Vec<u8> {
    no_recording(request, "")
}

/// The answer to a batch that was not recorded whole, as a node gives it: one answer per call, in
/// the calls' order. `answer_call` gives a call's own answer (with its id), if it has one; a call
/// without gets a "no recording" error, a member that is not a call an invalid-request error, and
/// a notification (a call without an `id` member) nothing. A batch of notifications alone is
/// answered with no body at all (JSON-RPC 2.0: never an empty array).
pub fn batch_answer(
    calls: &[Json],
    mut answer_call: impl FnMut(&Json) -> Option<Vec<Bytes>>,
) -> Vec<Bytes> {
    let in_batch = format!(" (in a batch of {})", calls.len());
    let mut segments = Vec::with_capacity(2 * calls.len() + 1);
    for call in calls {
        let answer = match call {
            Json::Object(_) if call.get("id").is_none() => continue,
            Json::Object(_) => answer_call(call),
            _ => None,
        };
        segments.push(Bytes::from_static(if segments.is_empty() {
            b"["
        } else {
            b","
        }));
        segments.extend(answer.unwrap_or_else(|| vec![Bytes::from(no_recording(call, &in_batch))]));
    }
    if !segments.is_empty() {
        segments.push(Bytes::from_static(b"]"));
    }
    segments
}

fn no_recording(request: &Json, suffix: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    match request {
        Json::Object(_) => write_no_recording(&mut out, request, suffix),
        _ => write_error(
            &mut out,
            b"null",
            INVALID_REQUEST,
            "rpcedge-replay: invalid request",
        ),
    }
    out
}

pub fn parse_error_answer(error: &json::ParseError) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_error(
        &mut out,
        b"null",
        PARSE_ERROR,
        &format!("rpcedge-replay: parse error: {error}"),
    );
    out
}

fn write_no_recording(out: &mut Vec<u8>, call: &Json, suffix: &str) {
    let method = match call.get("method") {
        Some(Json::String(name)) => name.to_string(),
        Some(other) => String::from_utf8_lossy(&other.to_compact()).into_owned(),
        None => "(no method)".to_string(),
    };
    let message = format!("rpcedge-replay: no recording for {method}{suffix}");
    write_error(out, &id_text(call), METHOD_NOT_FOUND, &message);
}

fn write_error(out: &mut Vec<u8>, id: &[u8], code: i32, message: &str) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id);
    out.extend_from_slice(format!(",\"error\":{{\"code\":{code},\"message\":").as_bytes());
    json::write_string(out, message);
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> RequestKey {
        RequestKey::of(&json::parse(text).unwrap())
    }

    #[test]
    fn key_ignores_id_jsonrpc_and_member_order() {
        assert_eq!(
            key(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[{"b":1,"a":2}]}"#),
            key(r#"{"params":[{"a":2,"b":1}],"method":"m","id":"x"}"#)
        );
        assert_eq!(
            key(r#"{"method":"m"}"#),
            key(r#"{"method":"m","params":[]}"#)
        );
        assert_ne!(
            key(r#"{"method":"m","params":[1]}"#),
            key(r#"[{"method":"m","params":[1]}]"#)
        );
    }

    fn batch(text: &str, known: &[(&str, &str)]) -> String {
        let Json::Array(calls) = json::parse(text).unwrap() else {
            panic!("not a batch")
        };
        let answer = batch_answer(&calls, |call| {
            let method = call.get("method")?.as_str()?;
            let (_, result) = known.iter().find(|(name, _)| *name == method)?;
            let id = call.get("id").unwrap().to_compact();
            Some(vec![Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#,
                String::from_utf8(id).unwrap()
            ))])
        });
        String::from_utf8(answer.concat()).unwrap()
    }

    #[test]
    fn a_batch_is_answered_call_by_call_in_order() {
        assert_eq!(
            batch(
                r#"[{"id":"a","method":"b"},{"id":7,"method":"x"},{"id":null,"method":"a"},{"method":"a"},3]"#,
                &[("a", "1"), ("b", "2")]
            ),
            concat!(
                r#"[{"jsonrpc":"2.0","id":"a","result":2},"#,
                r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"rpcedge-replay: no recording for x (in a batch of 5)"}},"#,
                r#"{"jsonrpc":"2.0","id":null,"result":1},"#,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"rpcedge-replay: invalid request"}}]"#
            )
        );
        // notifications alone: no answer at all
        assert_eq!(
            batch(
                r#"[{"method":"a"},{"method":"b","params":[]}]"#,
                &[("a", "1")]
            ),
            ""
        );
    }

    #[test]
    fn unknown_method_error_carries_the_id() {
        let request = json::parse(r#"{"jsonrpc":"2.0","id":"a\"b","method":"nope"}"#).unwrap();
        assert_eq!(
            String::from_utf8(no_recording_answer(&request)).unwrap(),
            r#"{"jsonrpc":"2.0","id":"a\"b","error":{"code":-32601,"message":"rpcedge-replay: no recording for nope"}}"#
        );
    }
}
