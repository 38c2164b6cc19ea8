//! What the CLI test binaries share: running the built `leasehold` against a store URL.

use std::process::{Command, Output};

/// Runs `leasehold ARGS` with `LEASEHOLD_STORE=store` and waits for it.
pub(crate) fn leasehold(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_STORE", store)
        .args(args)
        .output()
        .expect("the leasehold binary runs")
}

/// Output bytes as text, for assertions and failure messages.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
