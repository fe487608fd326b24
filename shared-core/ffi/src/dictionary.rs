//! The dcz dictionary's reply, for a host that serves it from a location of its own (nginx's
//! `rpcedge_dictionary`, the Lua binding): made once per location for its `match` pattern, then
//! asked per request.

use std::ptr;

use rpcedge_core::config::ConfigError;
use rpcedge_core::dictionary::{check_pattern, serve, Served};

use crate::{bytes, guard, panicked, put, write_error, RpcedgeError, RpcedgeHeader};

/// A location's dictionary replies, each made once for its `match` pattern.
pub struct RpcedgeDictionary {
    pattern: String,
    /// The replies by status, with the headers in the form the reply points at.
    replies: Vec<(Served, Vec<RpcedgeHeader>)>,
}

/// The reply to send: its status, headers and body (empty for a 304 or 405, and to HEAD, whose
/// body the host drops), valid as long as the dictionary handle.
#[repr(C)]
pub struct RpcedgeDictionaryReply {
    pub status: u16,
    pub headers: *const RpcedgeHeader,
    pub headers_len: usize,
    pub body: *const u8,
    pub body_len: usize,
}

/// Makes the replies for a `match` pattern (a path pattern that fits in a header); NULL with
/// `err` filled in when the pattern does not.
///
/// # Safety
/// `pattern` points to `len` readable bytes; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_dictionary_new(pattern: *const u8, len: usize, err: *mut RpcedgeError) -> *mut RpcedgeDictionary {
    let result = guard(Err(panicked()), || {
        let pattern = String::from_utf8_lossy(bytes(pattern, len)).into_owned();
        check_pattern(&pattern).map_err(|message| ConfigError { field: "rpcedge_dictionary".into(), message })?;
        // every status it can answer with: to a GET, to a revalidation, to another method
        let replies = [serve(b"GET", None, &pattern), serve(b"GET", Some(b"*"), &pattern), serve(b"POST", None, &pattern)]
            .into_iter()
            .map(|served| {
                let headers = served
                    .headers
                    .iter()
                    .map(|(name, value)| RpcedgeHeader {
                        name: name.as_ptr(),
                        name_len: name.len(),
                        value: value.as_ptr(),
                        value_len: value.len(),
                    })
                    .collect();
                (served, headers)
            })
            .collect();
        Ok(RpcedgeDictionary { pattern, replies })
    });
    match result {
        Ok(dictionary) => Box::into_raw(Box::new(dictionary)),
        Err(error) => {
            write_error(err, &error);
            ptr::null_mut()
        }
    }
}

/// The reply to a request for the dictionary with this method and If-None-Match (NULL: none);
/// 0 when filled in, -1 when `dictionary` is NULL.
///
/// # Safety
/// `dictionary` came from `rpcedge_dictionary_new`; the byte strings are readable; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_dictionary_reply(
    dictionary: *const RpcedgeDictionary,
    method: *const u8,
    method_len: usize,
    if_none_match: *const u8,
    if_none_match_len: usize,
    out: *mut RpcedgeDictionaryReply,
) -> i32 {
    let Some(dictionary) = dictionary.as_ref() else { return -1 };
    guard(-1, || {
        let if_none_match = (!if_none_match.is_null()).then(|| bytes(if_none_match, if_none_match_len));
        let status = serve(bytes(method, method_len), if_none_match, &dictionary.pattern).status;
        let Some((served, headers)) = dictionary.replies.iter().find(|(served, _)| served.status == status) else {
            return -1;
        };
        put(
            out,
            RpcedgeDictionaryReply {
                status,
                headers: headers.as_ptr(),
                headers_len: headers.len(),
                body: served.body.as_ptr(),
                body_len: served.body.len(),
            },
        );
        0
    })
}

/// # Safety
/// `dictionary` came from `rpcedge_dictionary_new` and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_dictionary_free(dictionary: *mut RpcedgeDictionary) {
    if !dictionary.is_null() {
        guard((), || drop(Box::from_raw(dictionary)));
    }
}
