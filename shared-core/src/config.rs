//! The one configuration every host shares: serde for Envoy's JSON, a C struct for nginx.
//!
//! Every bound lives in [`FIELDS`], so a host that checks a single directive while parsing its
//! own config and a host that validates a whole JSON object apply the same ranges and print the
//! same message.

use std::fmt;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use crate::cache::{hit_codings, CacheSettings, MinLengths};
use crate::dictionary::DictionaryConfig;
use crate::negotiate::Coding;
use crate::transcode::BeaconNetwork;

const MIB: u64 = 1024 * 1024;

/// The knobs of the compression pipeline, as an operator writes them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Bodies shorter than this go out as they are.
    pub min_length: u64,
    /// The same for `dcz`, which makes small answers smaller than other codings do.
    pub dictionary_min_length: u64,
    /// The most a response is buffered for one-shot compression before it streams.
    pub max_buffer: u64,
    /// One-shot compression: `auto` (by the body's size) or a fixed libdeflate level (gzip and
    /// deflate; zstd and br always take theirs by size).
    pub level: Level,
    /// zlib level for streaming compression.
    pub stream_level: u32,
    /// The codings made, in the server's order of preference: among those a client weighs
    /// alike, the first listed wins ([`Coding::DEFAULT_ORDER`]).
    pub encodings: Vec<Coding>,
    /// A chunked body that pauses this long stops being buffered and streams.
    pub stream_delay_ms: u64,
    /// Media types to compress; `type/*` and `*/*` match a whole family.
    pub types: Vec<String>,
    /// Where the host can run work off its event loop (nginx with `aio threads`), whole bodies
    /// at least this long are compressed there.
    pub offload_min_length: u64,
    /// Give clients that ask for SSZ (`Accept: application/octet-stream`) the SSZ of a JSON answer
    /// that has a schema (the `transcode` module).
    pub transcode: bool,
    /// The largest body transcoded; a longer one goes out as it came. A witness past
    /// `transcode_hold_max` is transcoded as it arrives, holding only its SSZ (about half the
    /// JSON). Also the most an answer encoded regardless may decode to: the largest body the core
    /// works on, past which one is a decompression bomb.
    pub transcode_max: u64,
    /// The largest body held whole to transcode: any other (Beacon-API objects, raw bytes, and a
    /// witness up to this long, as JSON or as SSZ to render). A body held whole can always go out
    /// as it came; one transcoded as it arrives cannot, so it fails if it turns out not to be
    /// transcodable (or, without a Content-Length, grows past `transcode_max` or the budget).
    pub transcode_hold_max: u64,
    /// The memory that all transcodes in flight may hold together (per nginx worker, per Envoy
    /// process, per Wasm VM); a body that would pass it goes out as it came.
    pub transcode_budget: u64,
    /// Ask the node for SSZ where a JSON client's answer has a schema, and render its JSON here:
    /// half the bytes between node and proxy, and less work for the node.
    pub transcode_upstream_ssz: bool,
    /// The beacon chain behind the proxy, whose fork digests frame the light client updates
    /// route's SSZ; absent: that route is not transcoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beacon_network: Option<BeaconNetwork>,
    /// Envoy only: the listener's `per_connection_buffer_limit_bytes`, which counts what the
    /// filter writes at once ([`Settings::check_buffer_limit`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffer_limit: Option<u64>,
    /// Serve rpcedge's dcz dictionary ([`crate::dictionary`]) at this path: Envoy; absent: not
    /// served. nginx and the Lua binding serve it from a location of their own
    /// (`rpcedge_dictionary`, `rpcedge.dictionary`). A location makes dcz where `encodings` lists it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dictionary: Option<DictionaryConfig>,
    /// The response cache, for a host configured in JSON (Envoy); absent: off. nginx has its
    /// own directives, checked against the same `FIELDS`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheConfig>,
}

