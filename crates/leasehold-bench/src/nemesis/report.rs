//! The table a run prints: one Markdown row per run, the header first, and the details below it
//! (failure kinds, fault errors, examples of overlaps and violations).

use std::fmt::Write;

use super::checker::Verdict;

/// The table's header (two lines).
pub const HEADER: &str = "| store | faults injected | acquisitions | writes accepted / rejected | \
fence violations: writes accepted out of order / acquisitions sharing a token | overlap incidents while both believed they held (with a paused client) | \
overlap incidents among holders the store kept | losses reported / silent | client pauses: late write rejected / loss \
reported | failed acquisitions (longest) | longest gap between grants | left behind |\n\
|---|---|---|---|---|---|---|---|---|---|---|---|";

/// One row for `label` (the store and its settings).
pub fn row(label: &str, v: &Verdict) -> String {
    let faults = if v.faults.is_empty() {
        "none".to_owned()
    } else {
        v.faults
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pauses = if v.client_pauses == 0 {
        "—".to_owned()
    } else {
        format!(
            "{} of {} / {} of {}",
            v.late_write_rejected, v.client_pauses, v.pause_loss_reported, v.client_pauses
        )
    };
    format!(
        "| {label} | {faults} | {} | {} / {} | {} / {} | {} ({}) | {} | {} / {} | {pauses} | {} ({:.0} ms) | {:.0} ms | {} |",
        v.acquisitions,
        v.writes_accepted,
        v.writes_rejected,
        v.out_of_order,
        v.shared_tokens,
        v.overlaps,
        v.overlaps_paused,
        v.overlaps_kept,
        v.lost_reported,
        v.lost_silent,
        v.acquire_failures,
        v.longest_failed_ms,
        v.longest_gap_ms,
        v.left_behind.as_deref().unwrap_or("nothing"),
    )
}

/// The details under a row.
pub fn details(v: &Verdict) -> String {
    let mut out = String::new();
    if !v.failure_kinds.is_empty() {
        let kinds: Vec<String> = v
            .failure_kinds
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        let _ = writeln!(out, "- failed acquisitions by kind: {}", kinds.join(", "));
    }
    for (what, counts) in [
        ("failed acquisitions", &v.failures_by_fault),
        ("silent losses", &v.silent_by_fault),
        ("acquisitions sharing a token", &v.shared_by_fault),
    ] {
        if !counts.is_empty() {
            let by: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
            let _ = writeln!(out, "- {what} by the fault in progress: {}", by.join(", "));
        }
    }
    if v.lapsed_in_release > 0 {
        let _ = writeln!(
            out,
            "- releases that found the lock gone, nobody else granted it before the release: {}",
            v.lapsed_in_release
        );
    }
    if v.release_failed > 0 {
        let _ = writeln!(out, "- releases that failed: {}", v.release_failed);
    }
    if v.late_write_accepted_alone > 0 {
        let _ = writeln!(
            out,
            "- client pauses whose late write was accepted because no other holder had written \
             meanwhile: {}",
            v.late_write_accepted_alone
        );
    }
    if v.stuck_workers > 0 {
        let _ = writeln!(out, "- workers killed at the end: {}", v.stuck_workers);
    }
    for error in &v.fault_errors {
        let _ = writeln!(out, "- fault not completed: {error}");
    }
    for example in &v.examples {
        let _ = writeln!(out, "- {example}");
    }
    out
}
