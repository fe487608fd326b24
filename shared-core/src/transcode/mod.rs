//! JSON <-> SSZ for the responses that have a schema: execution witnesses, raw-bytes JSON-RPC
//! results, and Beacon-API objects. Each transcoder is driven by its schema and
//! walks its input once: JSON strings are borrowed, hex is decoded with SIMD (faster-hex) straight
//! into the output, and list offsets are written once the lengths are known. ssz_rs defines the
//! same types in the tests, as the oracle; it is far too slow for the request path.

mod beacon;
mod header;
mod hex;
mod json;
mod raw;
mod ssz;
mod witness;

use std::borrow::Cow;
use std::fmt;

use json::Scanner;
pub use beacon::{
    beacon_data_to_json, beacon_data_to_ssz, beacon_from_ssz, beacon_to_ssz, is_beacon_api_path, light_client_updates_from_ssz,
    light_client_updates_to_ssz, BeaconEnvelope, BeaconNetwork, BeaconObject, BeaconSsz, Fork, CONSENSUS_VERSION_HEADER,
    EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER,
};
pub use witness::{
    Field as WitnessField, StreamedWitness, WitnessForm, WitnessRender, WitnessSsz, WitnessStream, FIELDS as WITNESS_FIELDS,
};

/// What a JSON-RPC method's result is, for the transcoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// An execution witness (`witness`).
    Witness,
    /// One 0x-hex string: its bytes.
    RawBytes,
    /// A list of 0x-hex strings: `List[ByteList]`.
    RawBytesList,
}

/// The JSON-RPC methods whose results have a schema.
pub const METHODS: [(&str, Schema); 8] = [
    ("debug_executionWitness", Schema::Witness),
    ("debug_getRawBlock", Schema::RawBytes),
    ("debug_getRawHeader", Schema::RawBytes),
    ("debug_getRawTransaction", Schema::RawBytes),
    ("eth_getRawTransactionByHash", Schema::RawBytes),
    ("eth_getRawTransactionByBlockHashAndIndex", Schema::RawBytes),
    ("eth_getRawTransactionByBlockNumberAndIndex", Schema::RawBytes),
    ("debug_getRawReceipts", Schema::RawBytesList),
];

/// The schema of `method`'s result, if it has one.
pub fn method_schema(method: &str) -> Option<Schema> {
    METHODS.iter().find(|(name, _)| *name == method).map(|(_, schema)| *schema)
}

/// A single JSON-RPC call whose result has a schema: what its response's envelope repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonRpcCall {
    pub schema: Schema,
    /// The id's raw JSON text (`null` when there was none).
    pub id: Vec<u8>,
    /// The `jsonrpc` member's value.
    pub version: Vec<u8>,
}

/// The call in a request body whose result has a schema: `None` for a batch, a method without
/// one, or anything that is not one JSON-RPC request object.
pub fn jsonrpc_request(body: &[u8]) -> Option<JsonRpcCall> {
    let mut json = Scanner::new(body);
    let (mut schema, mut id, mut version) = (None, None, None);
    json.object(|json, key| {
        match key {
            b"method" => schema = std::str::from_utf8(&json.string()?).ok().and_then(method_schema),
            b"id" => id = Some(json.value()?.to_vec()),
            b"jsonrpc" => version = Some(json.string()?.into_owned()),
            _ => {
                json.value()?;
            }
        }
        Ok(())
    })
    .ok()?;
    json.end().ok()?;
    Some(JsonRpcCall {
        schema: schema?,
        id: id.unwrap_or_else(|| b"null".to_vec()),
        version: version.unwrap_or_else(|| b"2.0".to_vec()),
    })
}

/// Why a body cannot be transcoded: it then goes out as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TranscodeError {
    /// Not the JSON the schema expects, at this byte.
    Json { what: &'static str, at: usize },
    /// A string that is not 0x-prefixed hex of whole bytes.
    Hex,
    /// Not the SSZ the schema expects.
    Ssz(&'static str),
    /// Over one of the schema's limits.
    Limit(&'static str),
    /// A JSON block header that cannot be RLP-encoded to the header it claims to be.
    Header(&'static str),
    /// A JSON-RPC response with an error or no result: it stays JSON.
    NoResult,
    /// A Beacon-API object of a consensus version rpcedge has no types for, or whose versions
    /// disagree.
    Fork,
    /// A body with a Content-Encoding.
    Encoded,
    /// `Cache-Control: no-transform`.
    NoTransform,
}

impl fmt::Display for TranscodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TranscodeError::Json { what, at } => write!(f, "expected {what} at byte {at}"),
            TranscodeError::Hex => f.write_str("a string that is not 0x-prefixed hex of whole bytes"),
            TranscodeError::Ssz(what) => write!(f, "malformed SSZ: {what}"),
            TranscodeError::Limit(what) => write!(f, "over a limit: {what}"),
            TranscodeError::Header(what) => write!(f, "a block header: {what}"),
            TranscodeError::NoResult => f.write_str("an error or no result"),
            TranscodeError::Fork => f.write_str("an unknown or conflicting consensus version"),
            TranscodeError::Encoded => f.write_str("an encoded body"),
            TranscodeError::NoTransform => f.write_str("Cache-Control: no-transform"),
        }
    }
}

