//! Execution witnesses made up at any size, for the benchmarks and tests of witnesses larger than
//! any recorded one, at the proportions of the real ones: elements are drawn one after another
//! from the lengths of the loaded witnesses' elements (state nodes, codes and keys together, so
//! each field comes as often and as long as it does in them), with as many headers as the loaded
//! witness that has most, and filled with bytes from a fixed-seed generator: a size always gives
//! the same witness.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use rpcedge_corpus::corpus::WitnessItems;

/// The largest witness made, in bytes of content (its JSON is about twice as long).
pub const MAX_BYTES: u64 = 2 << 30;

#[derive(Clone, Copy)]
enum Field {
    State,
    Codes,
    Keys,
}

pub struct WitnessMaker {
    /// Every loaded element but the headers, as (field, length).
    pool: Vec<(Field, u32)>,
    headers: Vec<u32>,
    /// The `result` of each size made so far.
    made: Mutex<HashMap<u64, Bytes>>,
}

impl WitnessMaker {
    /// `None` without a loaded witness to take the proportions from.
    pub fn new(items: &WitnessItems) -> Option<Self> {
        let fields = [(Field::State, &items.state), (Field::Codes, &items.codes), (Field::Keys, &items.keys)];
        let pool: Vec<(Field, u32)> =
            fields.iter().flat_map(|&(field, lengths)| lengths.iter().map(move |&length| (field, length))).collect();
        if pool.is_empty() {
            return None;
        }
        let headers = items.headers.iter().copied().cycle().take(items.most_headers).collect();
        Some(WitnessMaker { pool, headers, made: Mutex::default() })
    }

    /// The JSON `result` of a witness of at least `bytes` bytes of content (it ends with the
    /// element that reaches them).
    pub fn result(&self, bytes: u64) -> Bytes {
        if let Some(made) = self.made.lock().expect("not poisoned").get(&bytes) {
            return made.clone();
        }
        let made = Bytes::from(self.make(bytes));
        self.made.lock().expect("not poisoned").insert(bytes, made.clone());
        made
    }

    fn make(&self, bytes: u64) -> Vec<u8> {
        let mut random = SplitMix64(bytes);
        let mut fields: [Vec<u8>; 3] = Default::default();
        let mut headers = Vec::new();
        let mut content = 0u64;
        for &length in &self.headers {
            push_hex(&mut headers, &mut random, length);
            content += u64::from(length);
        }
        while content < bytes {
            let (field, length) = self.pool[(random.next() % self.pool.len() as u64) as usize];
            push_hex(&mut fields[field as usize], &mut random, length);
            content += u64::from(length);
        }
        let [state, codes, keys] = fields;
        let mut json = Vec::with_capacity(state.len() + codes.len() + keys.len() + headers.len() + 64);
        for (name, items) in [("state", state), ("codes", codes), ("keys", keys), ("headers", headers)] {
            json.extend_from_slice(if name == "state" { b"{\"" } else { b",\"" });
            json.extend_from_slice(name.as_bytes());
            json.extend_from_slice(b"\":[");
            json.extend_from_slice(items.strip_prefix(b",").unwrap_or(&items));
            json.push(b']');
        }
        json.push(b'}');
        json
    }
}

/// Appends `,"0x<hex>"` of `length` random bytes.
fn push_hex(out: &mut Vec<u8>, random: &mut SplitMix64, length: u32) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(b",\"0x");
    let mut word = 0u64;
    for i in 0..length {
        if i % 8 == 0 {
            word = random.next();
        }
        let byte = (word >> (8 * (i % 8))) as u8;
        out.extend_from_slice(&[DIGITS[usize::from(byte >> 4)], DIGITS[usize::from(byte & 15)]]);
    }
    out.push(b'"');
}

/// SplitMix64, written out rather than taken from `rand`: the witnesses of a size must stay the
/// same bytes whatever version of a dependency builds the replay, which `rand` does not promise.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A response around a made-up witness, with the call's id (its JSON text).
pub fn response(id: &[u8], result: Bytes) -> Vec<Bytes> {
    let head = [&b"{\"jsonrpc\":\"2.0\",\"id\":"[..], id, b",\"result\":"].concat();
    vec![Bytes::from(head), result, Bytes::from_static(b"}")]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_always_gives_the_same_witness_of_at_least_that_content_in_the_loaded_proportions() {
        let items = WitnessItems {
            state: vec![100, 532],
            codes: vec![5000],
            keys: vec![32],
            headers: vec![600, 610],
            most_headers: 3,
        };
        let maker = WitnessMaker::new(&items).unwrap();
        let result = maker.make(1_000_000);
        assert_eq!(result, WitnessMaker::new(&items).unwrap().make(1_000_000));
        assert_ne!(result, maker.make(1_000_001));
        let text = std::str::from_utf8(&result).unwrap();
        let witness = rpcedge_corpus::json::parse(text).unwrap();
        let lengths = |field: &str| -> Vec<usize> {
            let Some(rpcedge_corpus::json::Json::Array(items)) = witness.get(field) else { panic!("{field}") };
            items.iter().map(|item| item.as_str().unwrap().len() / 2 - 1).collect()
        };
        assert_eq!(lengths("headers"), [600, 610, 600]);
        let content: usize = ["state", "codes", "keys", "headers"].iter().flat_map(|field| lengths(field)).sum();
        assert!((1_000_000..1_005_000).contains(&content), "{content}");
        // a quarter of the pool is codes: about 5000 / 5664 of the rest of the content
        let codes: usize = lengths("codes").iter().sum();
        assert!((0.8..0.96).contains(&(codes as f64 / (content - 1810) as f64)), "{codes}");
        assert!(lengths("state").iter().all(|&n| n == 100 || n == 532) && lengths("keys").iter().all(|&n| n == 32));
    }
}