/// The response cache's settings in a host's JSON configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    pub enabled: bool,
    /// This host's daemon: its Envoy cluster (the Lua binding: its address). Hosts share entries
    /// through the daemons' fleet tier, never by picking a daemon per key.
    pub cluster: String,
    /// The key's namespace for every route that sets none in its metadata
    /// ([`crate::proxy::cache::ROUTE_NAMESPACE`]); with neither, a request bypasses the cache.
    /// Never taken from the request: a client must not choose where its answers are stored.
    pub namespace: Option<String>,
    /// How long a lookup may take before the node is asked instead.
    pub timeout_ms: u64,
    /// Whether answers carry `X-Rpcedge-Cache`.
    pub status_header: bool,
    /// Whether a bypass's status header gives its reason, `BYPASS; reason=method`: off by
    /// default, as the reasons tell a client how the cache decides.
    pub status_reason: bool,
    /// Bytes of each worker's hot tier (the daemon's recent hits, in the worker's memory); 0: none.
    pub hot_bytes: u64,
    /// How long a store may take (the daemon deflates the entry at level 12 before it answers).
    pub store_timeout_s: u64,
    /// Longer request bodies bypass the cache (`too_large`).
    pub max_request: u64,
    /// Longer answers go to the client but are not stored (a bypass: `answer`).
    pub max_entry: u64,
    /// How long chain properties (`eth_chainId`, `net_version`) are kept.
    pub chain_ttl_s: u64,
    /// Larger batches go to the node whole (`batch`); 0: every batch does.
    pub max_batch: u64,
    /// How long a miss waits for another request's answer for the same key; 0: never.
    pub lock_timeout_ms: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        let limits = CacheSettings::default();
        CacheConfig {
            enabled: true,
            cluster: "rpcedge_cached".into(),
            namespace: None,
            timeout_ms: 50,
            status_header: true,
            status_reason: false,
            hot_bytes: 0,
            store_timeout_s: 5,
            max_request: limits.max_request as u64,
            max_entry: limits.max_entry as u64,
            chain_ttl_s: limits.chain_ttl_s,
            max_batch: limits.max_batch as u64,
            lock_timeout_ms: limits.lock_timeout_ms,
        }
    }
}

impl CacheConfig {
    /// Checks every bound; the settings the cache's exchanges run with.
    pub fn settings(&self) -> Result<CacheSettings, ConfigError> {
        self.check()?;
        // within their bounds, both fit a 32-bit usize
        Ok(CacheSettings {
            max_request: self.max_request as usize,
            max_entry: self.max_entry as usize,
            chain_ttl_s: self.chain_ttl_s,
            max_batch: self.max_batch as usize,
            lookup_timeout_ms: self.timeout_ms,
            lock_timeout_ms: self.lock_timeout_ms,
            store_timeout_ms: self.store_timeout_s * 1000,
            ..CacheSettings::default()
        })
    }


    fn check(&self) -> Result<(), ConfigError> {
        check_field("cache_timeout_ms", self.timeout_ms)?;
        check_field("cache_store_timeout_s", self.store_timeout_s)?;
        check_field("cache_max_request", self.max_request)?;
        check_field("cache_max_entry", self.max_entry)?;
        check_field("cache_chain_ttl_s", self.chain_ttl_s)?;
        check_field("cache_max_batch", self.max_batch)?;
        check_field("cache_lock_timeout_ms", self.lock_timeout_ms)?;
        check_field("cache_hot_bytes", self.hot_bytes)?;
        if self.hot_bytes != 0 && self.hot_bytes < crate::cache::HOT_MIN_REGION as u64 {
            let message = format!("0 (none) or at least {}", crate::cache::HOT_MIN_REGION);
            return Err(ConfigError::new("cache_hot_bytes", message));
        }
        if self.cluster.is_empty() {
            return Err(ConfigError::new("cache_cluster", "must not be empty".into()));
        }
        if self.namespace.as_deref() == Some("") {
            return Err(ConfigError::new("cache_namespace", "must not be empty".into()));
        }
        Ok(())
    }
}

/// The one-shot compression level, as an operator writes it: `auto` or 1 to 12.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "LevelValue", into = "LevelValue")]
pub enum Level {
    /// By the body's size ([`crate::compress::auto_level`]): chosen by measurement on the corpus.
    Auto,
    /// One libdeflate level for every body.
    Fixed(u32),
}

/// [`Level`] in JSON: `"auto"` or a number.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum LevelValue {
    Number(u64),
    Name(String),
}

impl TryFrom<LevelValue> for Level {
    type Error = ConfigError;
    fn try_from(value: LevelValue) -> Result<Level, ConfigError> {
        match value {
            LevelValue::Number(level) => check_field("level", level).map(|()| Level::Fixed(level as u32)),
            LevelValue::Name(name) => Level::parse(&name),
        }
    }
}

impl From<Level> for LevelValue {
    fn from(level: Level) -> LevelValue {
        match level {
            Level::Auto => LevelValue::Name("auto".into()),
            Level::Fixed(level) => LevelValue::Number(level.into()),
        }
    }
}

impl Level {
    /// Parses a directive's value: `auto`, or a number in the level's range.
    pub fn parse(value: &str) -> Result<Level, ConfigError> {
        if value.eq_ignore_ascii_case("auto") {
            return Ok(Level::Auto);
        }
        match value.parse::<u64>() {
            Ok(level) => check_field("level", level).map(|()| Level::Fixed(level as u32)),
            Err(_) => Err(ConfigError::new("level", format!("must be auto or a number from 1 to 12, got \"{value}\""))),
        }
    }

