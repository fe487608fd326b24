//! A JSON-RPC batch through the cache (JSON-RPC 2.0, section 6): the calls the store holds are
//! answered from it, the rest go to the node as a smaller batch, and the node's answers are put
//! back in the client's order, each stored as if it had come alone.
//!
//! A batch is split only where every answer can be told apart by its id: each member is a call
//! read strictly (as a single call is: `call.rs`), and no two calls share an id. Notifications
//! (calls without an id) go to the node, which answers them with nothing.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Value;

use super::call::Call;
use super::entry::{GzipSplice, MinLengths};
use super::head::Head;
use super::hot::HotTier;
use super::{
    protocol, request_of, Bypass, CacheSettings, Capture, Entry, JsonRpcResponse, Key, Refusal, Request,
};
use crate::compress::{auto_level, compress_whole};
use crate::negotiate::Coding;

/// A batch the cache splits.
#[derive(Debug)]
pub(super) struct Batch {
    /// The batch's members, in the client's order.
    members: Vec<Member>,
    /// The distinct keys of the calls the store may answer, and what was found under each.
    slots: Vec<Slot>,
    /// The slots of the lookup under way.
    asking: Vec<usize>,
}

#[derive(Debug)]
struct Member {
    /// The member's JSON text, as the client sent it.
    text: String,
    /// Its id's canonical JSON text (`None`: a notification, which has no answer).
    id: Option<String>,
    /// The call as the store answers it, and the slot of its key.
    request: Option<(Request, usize)>,
    /// Its answer from the store: `{"jsonrpc":"2.0","id":<its id>,"result":...}`.
    answer: Option<Vec<u8>>,
}

#[derive(Debug)]
struct Slot {
    key: Key,
    found: Found,
}

#[derive(Debug)]
enum Found {
    /// Not looked up yet.
    Pending,
    /// An entry, the seconds it has left (from the daemon; `None` from the hot tier, or no
    /// expiry), and whether the hot tier is still to keep it.
    Entry {
        entry: Vec<u8>,
        ttl_s: Option<u64>,
        keep_hot: bool,
    },
    Missed,
}

/// The daemon failed, or a stored value was not an entry: the request's status is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Failed;

impl Batch {
    /// Whether `body` is a batch: a JSON array.
    pub fn is_batch(body: &[u8]) -> bool {
        body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
    }

    /// The batch `body` in `namespace`, or why it goes to the node whole.
    pub fn read(namespace: &str, body: &[u8], settings: &CacheSettings) -> Result<Batch, Bypass> {
        if body.len() > settings.max_request {
            return Err(Bypass::TooLarge);
        }
        let texts: Vec<&RawValue> = serde_json::from_slice(body).map_err(|_| Bypass::Malformed)?;
        if texts.is_empty() {
            return Err(Bypass::Malformed);
        }
        if texts.len() > settings.max_batch.min(protocol::MAX_LOOKUP_KEYS) {
            return Err(Bypass::Batch);
        }
        let mut ids = HashMap::new();
        let (mut members, mut slots) = (Vec::with_capacity(texts.len()), Vec::<Slot>::new());
        for text in texts {
            let call = Call::read_members(text.get().as_bytes()).map_err(Bypass::unread)?;
            let id = match call.id {
                Some(id) => Some(canonical_id(id).ok_or(Bypass::Malformed)?),
                None => None,
            };
            if let Some(id) = &id {
                if ids.insert(id.clone(), ()).is_some() {
                    return Err(Bypass::Batch);
                }
            }
            let request =
                id.as_ref().filter(|_| call.reads_alike()).and_then(|_| request_of(namespace, &call, settings).ok());
            let request = request.map(|request| {
                let slot = slots.iter().position(|slot| slot.key == request.key).unwrap_or_else(|| {
                    slots.push(Slot { key: request.key, found: Found::Pending });
                    slots.len() - 1
                });
                (request, slot)
            });
            members.push(Member { text: text.get().to_string(), id, request, answer: None });
        }
        if slots.is_empty() {
            return Err(Bypass::Batch);
        }
        Ok(Batch { members, slots, asking: Vec::new() })
    }

