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
        "include/rpcedge.h is stale: run `RPCEDGE_BLESS=1 cargo test -p rpcedge-core --test c_header`"
    );
}
