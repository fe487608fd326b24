//! Settings: a host's configuration checked by the core, made once per configuration and shared
//! by the exchanges made from it.

use std::ffi::{c_char, CStr};
use std::ptr;
use std::slice;
use std::sync::Arc;

use rpcedge_core::config::{
    check_field, check_type, parse_beacon_network, parse_encoding, CacheConfig, Config, ConfigError, Level, Settings,
};
use rpcedge_core::node::Node;
use rpcedge_core::transcode::BeaconNetwork;

use crate::{bytes, guard, panicked, put, write_error, RpcedgeError, RpcedgeStr};

/// Opaque validated settings, and what their exchanges learn about the node.
pub struct RpcedgeSettings(pub(crate) Arc<Settings>, pub(crate) Arc<Node>);

/// The configuration as a host with its own parser (nginx) holds it.
#[repr(C)]
pub struct RpcedgeConfig {
    pub min_length: u64,
    /// `min_length` for dcz.
    pub dictionary_min_length: u64,
    pub max_buffer: u64,
    /// 0: `auto` (by the body's size); else a libdeflate level, 1 to 12.
    pub level: u32,
    pub stream_level: u32,
    pub stream_delay_ms: u64,
    pub offload_min_length: u64,
    /// Non-zero: transcode for clients that ask for SSZ.
    pub transcode: u8,
    pub transcode_max: u64,
    pub transcode_hold_max: u64,
    pub transcode_budget: u64,
    /// Non-zero: ask the node for SSZ and render JSON clients' answers here.
    pub transcode_upstream_ssz: u8,
    /// The beacon chain whose fork digests frame light client updates (`rpcedge_parse_beacon_network`);
    /// 0: none.
    pub beacon_network: u32,
    /// Media type patterns; none at all means the defaults.
    pub types: *const RpcedgeStr,
    pub types_len: usize,
    /// The codings made, in the server's order of preference (each `rpcedge_check_encoding`);
    /// none at all means the defaults.
    pub encodings: *const RpcedgeStr,
    pub encodings_len: usize,
    /// The cache's settings (nginx's `rpcedge_cache_*` directives): the timeouts (the store's the
    /// host applies itself; each lookup call says its own) and the limits its exchanges run with.
    pub cache_timeout_ms: u64,
    pub cache_store_timeout_s: u64,
    pub cache_max_request: u64,
    pub cache_max_entry: u64,
    pub cache_chain_ttl_s: u64,
    pub cache_max_batch: u64,
    /// How long a miss waits for another request's answer for its key; 0: never.
    pub cache_lock_timeout_ms: u64,
    /// The cache's status header on answers, and its reason in it (0 or 1).
    pub cache_status_header: u8,
    pub cache_status_reason: u8,
}

/// Checks one numeric setting by name (e.g. "level"); 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `field` is NULL or a NUL-terminated string; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_check_field(field: *const c_char, value: u64, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || {
        if field.is_null() {
            return Err(ConfigError { field: "config".into(), message: "no field named".into() });
        }
        let name = CStr::from_ptr(field).to_string_lossy();
        check_field(&name, value)
    });
    result.map_or_else(|e| { write_error(err, &e); -1 }, |()| 0)
}

/// Checks one media type pattern; 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `pattern` points to `len` readable bytes; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_check_type(pattern: *const u8, len: usize, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || check_type(&String::from_utf8_lossy(bytes(pattern, len))));
    result.map_or_else(|e| { write_error(err, &e); -1 }, |()| 0)
}

/// Checks one coding of `encodings` (`dcz`, `zstd`, `br`, `gzip` or `deflate`); 0 when valid, -1 with
/// `err` filled in.
///
/// # Safety
/// `value` points to `len` readable bytes; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_check_encoding(value: *const u8, len: usize, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || parse_encoding(&String::from_utf8_lossy(bytes(value, len))).map(drop));
    result.map_or_else(|e| { write_error(err, &e); -1 }, |()| 0)
}

/// Parses a `level` value (`auto` or 1 to 12) into `out` in `RpcedgeConfig`'s form (0: auto);
/// 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `value` points to `len` readable bytes; `out` and `err` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_parse_level(value: *const u8, len: usize, out: *mut u32, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || Level::parse(&String::from_utf8_lossy(bytes(value, len))));
    match result {
        Ok(level) => {
            if !out.is_null() {
                *out = level.to_raw();
            }
            0
        }
        Err(e) => {
            write_error(err, &e);
            -1
        }
    }
}

/// Parses a `beacon_network` value (`off`, `mainnet`, `sepolia`, `hoodi` or `holesky`) into `out`
/// in `RpcedgeConfig`'s form (0: off); 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `value` points to `len` readable bytes; `out` and `err` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_parse_beacon_network(
    value: *const u8,
    len: usize,
    out: *mut u32,
    err: *mut RpcedgeError,
) -> i32 {
    let result = guard(Err(panicked()), || parse_beacon_network(&String::from_utf8_lossy(bytes(value, len))));
    match result {
        Ok(network) => {
            put(out, BeaconNetwork::to_raw(network));
            0
        }
        Err(e) => {
            write_error(err, &e);
            -1
        }
    }
}

