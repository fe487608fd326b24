// Empty: this package only pins the nginx-src crate (Cargo.toml).
