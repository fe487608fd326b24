//! The committed C header is exactly what cbindgen makes of the current ABI.

use std::path::Path;

#[test]
fn committed_header_matches_the_abi() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen runs")
        .write(&mut generated);
    let path = crate_dir.join("include/rpcedge.h");
    if std::env::var_os("RPCEDGE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/rpcedge.h is stale: run `RPCEDGE_BLESS=1 cargo test -p rpcedge-ffi --test c_header`"
    );
}

/// LuaJIT cannot parse the generated header, so the Lua binding declares the part of the ABI it
/// uses in its own `ffi.cdef` (in its `resty.rpcedge.abi` module): every declaration and constant
/// there must be the header's.
#[test]
fn lua_declarations_match_the_header() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(crate_dir.join("include/rpcedge.h")).unwrap();
    let lua = std::fs::read_to_string(crate_dir.join("../../nginx-module/lua/resty/rpcedge/abi.lua")).unwrap();
    let declared = statements(&header);
    let cdef = lua.split_once("ffi.cdef[[").and_then(|(_, rest)| rest.split_once("]]")).expect("an ffi.cdef").0;
    let used = statements(cdef);
    assert!(used.len() > 10, "the cdef was read");
    for statement in &used {
        assert!(declared.contains(statement), "the Lua cdef declares what rpcedge.h does not: {statement}");
    }

    let defines: Vec<_> = header.lines().filter_map(|line| line.strip_prefix("#define RPCEDGE_")).collect();
    let constants = lua.split_once("-- rpcedge.h's constants\n").expect("the constants").1;
    let mut checked = 0;
    for line in constants.lines().take_while(|line| line.starts_with("local ")) {
        let (names, values) = line["local ".len()..].split_once('=').unwrap();
        for (name, value) in names.split(',').zip(values.split(',')) {
            let define = format!("{} {}", name.trim(), value.trim());
            assert!(defines.contains(&define.as_str()), "rpcedge.h has no #define RPCEDGE_{define}");
            checked += 1;
        }
    }
    assert!(checked >= 4, "the constants were read");
}

/// C's top-level statements, without comments or preprocessor lines, whitespace collapsed.
/// (`extern "C"` braces are dropped with their lines: cbindgen puts each on a line of its own.)
fn statements(c: &str) -> Vec<String> {
    let mut text = String::new();
    let mut rest = c;
    while let Some((before, after)) = rest.split_once("/*") {
        text.push_str(before);
        rest = after.split_once("*/").map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    let code: Vec<_> = text
        .lines()
        // C++'s `extern "C" { ... }` around the functions is not C
        .filter(|line| !line.trim_start().starts_with('#') && !line.contains("extern \"C\""))
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect();
    let code = code.join(" ");
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (at, c) in code.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ';' if depth == 0 => {
                out.push(code[start..=at].split_whitespace().collect::<Vec<_>>().join(" "));
                start = at + 1;
            }
            _ => {}
        }
    }
    out
}
