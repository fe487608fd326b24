//! A JSON-RPC call read strictly, as the key must cover it: exactly what the node will read.
//!
//! Nodes do not all read a request as serde does. Go's `encoding/json` (geth, erigon, op-geth,
//! bor) matches member names case-insensitively, with Unicode folding (`"ſ"` matches `s`), and
//! lets the last one win; serde matches exactly and ignores the rest. A call whose key names one
//! block while the node answers another would store a wrong answer for every client, so a call
//! is taken only where every reading agrees:
//!
//! - the top level is an object whose members are among `jsonrpc`, `id`, `method` and `params`,
//!   spelled exactly so (no escapes) and each at most once;
//! - in `params`, no object has two member names that a case-insensitive reader could confuse
//!   (equal ignoring ASCII case, or any name outside ASCII, whose folding differs by reader), and
//!   every number is an integer (`1.0`, `1e2` and integers past 64 bits are read differently by
//!   differently typed decoders).

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// A call as the key covers it.
#[derive(Debug)]
pub struct Call<'a> {
    pub method: &'a str,
    /// `Null` when absent.
    pub params: Value,
    pub id: Option<&'a RawValue>,
}

/// Why a body is not a call the cache takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// Not a JSON-RPC request object at all.
    Malformed,
    /// A member other than the four, one spelled otherwise, or one given twice.
    Members,
    /// Params that another decoder would read differently.
    Params,
}

impl<'a> Call<'a> {
    /// Reads `body` strictly.
    pub fn read(body: &'a [u8]) -> Result<Call<'a>, Unread> {
        let call = Call::read_members(body)?;
        if !call.reads_alike() {
            return Err(Unread::Params);
        }
        Ok(call)
    }

    /// Reads `body`'s members strictly, its params as serde reads them: a call of a batch whose
    /// params another decoder reads otherwise still has an id that every reader agrees on.
    pub fn read_members(body: &'a [u8]) -> Result<Call<'a>, Unread> {
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let read = deserializer.deserialize_map(CallVisitor).map_err(|_| Unread::Malformed)?;
        deserializer.end().map_err(|_| Unread::Malformed)?;
        read
    }

    /// Whether every decoder reads the params as serde does.
    pub fn reads_alike(&self) -> bool {
        read_alike(&self.params)
    }
}

/// Whether every decoder reads `value` as serde does.
fn read_alike(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.iter().all(read_alike),
        Value::Object(object) => {
            let names: Vec<&String> = object.keys().collect();
            let confusable = names.iter().enumerate().any(|(at, name)| {
                !name.is_ascii() || names[at + 1..].iter().any(|other| other.eq_ignore_ascii_case(name))
            });
            !confusable && object.values().all(read_alike)
        }
        Value::Number(number) => number.is_u64() || number.is_i64(),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

/// A member name: borrowed when spelled without escapes.
enum Name<'a> {
    Plain(&'a str),
    Escaped,
}

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, name: &'de str) -> Result<Self::Value, E> {
                Ok(Name::Plain(name))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Name::Escaped)
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

struct CallVisitor;

impl<'de> Visitor<'de> for CallVisitor {
    /// `Err`: a readable object, but not one the cache takes.
    type Value = Result<Call<'de>, Unread>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON-RPC request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut version, mut method, mut params, mut id) = (false, None, None, None);
        let mut refused = false;
        while let Some(name) = map.next_key::<Name>()? {
            let again = match name {
                Name::Plain("jsonrpc") => {
                    map.next_value::<IgnoredAny>()?;
                    std::mem::replace(&mut version, true)
                }
                Name::Plain("method") => method.replace(map.next_value::<&str>()?).is_some(),
                Name::Plain("params") => params.replace(map.next_value::<Value>()?).is_some(),
                Name::Plain("id") => id.replace(map.next_value::<&RawValue>()?).is_some(),
                Name::Plain(_) | Name::Escaped => {
                    map.next_value::<IgnoredAny>()?;
                    true
                }
            };
            refused |= again;
        }
        if refused {
            return Ok(Err(Unread::Members));
        }
        let method = method.ok_or_else(|| de::Error::missing_field("method"))?;
        Ok(Ok(Call { method, params: params.unwrap_or(Value::Null), id }))
    }
}