    /// The C form (`rpcedge_config_t` of the C ABI, shared-core/ffi): 0 for `auto`.
    pub fn from_raw(raw: u32) -> Level {
        if raw == 0 { Level::Auto } else { Level::Fixed(raw) }
    }

    pub fn to_raw(self) -> u32 {
        match self {
            Level::Auto => 0,
            Level::Fixed(level) => level,
        }
    }

    /// The level for a body of `length` bytes in `coding`: a fixed level is libdeflate's, and
    /// applies to gzip and deflate.
    pub fn for_body(self, coding: Coding, length: usize) -> u32 {
        match self {
            Level::Fixed(level) if matches!(coding, Coding::Gzip | Coding::Deflate) => level,
            _ => crate::compress::auto_level(coding, length),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_length: 1024,
            dictionary_min_length: crate::dictionary::MIN_LENGTH,
            max_buffer: MIB,
            level: Level::Auto,
            stream_level: 1,
            encodings: Coding::DEFAULT_ORDER.to_vec(),
            stream_delay_ms: 100,
            // a node's answers; pages, scripts and styles are left to nginx's gzip and Envoy's
            // compressor, as they would be without rpcedge (the drop-in contract)
            types: ["application/json", "application/json-rpc"].map(String::from).to_vec(),
            // At level 6 libdeflate compresses this JSON at about 70-120 MB/s, so from here on one
            // compression holds an event loop for 1-2 ms or more, while the hop to a thread and
            // back costs tens of microseconds; below, inline is cheaper than the hop.
            offload_min_length: 128 * 1024,
            transcode: false,
            // Mainnet witnesses are 10-15 MB of JSON and reach hundreds of MB, 750 MB for a
            // 60M-gas block: twice that is covered.
            transcode_max: 2048 * MIB,
            // a mainnet BeaconState is about 250 MB and needs this raised
            transcode_hold_max: 64 * MIB,
            transcode_budget: 1024 * MIB,
            transcode_upstream_ssz: false,
            beacon_network: None,
            buffer_limit: None,
            dictionary: None,
            cache: None,
        }
    }
}

/// A numeric field of [`Config`] and the values it accepts.
pub struct Field {
    pub name: &'static str,
    pub range: RangeInclusive<u64>,
}

/// The numeric fields, in declaration order, with their bounds; then the cache's.
pub const FIELDS: [Field; 18] = [
    Field { name: "min_length", range: 0..=64 * MIB },
    Field { name: "dictionary_min_length", range: 0..=64 * MIB },
    Field { name: "max_buffer", range: 0..=256 * MIB },
    Field { name: "level", range: 1..=12 },
    Field { name: "stream_level", range: 1..=9 },
    Field { name: "stream_delay_ms", range: 0..=60_000 },
    Field { name: "offload_min_length", range: 0..=256 * MIB },
    // an SSZ witness is at most 4 GiB (its offsets), its JSON about twice that
    Field { name: "transcode_max", range: 0..=8192 * MIB },
    Field { name: "transcode_hold_max", range: 0..=2048 * MIB },
    Field { name: "transcode_budget", range: 0..=1024 * 1024 * MIB },
    Field { name: "cache_timeout_ms", range: 1..=60_000 },
    Field { name: "cache_hot_bytes", range: 0..=1024 * MIB },
    Field { name: "cache_store_timeout_s", range: 1..=60 },
    Field { name: "cache_max_request", range: 0..=16 * MIB },
    Field { name: "cache_max_entry", range: 0..=MAX_ENTRY },
    Field { name: "cache_chain_ttl_s", range: 1..=86_400 },
    Field { name: "cache_max_batch", range: 0..=crate::cache::protocol::MAX_LOOKUP_KEYS as u64 },
    Field { name: "cache_lock_timeout_ms", range: 0..=crate::cache::protocol::MAX_LOCK_MS },
];

/// The largest `max_entry`: a hit of it is 64 MiB of JSON, put together in one piece.
pub const MAX_ENTRY: u64 = 64 * MIB;

/// A configuration value that is out of range or malformed, naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    fn new(field: &str, message: String) -> Self {
        ConfigError { field: field.to_owned(), message }
    }
}

/// Checks one numeric field against its bounds.
pub fn check_field(name: &str, value: u64) -> Result<(), ConfigError> {
    let field = FIELDS
        .iter()
        .find(|f| f.name == name)
        .ok_or_else(|| ConfigError::new(name, "is not a numeric setting".into()))?;
    if field.range.contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::new(
            name,
            format!(
                "must be between {} and {}, got {}",
                field.range.start(),
                field.range.end(),
                value
            ),
        ))
    }
}

