//! The chain head the replay claims per network: the `latest` and `finalized` block numbers that
//! `eth_getBlockByNumber` answers with, set on the command line and moved by tests
//! (`PUT /head/<network>/<tag>`), so that finality-aware callers can be driven. The network
//! [`BEACON`] holds the beacon chain's finalized slot instead.

use std::collections::HashMap;
use std::sync::Mutex;

use rpcedge_corpus::json::Json;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tag {
    Latest,
    Finalized,
}

impl Tag {
    pub fn parse(text: &str) -> Option<Tag> {
        match text {
            "latest" => Some(Tag::Latest),
            "finalized" => Some(Tag::Finalized),
            _ => None,
        }
    }
}

/// The network whose `finalized` is the beacon chain's finalized slot, which
/// `GET /eth/v1/beacon/headers/finalized` answers with.
pub const BEACON: &str = "beacon";

#[derive(Default)]
pub struct Heads(Mutex<HashMap<(String, Tag), u64>>);

impl Heads {
    pub fn set(&self, network: &str, tag: Tag, number: u64) {
        self.0.lock().expect("never poisoned").insert((network.to_string(), tag), number);
    }

    pub fn knows(&self, network: &str) -> bool {
        self.0.lock().expect("never poisoned").keys().any(|(name, _)| name == network)
    }

    /// The header of the beacon chain's finalized block, when its slot is set: the slot, and a
    /// root made from it.
    pub fn beacon_finalized(&self) -> Option<Vec<u8>> {
        let slot = *self.0.lock().expect("never poisoned").get(&(BEACON.to_string(), Tag::Finalized))?;
        let root = format!("0x{slot:064x}");
        let message = format!(r#"{{"slot":"{slot}","proposer_index":"0","parent_root":"{root}","state_root":"{root}","body_root":"{root}"}}"#);
        let header = format!(r#"{{"root":"{root}","canonical":true,"header":{{"message":{message},"signature":"0x{}"}}}}"#, "0".repeat(192));
        Some(format!(r#"{{"execution_optimistic":false,"finalized":true,"data":{header}}}"#).into_bytes())
    }

    /// The answer to `request` (a single call) when it asks for a block by a tag set for
    /// `network`: a block with its number, and a hash made from it. Recordings answer the rest.
    pub fn answer(&self, network: &str, request: &Json) -> Option<Vec<u8>> {
        if request.get("method")?.as_str()? != "eth_getBlockByNumber" {
            return None;
        }
        let Some(Json::Array(params)) = request.get("params") else { return None };
        let tag = Tag::parse(params.first()?.as_str()?)?;
        let number = *self.0.lock().expect("never poisoned").get(&(network.to_string(), tag))?;
        let mut out = br#"{"jsonrpc":"2.0","id":"#.to_vec();
        request.get("id").unwrap_or(&Json::Null).write_compact(&mut out);
        out.extend_from_slice(format!(r#","result":{{"number":"{number:#x}","hash":"0x{number:064x}"}}}}"#).as_bytes());
        Some(out)
    }
}

/// `NETWORK=NUMBER`, as the command line gives it.
pub fn parse_setting(text: &str) -> Result<(String, u64), String> {
    let (network, number) = text.split_once('=').ok_or(format!("{text:?}: expected NETWORK=NUMBER"))?;
    let number = number.parse().map_err(|_| format!("{text:?}: {number:?} is not a block number"))?;
    Ok((network.to_string(), number))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpcedge_corpus::json;

    #[test]
    fn a_set_tag_answers_with_its_number_and_the_callers_id() {
        let heads = Heads::default();
        heads.set("mainnet", Tag::Finalized, 255);
        let ask = |body: &str| heads.answer("mainnet", &json::parse(body).unwrap()).map(|a| String::from_utf8(a).unwrap());
        assert_eq!(
            ask(r#"{"jsonrpc":"2.0","id":"a","method":"eth_getBlockByNumber","params":["finalized",false]}"#).unwrap(),
            format!(r#"{{"jsonrpc":"2.0","id":"a","result":{{"number":"0xff","hash":"0x{:064x}"}}}}"#, 255)
        );
        // latest is not set, other methods and blocks are the recordings'
        assert_eq!(ask(r#"{"id":1,"method":"eth_getBlockByNumber","params":["latest",false]}"#), None);
        assert_eq!(ask(r#"{"id":1,"method":"eth_getBlockByNumber","params":["0x1",false]}"#), None);
        assert_eq!(ask(r#"{"id":1,"method":"eth_blockNumber","params":[]}"#), None);
        assert_eq!(heads.answer("sepolia", &json::parse(r#"{"id":1,"method":"eth_getBlockByNumber","params":["finalized",false]}"#).unwrap()), None);
    }

    #[test]
    fn settings_parse() {
        assert_eq!(parse_setting("mainnet=24000000"), Ok(("mainnet".into(), 24_000_000)));
        assert!(parse_setting("mainnet").is_err() && parse_setting("mainnet=0x10").is_err());
    }
}
