//! rpcedge's compression dictionary for `dcz` (RFC 9842, Compression Dictionary Transport): what
//! it is, its hash, whether a request's `Available-Dictionary` names it, and the reply that
//! serves it.
//!
//! The dictionary is raw content, as dcz takes it: what zstd's trainer picked from the corpus's
//! JSON-RPC answers, without the trainer's header (`tools/dictionary.py` regenerates it;
//! docs/compression.md, "Dictionary", says why 32 KiB). It is built in, so that every host
//! compresses against the same bytes; the proxy serves the same file at a path the
//! operator sets, with `Use-As-Dictionary` naming the RPC paths, and a client that has it says so
//! with its SHA-256.

use std::sync::OnceLock;

use base64::alphabet::STANDARD;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The dictionary's bytes, as the proxy serves them.
pub const DICTIONARY: &[u8] = include_bytes!("../dictionary/jsonrpc.dict");

/// The dictionary's SHA-256: what `Available-Dictionary` carries, and what a dcz body starts with.
pub fn hash() -> &'static [u8; 32] {
    static HASH: OnceLock<[u8; 32]> = OnceLock::new();
    HASH.get_or_init(|| Sha256::digest(DICTIONARY).into())
}

/// RFC 8941's byte sequences are base64 with padding, which a parser should not insist on.
const SF_BINARY: GeneralPurpose =
    GeneralPurpose::new(&STANDARD, GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent));

/// Whether an `Available-Dictionary` field value (a structured-field byte sequence, `:base64:`,
/// maybe with parameters) names this dictionary. Anything else, well-formed or not, does not.
pub fn is_named_by(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    let Some(rest) = value.strip_prefix(b":") else { return false };
    let Some(end) = rest.iter().position(|&b| b == b':') else { return false };
    let (encoded, after) = (&rest[..end], &rest[end + 1..]);
    // a SHA-256 is 43 or 44 characters of base64; parameters may follow the item
    if !(43..=44).contains(&encoded.len()) || !(after.is_empty() || after.starts_with(b";")) {
        return false;
    }
    let mut decoded = [0; 33];
    matches!(SF_BINARY.decode_slice(encoded, &mut decoded), Ok(32) if decoded[..32] == hash()[..])
}

/// `dictionary_min_length`'s default: below it, dcz's 40-byte header leaves little or nothing to
/// save (docs/compression.md, "Dictionary").
pub const MIN_LENGTH: u64 = 64;

/// Where the proxy serves the dictionary, and which URLs a client uses it for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DictionaryConfig {
    /// The path it is served at (Envoy; nginx serves it in the location of `rpcedge_dictionary`).
    #[serde(default = "DictionaryConfig::default_path")]
    pub path: String,
    /// `Use-As-Dictionary`'s `match`: a URL pattern (the URL Pattern standard's, as a path) of
    /// the RPC paths that the client sends `Available-Dictionary` to, on the dictionary's origin.
    #[serde(rename = "match", default = "DictionaryConfig::default_pattern")]
    pub pattern: String,
}

impl DictionaryConfig {
    fn default_path() -> String {
        "/rpcedge/dictionary".into()
    }

    fn default_pattern() -> String {
        "/*".into()
    }

    /// The path and the pattern are absolute paths, and the pattern fits in a structured-field
    /// string (printable ASCII, no quote or backslash); the message says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if !self.path.starts_with('/') || self.path.bytes().any(|b| !b.is_ascii_graphic() || b == b'?' || b == b'#') {
            return Err(format!("path must be an absolute path without a query, got {:?}", self.path));
        }
        check_pattern(&self.pattern)
    }

    /// Whether a request's `:path` (with or without its query) is the dictionary's.
    pub fn serves(&self, path: &[u8]) -> bool {
        path.split(|&b| b == b'?').next() == Some(self.path.as_bytes())
    }
}

impl Default for DictionaryConfig {
    fn default() -> Self {
        DictionaryConfig { path: Self::default_path(), pattern: Self::default_pattern() }
    }
}

/// A `match` pattern is an absolute path that fits in a structured-field string, without the
/// regexp groups that RFC 9842 §2.1.1 forbids (a client would ignore the dictionary).
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    let fits = pattern.bytes().all(|b| (0x20..0x7f).contains(&b) && !b"\"\\(".contains(&b));
    if pattern.starts_with('/') && fits {
        Ok(())
    } else {
        Err(format!("match must be a path pattern of printable characters without quotes or groups, got {pattern:?}"))
    }
}

/// How long a client may use the dictionary before it asks again (a day): it changes only with
/// a build, and a client that kept an old one gets what it would without one, until then.
const MAX_AGE_S: u32 = 86_400;

/// The reply that serves the dictionary, for a `match` pattern ([`check_pattern`]).
pub struct Served {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: &'static [u8],
}