/// Parses one coding of `encodings`: `dcz`, `zstd`, `br`, `gzip` or `deflate` (not `x-gzip`, which a
/// client may send but an operator has no reason to write).
pub fn parse_encoding(token: &str) -> Result<Coding, ConfigError> {
    Coding::ALL.into_iter().find(|coding| token.eq_ignore_ascii_case(coding.token())).ok_or_else(|| {
        ConfigError::new("encodings", format!("\"{token}\" is not one of dcz, zstd, br, gzip, deflate"))
    })
}

/// At least one coding, each once.
pub fn check_encodings(encodings: &[Coding]) -> Result<(), ConfigError> {
    if encodings.is_empty() {
        return Err(ConfigError::new("encodings", "must list at least one of dcz, zstd, br, gzip, deflate".into()));
    }
    if let Some((_, coding)) = encodings.iter().enumerate().find(|(at, c)| encodings[..*at].contains(c)) {
        return Err(ConfigError::new("encodings", format!("lists {} twice", coding.token())));
    }
    Ok(())
}

impl Serialize for Coding {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.token())
    }
}

impl<'de> Deserialize<'de> for Coding {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Coding, D::Error> {
        let token = String::deserialize(deserializer)?;
        parse_encoding(&token).map_err(serde::de::Error::custom)
    }
}

/// Checks one media-type pattern: `type/subtype`, `type/*` or `*/*`, no parameters.
pub fn check_type(pattern: &str) -> Result<(), ConfigError> {
    let valid = match pattern.split_once('/') {
        Some((top, sub)) => {
            is_token(top) && is_token(sub) && (top != "*" || sub == "*")
        }
        None => false,
    };
    if valid {
        Ok(())
    } else {
        Err(ConfigError::new(
            "types",
            format!("\"{pattern}\" is not a media type like application/json, text/* or */*"),
        ))
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-*".contains(&b))
}

impl Config {
    /// Parses and validates a JSON object (the Envoy plugin configuration); an empty input means
    /// all defaults.
    pub fn from_json(json: &[u8]) -> Result<Settings, ConfigError> {
        Config::from_json_over(json, Config::default())
    }

    /// [`Config::from_json`] with the fields it does not name taken from `defaults`.
    pub fn from_json_over(json: &[u8], defaults: Config) -> Result<Settings, ConfigError> {
        let trimmed = json.trim_ascii();
        let config: Config = if trimmed.is_empty() {
            defaults
        } else {
            // serde names the offending field in its message ("unknown field `levle`").
            let error = |e: serde_json::Error| ConfigError::new("config", e.to_string());
            let given: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(trimmed).map_err(error)?;
            refuse_shards(&given)?;
            let mut fields = match serde_json::to_value(defaults).map_err(error)? {
                serde_json::Value::Object(fields) => fields,
                _ => unreachable!("a Config is an object"),
            };
            fields.extend(given);
            serde_json::from_value(serde_json::Value::Object(fields)).map_err(error)?
        };
        config.validate()
    }

    /// The Wasm filter's defaults: its VM addresses 4 GiB, and a witness transcoded as it
    /// arrives holds about half its JSON before its SSZ is copied out to Envoy.
    pub fn wasm_defaults() -> Config {
        Config { transcode_max: 256 * MIB, ..Config::default() }
    }

    /// Checks every bound and turns the config into the [`Settings`] an exchange runs with.
    /// Without a `cache` section the cache's settings are its defaults (the Lua binding's own
    /// storage runs with them).
    pub fn validate(self) -> Result<Settings, ConfigError> {
        let cache = self.cache.clone().unwrap_or_default();
        self.validate_with(&cache)
    }

    /// [`Config::validate`], with the cache's settings from `cache` (nginx: its directives)
    /// rather than the configuration's own section.
    pub fn validate_with(self, cache: &CacheConfig) -> Result<Settings, ConfigError> {
        if let Level::Fixed(level) = self.level {
            check_field("level", level.into())?;
        }
        let values = [
            ("min_length", self.min_length),
            ("dictionary_min_length", self.dictionary_min_length),
            ("max_buffer", self.max_buffer),
            ("stream_level", u64::from(self.stream_level)),
            ("stream_delay_ms", self.stream_delay_ms),
            ("offload_min_length", self.offload_min_length),
            ("transcode_max", self.transcode_max),
            ("transcode_hold_max", self.transcode_hold_max),
            ("transcode_budget", self.transcode_budget),
        ];
        for (name, value) in values {
            check_field(name, value)?;
        }
        if self.min_length > self.max_buffer {
            return Err(ConfigError::new(
                "min_length",
                format!(
                    "must not exceed max_buffer ({} > {})",
                    self.min_length, self.max_buffer
                ),
            ));
        }
        if self.types.is_empty() {
            return Err(ConfigError::new("types", "must list at least one media type".into()));
        }
        check_encodings(&self.encodings)?;
        if let Some(dictionary) = &self.dictionary {
            dictionary.check().map_err(|message| ConfigError::new("dictionary", message))?;
        }
        let cache = CacheSettings {
            hit_codings: hit_codings(&self.encodings),
            dictionary_min_length: self.dictionary_min_length,
            ..cache.settings()?
        };
        let mut types = Vec::with_capacity(self.types.len());
        for pattern in &self.types {
            check_type(pattern)?;
            types.push(pattern.to_ascii_lowercase());
        }
        let patterns = types.iter().map(|pattern| TypePattern::new(pattern)).collect();
        Ok(Settings { config: Config { types, ..self }, patterns, cache_settings: cache })
    }
}

/// The cache section's `clusters`, the daemons it once sharded the keys over, is refused by its
/// name with the way out, where serde would only call it an unknown field.
fn refuse_shards(given: &serde_json::Map<String, serde_json::Value>) -> Result<(), ConfigError> {
    if given.get("cache").and_then(|cache| cache.get("clusters")).is_none() {
        return Ok(());
    }
    Err(ConfigError::new(
        "cache_clusters",
        "sharding was retired: run one daemon per host, started with --fleet, and name it as \"cluster\" \
         (README.md, \"Moving from shards\")"
            .into(),
    ))
}

/// Parses a `beacon_network` directive's value: a chain's name, or `off`.
pub fn parse_beacon_network(value: &str) -> Result<Option<BeaconNetwork>, ConfigError> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    BeaconNetwork::from_name(value).map(Some).ok_or_else(|| {
        let names: Vec<&str> = BeaconNetwork::all().iter().map(|network| network.name()).collect();
        ConfigError::new("beacon_network", format!("must be off or one of {}, got \"{value}\"", names.join(", ")))
    })
}

