//! The embedded-store examples run as tests, their printed output checked: each example's body is
//! a `run` function that writes to the writer it is given (stdout when the example runs on its
//! own), and is compiled into this test from the very file `cargo run --example` builds. The store
//! examples are tested in their crates (`crates/leasehold-{redis,etcd,aerospike}/tests/example.rs`).

#[allow(dead_code)] // the example's `main`
#[path = "../examples/quickstart.rs"]
mod quickstart;

#[allow(dead_code)]
#[path = "../examples/fencing.rs"]
mod fencing;

#[cfg(feature = "otel")]
#[allow(dead_code)]
#[path = "../examples/metrics.rs"]
mod metrics;

/// What an example printed, as lines.
fn lines(out: Vec<u8>) -> Vec<String> {
    String::from_utf8(out)
        .expect("examples print UTF-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The line after the one starting with `step` that contains `needle` (panics with the whole
/// output otherwise): each check is pinned to the step that prints it.
fn find<'a>(lines: &'a [String], step: &str, needle: &str) -> &'a str {
    let from = lines
        .iter()
        .position(|l| l.starts_with(step))
        .unwrap_or_else(|| panic!("no step {step:?} in:\n{}", lines.join("\n")));
    lines[from..]
        .iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} after {step:?} in:\n{}", lines.join("\n")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_shows_reentrancy_exclusion_hand_off_with_lock_and_expiry() {
    let mut out = Vec::new();
    quickstart::run(&mut out)
        .await
        .expect("the quickstart runs");
    let lines = lines(out);
    let step = |n: &str| format!("{n}. ");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
            .count(),
        4,
        "four steps:\n{}",
        lines.join("\n")
    );

    // 1: the same task counts up, another task is refused.
    find(
        &lines,
        &step("1"),
        "task A holds DC#local#quickstart#invoice-7 (fencing token Some(1))",
    );
    find(
        &lines,
        &step("1"),
        "task A takes it again: reentrant, hold count 2, same lease = true",
    );
    find(
        &lines,
        &step("1"),
        "releases the inner hold: still ours = true; still held in the store = true",
    );
    find(
        &lines,
        &step("1"),
        "task B: lock unavailable on DC#local#quickstart#invoice-7",
    );
    // 2: the waiter gets it once the holder lets go.
    find(&lines, &step("2"), "task A releases: still ours = true");
    find(&lines, &step("2"), "task B acquired after waiting");
    // 3: with_lock.
    find(
        &lines,
        &step("3"),
        "worked under DC#local#quickstart#ledger as ",
    );
    find(
        &lines,
        &step("3"),
        "work returned 42; lock free again: true",
    );
    // 4: expiry, a higher fencing token, and the late release told the truth.
    let taken = find(&lines, &step("4"), "after the TTL another task takes it");
    let tokens: Vec<u64> = taken
        .split("Some(")
        .skip(1)
        .map(|t| t.split(')').next().unwrap().parse().unwrap())
        .collect();
    assert!(tokens.len() == 2 && tokens[0] > tokens[1], "{taken}");
    find(
        &lines,
        &step("4"),
        "the old holder's late release reports: still ours = false",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_rejects_the_stale_holders_write() {
    let mut out = Vec::new();
    fencing::run(&mut out)
        .await
        .expect("the fencing example runs");
    let lines = lines(out);
    let text = lines.join("\n");
    assert_eq!(
        lines[0], "A holds the lock with fencing token 1 ... and stalls",
        "{text}"
    );
    assert_eq!(
        lines[1], "A's lease expired; B holds the lock with fencing token 2",
        "{text}"
    );
    assert_eq!(lines[2], "B writes: Ok(())", "{text}");
    assert_eq!(
        lines[3], "A wakes up and writes: Err(\"rejected: token 1 < highest seen 2\")",
        "{text}"
    );
    assert_eq!(
        lines[4], "storage holds \"written by B\"; A's release reports still ours = false",
        "{text}"
    );
}

#[cfg(feature = "otel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exports_the_instruments_and_prints_tallies_and_the_trace() {
    use opentelemetry_sdk::metrics::InMemoryMetricExporter;

    let exporter = InMemoryMetricExporter::default();
    let mut out = Vec::new();
    metrics::run(exporter.clone(), &mut out)
        .await
        .expect("the metrics example runs");
    let lines = lines(out);
    let text = lines.join("\n");

    // Six workers, each acquiring at least once over two seconds.
    let mut acquired = 0;
    for worker in 0..6 {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("worker {worker}: acquired ")))
            .unwrap_or_else(|| panic!("no tally of worker {worker}:\n{text}"));
        let won: u64 = line["worker 0: acquired ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(won >= 1, "{line}");
        acquired += won;
    }
    // The last five trace entries, each an event on one of the two hot keys.
    let trace = lines
        .iter()
        .position(|l| l == "last lock trace entries:")
        .unwrap_or_else(|| panic!("no trace:\n{text}"));
    let entries = &lines[trace + 1..];
    assert_eq!(entries.len(), 5, "{text}");
    for entry in entries {
        assert!(entry.starts_with("  DC#local#metrics-demo#hot-"), "{entry}");
    }

    // The exporter saw the instruments, and the acquisition counter agrees with the tallies.
    let metrics = exporter.get_finished_metrics().unwrap();
    let names: std::collections::BTreeSet<String> = metrics
        .iter()
        .flat_map(|rm| rm.scope_metrics())
        .flat_map(|scope| scope.metrics())
        .map(|m| m.name().to_owned())
        .collect();
    for name in [
        "leasehold.acquisitions",
        "leasehold.acquire.duration",
        "leasehold.releases",
        "leasehold.locks.held",
    ] {
        assert!(names.contains(name), "{name} not exported: {names:?}");
    }
    let last = metrics.last().expect("exported at shutdown");
    let counted = acquisitions(last, "acquired");
    assert_eq!(counted, acquired, "the counter and the tallies agree");
}

/// The cumulative count of `leasehold.acquisitions` with this outcome in one export.
#[cfg(feature = "otel")]
fn acquisitions(metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics, outcome: &str) -> u64 {
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    let mut total = 0;
    for scope in metrics.scope_metrics() {
        for metric in scope
            .metrics()
            .filter(|m| m.name() == "leasehold.acquisitions")
        {
            if let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() {
                total += sum
                    .data_points()
                    .filter(|p| {
                        p.attributes()
                            .any(|kv| kv.key.as_str() == "outcome" && kv.value.as_str() == outcome)
                    })
                    .map(|p| p.value())
                    .sum::<u64>();
            }
        }
    }
    total
}