impl std::error::Error for TranscodeError {}

/// A JSON-RPC result as SSZ, with what the envelope said besides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SszResult<'a> {
    /// The id's raw JSON text (`null` when there was none).
    pub id: &'a [u8],
    /// The `jsonrpc` member's value.
    pub version: Cow<'a, [u8]>,
    pub ssz: Vec<u8>,
}

/// A JSON-RPC response `body` whose result has `schema`, with its result as SSZ.
pub fn jsonrpc_to_ssz(body: &[u8], schema: Schema, form: WitnessForm) -> Result<SszResult<'_>, TranscodeError> {
    let mut json = Scanner::new(body);
    let (mut id, mut version, mut ssz) = (None, None, None);
    json.object(|json, key| {
        match key {
            b"id" => id = Some(envelope_id(json)?),
            b"jsonrpc" => version = Some(envelope_version(json)?),
            b"result" if ssz.is_none() => {
                let mut out = Vec::new();
                result_to_ssz(json, schema, form, &mut out)?;
                ssz = Some(out);
            }
            b"result" => return Err(json.error("one result")),
            b"error" => return Err(TranscodeError::NoResult),
            _ => {
                json.value()?;
            }
        }
        Ok(())
    })?;
    json.end()?;
    Ok(SszResult {
        id: id.unwrap_or(b"null"),
        version: version.unwrap_or(Cow::Borrowed(b"2.0")),
        ssz: ssz.ok_or(TranscodeError::NoResult)?,
    })
}

/// A JSON-RPC response's id, as its raw JSON text; it goes out in a response header, so only
/// printable ASCII is taken.
fn envelope_id<'a>(json: &mut Scanner<'a>) -> Result<&'a [u8], TranscodeError> {
    let value = json.value()?;
    if !value.iter().all(|&b| (0x20..0x7f).contains(&b)) {
        return Err(json.error("an id that fits in a header"));
    }
    Ok(value)
}

/// A JSON-RPC response's `jsonrpc` member, for a response header too.
fn envelope_version<'a>(json: &mut Scanner<'a>) -> Result<Cow<'a, [u8]>, TranscodeError> {
    let value = json.string()?;
    if !value.iter().all(|&b| (0x21..0x7f).contains(&b)) {
        return Err(json.error("a version that fits in a header"));
    }
    Ok(value)
}

fn result_to_ssz(json: &mut Scanner, schema: Schema, form: WitnessForm, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    match schema {
        Schema::Witness => witness::to_ssz(json, form, out),
        Schema::RawBytes => raw::bytes_to_ssz(json, out),
        Schema::RawBytesList => raw::list_to_ssz(json, out),
    }
}

/// A result with `schema` as SSZ (`result_to_ssz`'s inverse): its JSON, appended to `out`.
pub fn ssz_to_json(ssz: &[u8], schema: Schema, form: WitnessForm, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    match schema {
        Schema::Witness => witness::to_json(ssz, form, out),
        Schema::RawBytes => raw::bytes_to_json(ssz, out),
        Schema::RawBytesList => raw::list_to_json(ssz, out),
    }
}

/// A JSON-RPC response around a result that came as SSZ: `{"jsonrpc":<version>,"id":<id>,
/// "result":<JSON>}`, with the id's raw JSON text (refused unless it is one JSON value).
pub fn jsonrpc_from_ssz(
    ssz: &[u8],
    schema: Schema,
    form: WitnessForm,
    id: &[u8],
    version: &[u8],
) -> Result<Vec<u8>, TranscodeError> {
    let mut out = jsonrpc_head(id, version)?;
    out.reserve(ssz.len() * 2 + 64);
    ssz_to_json(ssz, schema, form, &mut out)?;
    out.push(b'}');
    Ok(out)
}

/// A JSON-RPC response's opening, up to its result: `{"jsonrpc":<version>,"id":<id>,"result":`.
fn jsonrpc_head(id: &[u8], version: &[u8]) -> Result<Vec<u8>, TranscodeError> {
    let mut id_check = Scanner::new(id);
    id_check.value()?;
    id_check.end()?;
    let mut out = Vec::with_capacity(64 + id.len());
    out.extend_from_slice(b"{\"jsonrpc\":");
    serde_json::to_writer(&mut out, &String::from_utf8_lossy(version)).expect("a string serialises");
    out.extend_from_slice(b",\"id\":");
    out.extend_from_slice(id);
    out.extend_from_slice(b",\"result\":");
    Ok(out)
}

#[cfg(test)]
mod tests;