/// A validated [`Config`]; the only way to start an exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    config: Config,
    /// `types`, split once here rather than for every response.
    patterns: Vec<TypePattern>,
    cache_settings: CacheSettings,
}

/// A media type pattern of `types`: its type and subtype, `None` for `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TypePattern {
    top: Option<Box<[u8]>>,
    sub: Option<Box<[u8]>>,
}

impl TypePattern {
    /// From a validated pattern (`type/subtype`, `type/*` or `*/*`).
    fn new(pattern: &str) -> Self {
        let part = |part: &str| (part != "*").then(|| part.as_bytes().into());
        let (top, sub) = pattern.split_once('/').expect("validated");
        TypePattern { top: part(top), sub: part(sub) }
    }

    fn matches(&self, top: &[u8], sub: &[u8]) -> bool {
        let fits = |part: &Option<Box<[u8]>>, given: &[u8]| part.as_deref().map_or(true, |p| given.eq_ignore_ascii_case(p));
        fits(&self.top, top) && fits(&self.sub, sub)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Config::default().validate().expect("defaults are valid")
    }
}

impl std::ops::Deref for Settings {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.config
    }
}

impl Settings {
    /// The settings the cache's exchanges run with.
    pub fn cache_settings(&self) -> &CacheSettings {
        &self.cache_settings
    }

    /// For a host that counts what the filter writes at once against a buffer limit (Envoy):
    /// the most it writes at once (a one-shot body, or a transcoded or untranscoded whole body)
    /// must stay below that limit, with room for one upstream read besides; so must the request
    /// body the cache holds (up to `max_request`, and one read). Envoy answers a write past it
    /// with a local reply from inside the filter's callback (a request body past it with a 413),
    /// so such a configuration is refused rather than left to fail at run time.
    pub fn check_buffer_limit(&self) -> Result<(), ConfigError> {
        let transcodes = self.transcode || self.transcode_upstream_ssz;
        let held = self.transcode_held_max();
        let (mut written, mut what) = if transcodes && held > self.max_buffer {
            (held, "transcode_hold_max")
        } else {
            (self.max_buffer, "max_buffer")
        };
        if let Some(cache) = self.cache.as_ref().filter(|cache| cache.enabled && cache.max_request > written) {
            (written, what) = (cache.max_request, "the cache's max_request");
        }
        match self.buffer_limit {
            None if transcodes => Err(ConfigError::new(
                "buffer_limit",
                "must be given with transcode or transcode_upstream_ssz: set it to the listener's per_connection_buffer_limit_bytes, \
                 which must exceed transcode_hold_max by one upstream read"
                    .into(),
            )),
            Some(limit) if written >= limit => Err(ConfigError::new(
                "buffer_limit",
                format!("{limit} does not exceed {what} ({written}): raise the listener's per_connection_buffer_limit_bytes"),
            )),
            _ => Ok(()),
        }
    }

