//! Accept-Encoding negotiation: any bytes, in any number of field lines. Repeated lines are one
//! list, so adding them one by one must choose what their comma-joined value chooses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::AcceptEncoding;

fuzz_target!(|lines: Vec<&[u8]>| {
    let mut each = AcceptEncoding::default();
    for line in &lines {
        each.add(line);
    }
    if lines.is_empty() {
        assert_eq!(each.choose(), None, "no field: identity");
        return;
    }
    let joined = AcceptEncoding::parse(&lines.join(&b","[..]));
    assert_eq!(each.choose(), joined.choose(), "{lines:?}");
});