    /// Copies out of the hot tier the entries it holds for this batch's keys: whether it held any.
    pub fn find_hot(&mut self, hot: &HotTier, now_s: u64) -> bool {
        let mut found = false;
        for slot in self.slots.iter_mut().filter(|slot| matches!(slot.found, Found::Pending)) {
            if let Some(entry) = hot.find(&slot.key, now_s) {
                slot.found = Found::Entry { entry: entry.to_vec(), ttl_s: None, keep_hot: false };
                found = true;
            }
        }
        found
    }

    /// The body of the multi-key lookup of the keys not yet looked up (none the hot tier
    /// holds). `None`: every key has been.
    pub fn next_lookup(&mut self) -> Option<Vec<u8>> {
        self.asking = (0..self.slots.len()).filter(|&at| matches!(self.slots[at].found, Found::Pending)).collect();
        if self.asking.is_empty() {
            return None;
        }
        let keys: Vec<String> = self.asking.iter().map(|&at| self.slots[at].key.hex()).collect();
        Some(keys.join("\n").into_bytes())
    }

    /// The daemon's answer to the lookup under way.
    pub fn answered(&mut self, status: u16, body: &[u8]) -> Result<(), Failed> {
        let asking = std::mem::take(&mut self.asking);
        let found = Some(body).filter(|_| status == 200).and_then(protocol::Looked::decode_all);
        let Some(found) = found.filter(|found| found.len() == asking.len()) else {
            self.missed(&asking);
            return Err(Failed);
        };
        let mut looked = Ok(());
        for (at, found) in asking.into_iter().zip(found) {
            self.slots[at].found = match found {
                protocol::Looked::Hit(entry, ttl_s) => Found::Entry { entry: entry.to_vec(), ttl_s, keep_hot: true },
                protocol::Looked::Absent | protocol::Looked::Expired => Found::Missed,
                protocol::Looked::Bad => {
                    looked = Err(Failed);
                    Found::Missed
                }
            };
        }
        looked
    }

    /// The lookup under way failed (no answer in time, no daemon): its keys missed.
    pub fn failed(&mut self) {
        let asking = std::mem::take(&mut self.asking);
        self.missed(&asking);
    }

    fn missed(&mut self, slots: &[usize]) {
        for &at in slots {
            self.slots[at].found = Found::Missed;
        }
    }

    /// Keeps the daemon's entries in the hot tier, each for the seconds it has left (at most the
    /// tier's own bound).
    pub fn keep_hot(&mut self, hot: &mut HotTier, now_s: u64) {
        for slot in &mut self.slots {
            if let Found::Entry { entry, ttl_s, keep_hot: keep_hot @ true } = &mut slot.found {
                hot.keep(&slot.key, entry, now_s, ttl_s.unwrap_or(super::HOT_MAX_AGE_S));
                *keep_hot = false;
            }
        }
    }

    /// Answers the calls whose entries were found, for a client with these request headers. The
    /// whole batch's answer when every call has one (`gzip`: compressed where that pays, spliced
    /// from the entries' streams where each is continuable); `Err` when a found value was not an
    /// entry.
    pub fn answer(
        &mut self,
        request_headers: &[(Vec<u8>, Vec<u8>)],
        gzip: bool,
        min_length: u64,
    ) -> Result<Option<BatchHit>, Failed> {
        let (members, slots) = (&mut self.members, &self.slots);
        let mut found = Vec::with_capacity(members.len());
        for member in members.iter() {
            let entry = match (&member.answer, &member.request) {
                (None, Some((request, at))) => match &slots[*at].found {
                    Found::Entry { entry, .. } => match Entry::decode(entry) {
                        Ok(entry) if Head::is_for(&entry.vary, request_headers) => Some((entry, request.id.clone())),
                        // an answer for other values of the headers it varies on: the node answers
                        Ok(_) => None,
                        Err(_) => return Err(Failed),
                    },
                    _ => None,
                },
                _ => None,
            };
            found.push(entry);
        }
        let spliced = (gzip && found.iter().all(Option::is_some))
            .then(|| spliced_gzip(found.iter().flatten(), min_length))
            .flatten();
        if spliced.is_none() {
            for (member, found) in members.iter_mut().zip(&found) {
                if let Some((entry, id)) = found {
                    member.answer = Some(entry.respond(id, &[], MinLengths::NONE).map_err(|_| Failed)?.body);
                }
            }
            if members.iter().any(|member| member.answer.is_none()) {
                return Ok(None);
            }
        }
        Ok(Some(self.whole_hit(gzip, min_length, spliced)))
    }