    /// The longest body held whole to transcode: within `transcode_hold_max`, and within
    /// `transcode_max` as every transcoded body is.
    pub fn transcode_held_max(&self) -> u64 {
        self.transcode_hold_max.min(self.transcode_max)
    }

    /// The least length a body is compressed from in `coding`.
    pub fn min_length_for(&self, coding: Coding) -> u64 {
        MinLengths { plain: self.min_length, dcz: self.dictionary_min_length }.of(coding)
    }

    /// Whether a Content-Type value names a media type to compress.
    pub fn compresses_type(&self, content_type: &[u8]) -> bool {
        let media = crate::negotiate::media_type(content_type);
        let Some(slash) = media.iter().position(|&b| b == b'/') else {
            return false;
        };
        let (top, sub) = (&media[..slash], &media[slash + 1..]);
        self.patterns.iter().any(|pattern| pattern.matches(top, sub))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = Settings::default();
        assert_eq!((s.min_length, s.max_buffer, s.level, s.stream_level), (1024, MIB, Level::Auto, 1));
        assert_eq!(s.stream_delay_ms, 100);
        assert_eq!(s.offload_min_length, 128 * 1024);
        assert_eq!((s.transcode, s.transcode_max, s.transcode_hold_max), (false, 2048 * MIB, 64 * MIB));
        assert_eq!(s.transcode_budget, 1024 * MIB);
    }

