//! `Available-Dictionary` and dcz: any bytes as the field's lines, with or without rpcedge's own
//! hash among them, beside any Accept-Encoding. A value names the dictionary only as one
//! structured-field byte sequence that decodes to its hash; dcz goes out only to a client with one
//! such line that names dcz itself, and otherwise nothing changes what the client gets.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rpcedge_core::dictionary::{available_dictionary, is_named_by};
use rpcedge_core::{AcceptEncoding, Coding};

#[derive(Arbitrary, Debug)]
struct Case<'a> {
    accept: Vec<&'a [u8]>,
    dictionary: Vec<&'a [u8]>,
    /// Put rpcedge's own value first, with these bytes around it.
    ours: Option<(&'a [u8], &'a [u8])>,
}

fuzz_target!(|case: Case| {
    let mut lines: Vec<Vec<u8>> = case.dictionary.iter().map(|line| line.to_vec()).collect();
    if let Some((before, after)) = case.ours {
        lines.insert(0, [before, available_dictionary().as_bytes(), after].concat());
    }
    let mut with = AcceptEncoding::default();
    let mut without = AcceptEncoding::default();
    for line in &case.accept {
        with.add(line);
        without.add(line);
    }
    for line in &lines {
        with.available_dictionary(line);
    }
    let named = lines.len() == 1 && is_named_by(&lines[0]);
    let order = [&[Coding::Dcz][..], &Coding::DEFAULT_ORDER].concat();
    let chosen = with.choose(&order);
    if chosen == Some(Coding::Dcz) {
        assert!(named, "dcz without the dictionary: {lines:?}");
        // the element's token, before any parameter, is dcz itself
        let names_dcz = case.accept.iter().any(|line| {
            line.split(|&b| b == b',').any(|element| {
                element.split(|&b| b == b';').next().is_some_and(|token| token.trim_ascii().eq_ignore_ascii_case(b"dcz"))
            })
        });
        assert!(names_dcz, "dcz that the client did not name: {:?}", case.accept);
    } else {
        assert_eq!(chosen, without.choose(&Coding::DEFAULT_ORDER), "{lines:?}");
    }
    if !named {
        assert_eq!(with.rank(&order), without.rank(&order), "{lines:?}");
    }
});