    /// Every call answered from the store: the client's array (`spliced`: in gzip already), and
    /// its headers.
    fn whole_hit(&self, gzip: bool, min_length: u64, spliced: Option<Vec<u8>>) -> BatchHit {
        let mut vary: Vec<&str> = Vec::new();
        let mut shared: Option<Vec<(&str, &str)>> = None;
        for slot in &self.slots {
            let Found::Entry { entry, .. } = &slot.found else { continue };
            let Ok(entry) = Entry::decode(entry) else { continue };
            for (name, _) in &entry.vary {
                if !vary.contains(name) {
                    vary.push(name);
                }
            }
            // the node's headers every entry kept, and those only: none speaks for the others
            let headers = entry.headers.iter().filter(|(name, _)| *name != "content-type");
            shared = Some(match shared {
                None => headers.copied().collect(),
                Some(kept) => kept.into_iter().filter(|header| entry.headers.contains(header)).collect(),
            });
        }
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        let (body, compressed) = match spliced {
            Some(spliced) => (Vec::new(), Some(spliced)),
            None => {
                let body = array(self.members.iter().filter_map(|member| member.answer.as_deref()));
                let compressed = (gzip && body.len() as u64 >= min_length)
                    .then(|| compress_whole(Coding::Gzip, auto_level(Coding::Gzip, body.len()), &body))
                    .flatten()
                    .filter(|compressed| compressed.len() < body.len());
                (body, compressed)
            }
        };
        if compressed.is_some() {
            headers.push(("content-encoding".into(), "gzip".into()));
        }
        vary.push("Accept-Encoding");
        headers.push(("vary".into(), vary.join(", ")));
        let kept = shared.unwrap_or_default().into_iter();
        headers.extend(kept.map(|(name, value)| (name.to_string(), value.to_string())));
        BatchHit { gzip: compressed.is_some(), body: compressed.unwrap_or(body), headers }
    }

    /// The batch the node is sent: the members the store did not answer, in the client's order;
    /// `None` when it answered none (the client's own body goes).
    pub fn node_request(&self) -> Option<Vec<u8>> {
        let answered = self.members.iter().any(|member| member.answer.is_some());
        let asked = self.members.iter().filter(|member| member.answer.is_none());
        answered.then(|| array(asked.map(|member| member.text.as_bytes())))
    }

