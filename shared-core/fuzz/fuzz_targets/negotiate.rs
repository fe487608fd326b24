//! Accept-Encoding and Accept negotiation: any bytes, in any number of field lines. Repeated
//! lines are one list, so adding them one by one must choose what their comma-joined value
//! chooses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::{Accept, AcceptEncoding, MediaType};

fuzz_target!(|lines: Vec<&[u8]>| {
    let mut each = AcceptEncoding::default();
    let mut each_media = Accept::default();
    for line in &lines {
        each.add(line);
        each_media.add(line);
    }
    if lines.is_empty() {
        assert_eq!(each.choose(), None, "no field: identity");
        assert_eq!(each_media.choose(), Some(MediaType::Json), "no field: JSON");
        return;
    }
    let joined = lines.join(&b","[..]);
    assert_eq!(each.choose(), AcceptEncoding::parse(&joined).choose(), "{lines:?}");
    assert_eq!(each_media.choose(), Accept::parse(&joined).choose(), "{lines:?}");
});