/// Validates a configuration; NULL with `err` filled in when a value is out of range.
///
/// # Safety
/// `config` is NULL or valid, its `types` array holds `types_len` valid strings; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_new(config: *const RpcedgeConfig, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    let result = guard(Err(panicked()), || {
        let Some(c) = config.as_ref() else {
            return Err(ConfigError { field: "config".into(), message: "no configuration given".into() });
        };
        let types = if c.types_len == 0 || c.types.is_null() {
            Config::default().types
        } else {
            slice::from_raw_parts(c.types, c.types_len)
                .iter()
                .map(|t| String::from_utf8_lossy(bytes(t.data, t.len)).into_owned())
                .collect()
        };
        let encodings = if c.encodings_len == 0 || c.encodings.is_null() {
            Config::default().encodings
        } else {
            slice::from_raw_parts(c.encodings, c.encodings_len)
                .iter()
                .map(|e| parse_encoding(&String::from_utf8_lossy(bytes(e.data, e.len))))
                .collect::<Result<_, _>>()?
        };
        let cache = CacheConfig {
            timeout_ms: c.cache_timeout_ms,
            store_timeout_s: c.cache_store_timeout_s,
            max_request: c.cache_max_request,
            max_entry: c.cache_max_entry,
            chain_ttl_s: c.cache_chain_ttl_s,
            max_batch: c.cache_max_batch,
            lock_timeout_ms: c.cache_lock_timeout_ms,
            status_header: c.cache_status_header != 0,
            status_reason: c.cache_status_reason != 0,
            ..CacheConfig::default()
        };
        Config {
            min_length: c.min_length,
            dictionary_min_length: c.dictionary_min_length,
            max_buffer: c.max_buffer,
            level: Level::from_raw(c.level),
            stream_level: c.stream_level,
            encodings,
            stream_delay_ms: c.stream_delay_ms,
            offload_min_length: c.offload_min_length,
            transcode: c.transcode != 0,
            transcode_max: c.transcode_max,
            transcode_hold_max: c.transcode_hold_max,
            transcode_budget: c.transcode_budget,
            transcode_upstream_ssz: c.transcode_upstream_ssz != 0,
            beacon_network: BeaconNetwork::from_raw(c.beacon_network),
            buffer_limit: None,
            dictionary: None,
            types,
            cache: None,
        }
        .validate_with(&cache)
    });
    settings_handle(result, err)
}

/// Validates a JSON configuration (as Envoy and the Lua binding hold it); an empty one means the
/// defaults.
///
/// # Safety
/// `json` points to `len` readable bytes; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_from_json(json: *const u8, len: usize, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    let result = guard(Err(panicked()), || Config::from_json(bytes(json, len)));
    settings_handle(result, err)
}

fn settings_handle(result: Result<Settings, ConfigError>, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    match result {
        Ok(settings) => Box::into_raw(Box::new(RpcedgeSettings(Arc::new(settings), Arc::default()))),
        Err(e) => {
            write_error(err, &e);
            ptr::null_mut()
        }
    }
}

/// The defaults, for a host that sets only some fields.
#[no_mangle]
pub extern "C" fn rpcedge_config_default() -> RpcedgeConfig {
    let (d, cache) = (Config::default(), CacheConfig::default());
    RpcedgeConfig {
        min_length: d.min_length,
        dictionary_min_length: d.dictionary_min_length,
        max_buffer: d.max_buffer,
        level: d.level.to_raw(),
        stream_level: d.stream_level,
        stream_delay_ms: d.stream_delay_ms,
        offload_min_length: d.offload_min_length,
        transcode: d.transcode.into(),
        transcode_max: d.transcode_max,
        transcode_hold_max: d.transcode_hold_max,
        transcode_budget: d.transcode_budget,
        transcode_upstream_ssz: d.transcode_upstream_ssz.into(),
        beacon_network: BeaconNetwork::to_raw(d.beacon_network),
        types: ptr::null(),
        types_len: 0,
        encodings: ptr::null(),
        encodings_len: 0,
        cache_timeout_ms: cache.timeout_ms,
        cache_store_timeout_s: cache.store_timeout_s,
        cache_max_request: cache.max_request,
        cache_max_entry: cache.max_entry,
        cache_chain_ttl_s: cache.chain_ttl_s,
        cache_max_batch: cache.max_batch,
        cache_lock_timeout_ms: cache.lock_timeout_ms,
        cache_status_header: cache.status_header.into(),
        cache_status_reason: cache.status_reason.into(),
    }
}

/// # Safety
/// `settings` came from `rpcedge_settings_new` or `_from_json` and is freed once; exchanges made
/// from it keep their own reference.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_free(settings: *mut RpcedgeSettings) {
    if !settings.is_null() {
        guard((), || drop(Box::from_raw(settings)));
    }
}
