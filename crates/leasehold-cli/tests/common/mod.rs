//! What the CLI test binaries share: running the built `leasehold` against a store URL.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

/// Runs `leasehold ARGS` with `LEASEHOLD_STORE=store` and waits for it.
pub(crate) fn leasehold(store: &str, args: &[&str]) -> Output {
    output(command(store).args(args))
}

/// The `leasehold` command with `LEASEHOLD_STORE=store`, for arguments to be added.
pub(crate) fn command(store: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.env("LEASEHOLD_STORE", store);
    cmd
}

/// Runs `cmd` and waits for it.
pub(crate) fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("the leasehold binary runs")
}

/// Output bytes as text, for assertions and failure messages.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Starts `leasehold run ARGS… -- sh -c SCRIPT` and waits until the script prints `ready`.
pub(crate) fn started(store: &str, args: &[&str], script: &str) -> Child {
    let mut child = command(store)
        .arg("run")
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn run");
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .any(|l| l.map(|l| l.trim() == "ready").unwrap_or(false));
    assert!(ready, "the command under the lock started");
    child
}