/// The reply to a request for the dictionary: 200 with the dictionary to GET and HEAD (HEAD's body
/// is the host's to drop), 304 to a revalidation that names its tag, 405 to anything else. Any
/// origin may read it (a dapp's page is seldom on its RPC endpoint's origin, and a browser keeps
/// only a dictionary it may read): its bytes are public and fetched without credentials. The tag
/// covers the pattern too, so that a new `match` reaches the client that revalidates.
pub fn serve(method: &[u8], if_none_match: Option<&[u8]>, pattern: &str) -> Served {
    let etag = format!("\"{}\"", hex(&Sha256::new().chain_update(hash()).chain_update(pattern).finalize()[..8]));
    if !(method.eq_ignore_ascii_case(b"GET") || method.eq_ignore_ascii_case(b"HEAD")) {
        return Served { status: 405, headers: vec![("allow", "GET, HEAD".into())], body: b"" };
    }
    let mut headers = vec![
        ("etag", etag.clone()),
        ("cache-control", format!("public, max-age={MAX_AGE_S}")),
        ("use-as-dictionary", format!("match=\"{pattern}\"")),
        ("access-control-allow-origin", "*".into()),
    ];
    let revalidated = if_none_match
        .is_some_and(|tags| tags.split(|&b| b == b',').any(|tag| matches!(tag.trim_ascii(), b"*") || strip_weak(tag.trim_ascii()) == etag.as_bytes()));
    if revalidated {
        return Served { status: 304, headers, body: b"" };
    }
    headers.insert(0, ("content-type", "application/octet-stream".into()));
    Served { status: 200, headers, body: DICTIONARY }
}

/// A tag compared weakly (RFC 9110 §13.1.2: If-None-Match uses the weak comparison).
fn strip_weak(tag: &[u8]) -> &[u8] {
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `Available-Dictionary` value of a client that has this dictionary.
pub fn available_dictionary() -> String {
    format!(":{}:", SF_BINARY.encode(hash()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_served_with_its_pattern_and_revalidated_by_its_tag() {
        let served = serve(b"GET", None, "/eth/*");
        assert_eq!((served.status, served.body), (200, DICTIONARY));
        let header = |served: &Served, name: &str| served.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(header(&served, "use-as-dictionary").as_deref(), Some(r#"match="/eth/*""#));
        assert_eq!(header(&served, "content-type").as_deref(), Some("application/octet-stream"));
        assert_eq!(header(&served, "cache-control").as_deref(), Some("public, max-age=86400"));
        assert_eq!(header(&served, "access-control-allow-origin").as_deref(), Some("*"));
        let etag = header(&served, "etag").unwrap();
        for tags in [etag.clone(), format!("W/{etag}"), format!(r#""x", {etag}"#), "*".into()] {
            let again = serve(b"GET", Some(tags.as_bytes()), "/eth/*");
            assert_eq!((again.status, again.body.len(), header(&again, "etag")), (304, 0, Some(etag.clone())), "{tags}");
        }
        assert_eq!(serve(b"HEAD", Some(b"\"other\""), "/*").status, 200);
        assert_ne!(header(&serve(b"GET", None, "/*"), "etag"), Some(etag), "another pattern, another tag");
        assert_eq!(serve(b"POST", None, "/*").status, 405);
    }

    #[test]
    fn a_dictionary_config_names_an_absolute_path_and_a_pattern_that_fits_a_header() {
        let config = DictionaryConfig::default();
        assert_eq!(config.check(), Ok(()));
        assert!(config.serves(b"/rpcedge/dictionary") && config.serves(b"/rpcedge/dictionary?v=2"));
        assert!(!config.serves(b"/rpcedge/dictionary/x") && !config.serves(b"/rpcedge"));
        for (path, pattern) in [("rpcedge", "/*"), ("/a?b", "/*"), ("/a b", "/*"), ("/d", "*"), ("/d", "/\"x"), ("/d", "/\\"), ("/d", "/é"), ("/d", "/(a|b)")] {
            let config = DictionaryConfig { path: path.into(), pattern: pattern.into() };
            assert!(config.check().is_err(), "{path} {pattern}");
        }
    }

    #[test]
    fn the_hash_is_the_sha256_of_the_bytes_served() {
        assert!((30 * 1024..=32 * 1024).contains(&DICTIONARY.len()));
        // raw content, which a decoder that reads a zstd dictionary's magic would read otherwise
        assert_ne!(DICTIONARY[..4], [0x37, 0xa4, 0x30, 0xec]);
        assert_eq!(hash()[..], Sha256::digest(DICTIONARY)[..]);
    }

    /// `value` with its first base64 character changed to another.
    fn flipped(value: &str) -> String {
        let first = if value.as_bytes()[1] == b'A' { "B" } else { "A" };
        format!(":{first}{}", &value[2..])
    }

    #[test]
    fn only_this_dictionarys_hash_names_it() {
        let ours = available_dictionary();
        assert!(ours.ends_with("=:"), "canonical: padded");
        assert!(is_named_by(ours.as_bytes()));
        assert!(is_named_by(format!("  {ours} ").as_bytes()), "whitespace around the field");
        assert!(is_named_by(ours.replace("=:", ":").as_bytes()), "without its padding");
        assert!(is_named_by(format!("{ours};x=1").as_bytes()), "with parameters");
        let other = format!(":{}:", SF_BINARY.encode([7u8; 32]));
        for value in [
            other.as_str(),
            "",
            ":",
            "::",
            &ours[1..],
            &ours[..ours.len() - 1],
            &format!("{ours}x"),
            &format!("{ours}, {ours}"),
            &flipped(&ours),
            &format!(":{}:", SF_BINARY.encode(&hash()[..31])),
            &format!(":{}:", SF_BINARY.encode([hash().as_slice(), b"x"].concat())),
        ] {
            assert!(!is_named_by(value.as_bytes()), "{value:?}");
        }
    }
}