    /// The client's answer, from the node's answer `body` to [`Batch::node_request`] (whole, or
    /// with `whole` false its start, past which the rest goes on as the node sends it), and the
    /// node's answer to each call the store may keep.
    pub fn merge<'b>(&self, body: &'b [u8], whole: bool) -> (Vec<u8>, Vec<(&Request, &'b [u8])>) {
        let answered = self.members.iter().filter_map(|member| member.answer.as_deref());
        let answered: Vec<&[u8]> = answered.collect();
        if body.trim_ascii().is_empty() && whole {
            // notifications alone went to the node, which answers them with nothing
            return (if answered.is_empty() { Vec::new() } else { array(answered.into_iter()) }, Vec::new());
        }
        if whole {
            if let Some(by_member) = self.node_answers(body) {
                let mut answers = Vec::with_capacity(self.members.len());
                let mut kept = Vec::new();
                for (member, node) in self.members.iter().zip(by_member) {
                    match (&member.answer, node) {
                        (Some(answer), _) => answers.push(answer.as_slice()),
                        (None, Some(node)) => {
                            answers.push(node);
                            kept.extend(member.request.as_ref().map(|(request, _)| (request, node)));
                        }
                        (None, None) => {}
                    }
                }
                return (array(answers.into_iter()), kept);
            }
        }
        (spliced(&answered, body), Vec::new())
    }

    /// The node's answer to each member, when `body` is an array that answers each call it was
    /// sent exactly once, by id; `None` otherwise.
    fn node_answers<'b>(&self, body: &'b [u8]) -> Option<Vec<Option<&'b [u8]>>> {
        let answers: Vec<&RawValue> = serde_json::from_slice(body).ok()?;
        let by_id: HashMap<&str, usize> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, member)| member.answer.is_none())
            .filter_map(|(at, member)| Some((member.id.as_deref()?, at)))
            .collect();
        let mut by_member = vec![None; self.members.len()];
        for answer in answers {
            let response: JsonRpcResponse = serde_json::from_str(answer.get()).ok()?;
            let id = canonical_id(response.id?)?;
            let at = *by_id.get(id.as_str())?;
            let text = answer.get().as_bytes();
            // the answer as a slice of the body, which it is
            let offset = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
            if by_member[at].replace(&body[offset..offset + text.len()]).is_some() {
                return None;
            }
        }
        by_id.values().all(|&at| by_member[at].is_some()).then_some(by_member)
    }

    /// Whether the node's answer is to be held and merged: some of the batch was answered here.
    pub fn merges(&self) -> bool {
        self.members.iter().any(|member| member.answer.is_some())
    }

    /// What of a node's answer to store, for an answer that the client gets as it came (no call
    /// was answered from the store).
    pub fn captures(&self, body: &[u8], settings: &CacheSettings) -> Vec<Result<Capture, Refusal>> {
        let (_, kept) = self.merge(body, true);
        kept.into_iter().map(|(request, answer)| request.capture(answer, settings)).collect()
    }
}

/// A batch answered whole from the store.
#[derive(Debug)]
pub(super) struct BatchHit {
    pub body: Vec<u8>,
    pub gzip: bool,
    pub headers: Vec<(String, String)>,
}

/// An id's canonical JSON text: a string (escapes read), an integer or null; `None` for any other
/// id, which nodes echo in differing ways.
fn canonical_id(id: &RawValue) -> Option<String> {
    match serde_json::from_str::<Value>(id.get()).ok()? {
        value @ (Value::String(_) | Value::Null) => Some(value.to_string()),
        Value::Number(number) if number.is_i64() || number.is_u64() => Some(number.to_string()),
        _ => None,
    }
}

/// A JSON array of these JSON texts.
fn array<'a>(items: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = vec![b'['];
    for (at, item) in items.enumerate() {
        if at > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    out
}

/// The array of `answers` (each an entry and the id it answers) as one gzip body spliced from
/// their streams, with nothing compressed again; `None` unless every entry is continuable and the
/// array is at least `min_length`.
fn spliced_gzip<'e>(
    answers: impl Iterator<Item = &'e (Entry<'e>, String)> + Clone,
    min_length: u64,
) -> Option<Vec<u8>> {
    let plain_len: u64 = answers.clone().map(|(entry, id)| entry.answer_len(id) + 1).sum::<u64>() + 1;
    if plain_len < min_length {
        return None;
    }
    let mut gzip = GzipSplice::new(usize::try_from(plain_len / 4).unwrap_or(0));
    for (at, (entry, id)) in answers.enumerate() {
        if !entry.splice_open(if at == 0 { b"[" } else { b"," }, id, &mut gzip) {
            return None;
        }
    }
    gzip.plain(b"]");
    gzip.close();
    Some(gzip.finish()).filter(|spliced| (spliced.len() as u64) < plain_len)
}

/// The answers from the store, then the node's answers as it sent them (JSON-RPC lets a batch's
/// answers come in any order): for a node's answer that cannot be merged by id, or that is too
/// large to hold. A node's answer that is not an array (the node refused the batch) goes as it
/// came.
fn spliced(answered: &[&[u8]], body: &[u8]) -> Vec<u8> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace());
    let Some(rest) = start.filter(|&at| body[at] == b'[').map(|at| &body[at + 1..]) else { return body.to_vec() };
    let mut out = array(answered.iter().copied());
    out.pop();
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b']');
    if !answered.is_empty() && !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out
}
