//! Accept-Encoding and Accept negotiation: any bytes, in any number of field lines. Repeated
//! lines are one list, so adding them one by one must choose what their comma-joined value
//! chooses; what is chosen is one of the server's codings, and whether any is chosen does not
//! depend on the server's order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::{Accept, AcceptEncoding, Coding, MediaType};

fuzz_target!(|lines: Vec<&[u8]>| {
    let mut each = AcceptEncoding::default();
    let mut each_media = Accept::default();
    for line in &lines {
        each.add(line);
        each_media.add(line);
    }
    let order = Coding::DEFAULT_ORDER;
    let mut reversed = order;
    reversed.reverse();
    if lines.is_empty() {
        assert_eq!(each.choose(&order), None, "no field: identity");
        assert_eq!(each_media.choose(), Some(MediaType::Json), "no field: JSON");
        return;
    }
    let joined = lines.join(&b","[..]);
    assert_eq!(each.choose(&order), AcceptEncoding::parse(&joined).choose(&order), "{lines:?}");
    assert_eq!(each.choose(&order).is_some(), each.choose(&reversed).is_some(), "{lines:?}");
    assert_eq!(each.choose(&order[2..]).filter(|c| !order[2..].contains(c)), None, "{lines:?}");
    assert_eq!(each_media.choose(), Accept::parse(&joined).choose(), "{lines:?}");
});