    #[test]
    fn a_host_s_own_defaults_fill_what_its_json_does_not_name() {
        let wasm = |json: &[u8]| Config::from_json_over(json, Config::wasm_defaults());
        assert_eq!(wasm(b"").unwrap().transcode_max, 256 * MIB);
        let s = wasm(br#"{"transcode": true, "buffer_limit": 69206016}"#).unwrap();
        assert_eq!((s.transcode, s.transcode_max, s.buffer_limit), (true, 256 * MIB, Some(69206016)));
        assert_eq!(wasm(br#"{"transcode_max": 1024}"#).unwrap().transcode_max, 1024);
        assert!(wasm(br#"{"levle": 3}"#).unwrap_err().message.contains("levle"));
        assert_eq!(wasm(br#"[1]"#).unwrap_err().field, "config");
    }

    #[test]
    fn out_of_range_values_name_the_field_and_range() {
        let err = Config { level: Level::Fixed(13), ..Config::default() }.validate().unwrap_err();
        assert_eq!(err.field, "level");
        assert_eq!(err.to_string(), "level: must be between 1 and 12, got 13");
        let err = Config { stream_level: 0, ..Config::default() }.validate().unwrap_err();
        assert_eq!(err.field, "stream_level");
        let err =
            Config { min_length: 4096, max_buffer: 1024, ..Config::default() }.validate().unwrap_err();
        assert_eq!(err.field, "min_length");
        // dcz's threshold is not bound by max_buffer: a body past the buffer streams, dcz or not,
        // and a configuration that buffers nothing (max_buffer 0) stays valid
        assert!(Config { max_buffer: 0, min_length: 0, ..Config::default() }.validate().is_ok());
    }

    #[test]
    fn json_errors_name_the_field() {
        let err = Config::from_json(br#"{"levle": 3}"#).unwrap_err();
        assert!(err.message.contains("levle"), "{err}");
        let err = Config::from_json(br#"{"level": "six"}"#).unwrap_err();
        assert!(err.message.contains(r#"level: must be auto or a number from 1 to 12, got "six""#), "{err}");
        let err = Config::from_json(br#"{"level": 13}"#).unwrap_err();
        assert!(err.message.contains("level: must be between 1 and 12, got 13"), "{err}");
        assert!(Config::from_json(br#"{"level": true}"#).is_err());
        let err = Config::from_json(br#"{"types": ["json"]}"#).unwrap_err();
        assert_eq!(err.field, "types");
        assert_eq!(Config::from_json(b" ").unwrap(), Settings::default());
        let s = Config::from_json(br#"{"level": 9, "types": ["Application/JSON"]}"#).unwrap();
        assert_eq!(s.level, Level::Fixed(9));
        assert_eq!(Config::from_json(br#"{"level": "auto"}"#).unwrap().level, Level::Auto);
        let json = serde_json::to_string(&Config { level: Level::Fixed(3), ..Config::default() }).unwrap();
        assert!(json.contains(r#""level":3"#), "{json}");
        assert!(serde_json::to_string(&Config::default()).unwrap().contains(r#""level":"auto""#));
        assert!(s.compresses_type(b"application/json; charset=utf-8"));
        let s = Config::from_json(br#"{"beacon_network": "hoodi"}"#).unwrap();
        assert_eq!(s.beacon_network, Some(BeaconNetwork::Hoodi));
        let err = Config::from_json(br#"{"beacon_network": "goerli"}"#).unwrap_err();
        assert!(err.message.contains("goerli") && err.message.contains("holesky"), "{err}");
    }

    #[test]
    fn the_cache_section_is_off_when_absent_and_checked_when_present() {
        assert_eq!(Settings::default().cache, None);
        let s = Config::from_json(br#"{"cache": {}}"#).unwrap();
        assert_eq!(s.cache, Some(CacheConfig::default()));
        let s = Config::from_json(br#"{"cache": {"cluster": "a", "namespace": "rpc/main", "timeout_ms": 20}}"#).unwrap();
        let cache = s.cache.clone().unwrap();
        assert_eq!((cache.cluster.as_str(), cache.namespace.as_deref(), cache.timeout_ms), ("a", Some("rpc/main"), 20));
        for (json, field) in [
            (&br#"{"cache": {"timeout_ms": 0}}"#[..], "cache_timeout_ms"),
            (br#"{"cache": {"cluster": ""}}"#, "cache_cluster"),
            (br#"{"cache": {"hot_bytes": 1000}}"#, "cache_hot_bytes"),
            (br#"{"cache": {"hot_bytes": 2000000000}}"#, "cache_hot_bytes"),
            (br#"{"cache": {"namespace": ""}}"#, "cache_namespace"),
        ] {
            assert_eq!(Config::from_json(json).unwrap_err().field, field);
        }
        let err = Config::from_json(br#"{"cache": {"timeout": 5}}"#).unwrap_err();
        assert!(err.message.contains("timeout"), "{err}");
    }

    #[test]
    fn a_cache_section_that_still_shards_is_refused_with_the_way_out() {
        for json in [&br#"{"cache": {"clusters": ["a", "b"]}}"#[..], br#"{"cache": {"cluster": "a", "clusters": ["a"]}}"#] {
            let err = Config::from_json(json).unwrap_err();
            assert_eq!(err.field, "cache_clusters");
            assert!(err.message.starts_with("sharding was retired: run one daemon per host, started with --fleet"), "{err}");
            assert!(err.message.contains("Moving from shards"), "{err}");
        }
    }

    #[test]
    fn encodings_are_known_codings_each_once() {
        use crate::negotiate::Coding::*;
        assert_eq!(Config::default().encodings, [Zstd, Gzip, Br, Deflate]);
        let s = Config::from_json(br#"{"encodings": ["GZIP", "br"]}"#).unwrap();
        assert_eq!(s.encodings, [Gzip, Br]);
        assert!(serde_json::to_string(&*s).unwrap().contains(r#""encodings":["gzip","br"]"#));
        for (json, message) in [
            (&br#"{"encodings": []}"#[..], "must list at least one of dcz, zstd, br, gzip, deflate"),
            (br#"{"encodings": ["gzip", "gzip"]}"#, "lists gzip twice"),
            (br#"{"encodings": ["lz4"]}"#, r#""lz4" is not one of dcz, zstd, br, gzip, deflate"#),
            (br#"{"encodings": ["x-gzip"]}"#, r#""x-gzip" is not one of dcz, zstd, br, gzip, deflate"#),
            (br#"{"encodings": "gzip"}"#, "invalid type"),
        ] {
            let err = Config::from_json(json).unwrap_err();
            assert!(err.to_string().contains(message), "{err}");
        }
    }

    #[test]
    fn the_caches_limits_come_from_its_section_within_their_bounds() {
        let defaults = CacheSettings {
            max_request: 64 * 1024,
            max_entry: 8 * MIB as usize,
            chain_ttl_s: 3600,
            max_batch: 100,
            lookup_timeout_ms: 50,
            lock_timeout_ms: 5000,
            store_timeout_ms: 5000,
            hit_codings: vec![Coding::Zstd, Coding::Gzip, Coding::Br],
            dictionary_min_length: crate::dictionary::MIN_LENGTH,
        };
        assert_eq!(
            Settings::default().cache_settings(),
            &defaults,
            "without a cache section (the Lua binding's storage)"
        );
        let s = Config::from_json(br#"{"cache": {}}"#).unwrap();
        assert_eq!(s.cache_settings(), &defaults);
        let json = br#"{"cache": {"max_request": 300, "max_entry": 1000, "chain_ttl_s": 60, "store_timeout_s": 20,
            "max_batch": 20, "cluster": "a", "timeout_ms": 30, "lock_timeout_ms": 0}}"#;
        let s = Config::from_json(json).unwrap();
        let expected = CacheSettings {
            max_request: 300,
            max_entry: 1000,
            chain_ttl_s: 60,
            max_batch: 20,
            lookup_timeout_ms: 30,
            lock_timeout_ms: 0,
            store_timeout_ms: 20_000,
            hit_codings: vec![Coding::Zstd, Coding::Gzip, Coding::Br],
            dictionary_min_length: crate::dictionary::MIN_LENGTH,
        };
        assert_eq!(s.cache_settings(), &expected);
        let s = Config::from_json(br#"{"encodings": ["deflate", "br", "zstd"]}"#).unwrap();
        assert_eq!(s.cache_settings().hit_codings, [Coding::Br, Coding::Zstd], "the offered ones a hit splices, in order");
        for (json, message) in [
            (
                &br#"{"cache": {"max_request": 16777217}}"#[..],
                "cache_max_request: must be between 0 and 16777216, got 16777217",
            ),
            (br#"{"cache": {"max_entry": 67108865}}"#, "cache_max_entry: must be between 0 and 67108864, got 67108865"),
            (br#"{"cache": {"chain_ttl_s": 0}}"#, "cache_chain_ttl_s: must be between 1 and 86400, got 0"),
            (br#"{"cache": {"store_timeout_s": 0}}"#, "cache_store_timeout_s: must be between 1 and 60, got 0"),
            (br#"{"cache": {"store_timeout_s": 61}}"#, "cache_store_timeout_s: must be between 1 and 60, got 61"),
            (br#"{"cache": {"max_batch": 101}}"#, "cache_max_batch: must be between 0 and 100, got 101"),
            (br#"{"cache": {"lock_timeout_ms": 60001}}"#, "cache_lock_timeout_ms: must be between 0 and 60000, got 60001"),
        ] {
            assert_eq!(Config::from_json(json).unwrap_err().to_string(), message);
        }
        for (name, max) in
            [("cache_max_request", 16 * MIB), ("cache_max_entry", MAX_ENTRY), ("cache_chain_ttl_s", 86_400)]
        {
            assert!(check_field(name, max).is_ok() && check_field(name, max + 1).is_err(), "{name}");
        }
        // Envoy holds a request body the cache may take: the listener's limit must exceed it
        let check = |json: &[u8]| Config::from_json(json).unwrap().check_buffer_limit();
        let err = check(br#"{"buffer_limit": 2097152, "cache": {"max_request": 2097152}}"#).unwrap_err();
        assert!(err.message.contains("the cache's max_request (2097152)"), "{err}");
        assert!(check(br#"{"buffer_limit": 2097152, "cache": {"max_request": 1048576}}"#).is_ok());
        assert!(check(br#"{"buffer_limit": 2097152, "cache": {"enabled": false, "max_request": 4194304}}"#).is_ok());
    }

    #[test]
    fn a_buffer_limit_must_hold_what_the_filter_writes_at_once() {
        assert!(Settings::default().check_buffer_limit().is_ok(), "no limit declared, no transcoding");
        let check = |json: &[u8]| Config::from_json(json).unwrap().check_buffer_limit();
        assert_eq!(check(br#"{"transcode": true}"#).unwrap_err().field, "buffer_limit");
        assert!(check(br#"{"transcode": true, "buffer_limit": 69206016}"#).is_ok());
        let err = check(br#"{"transcode": true, "buffer_limit": 2097152}"#).unwrap_err();
        assert!(err.message.contains("transcode_hold_max (67108864)"), "{err}");
        assert!(check(br#"{"buffer_limit": 1048576}"#).unwrap_err().message.contains("max_buffer"));
        assert!(check(br#"{"buffer_limit": 2097152}"#).is_ok());
    }

    #[test]
    fn type_patterns_match_media_types_only() {
        let s = Settings::default();
        for yes in [&b"application/json"[..], b"Application/JSON ; charset=UTF-8", b"application/json-rpc"] {
            assert!(s.compresses_type(yes), "{}", String::from_utf8_lossy(yes));
        }
        // pages are nginx's gzip's and Envoy's compressor's, unless listed
        for no in [&b"application/octet-stream"[..], b"", b"json", b"application/jsonx", b"image/png", b"text/html"] {
            assert!(!s.compresses_type(no), "{}", String::from_utf8_lossy(no));
        }
        let text = Config { types: vec!["text/*".into()], ..Config::default() }.validate().unwrap();
        assert!(text.compresses_type(b"text/plain") && text.compresses_type(b"text/html"));
        let any = Config { types: vec!["*/*".into()], ..Config::default() }.validate().unwrap();
        assert!(any.compresses_type(b"application/octet-stream"));
        assert!(check_type("*/json").is_err());
        assert!(check_type("text/").is_err());
    }
}
