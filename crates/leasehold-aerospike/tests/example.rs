//! `examples/aerospike.rs` runs as a test against the testkit's Aerospike wire fixture, its printed
//! lines checked. The example's body is compiled in from the very file
//! `cargo run -p leasehold-aerospike --example aerospike` builds.

#[allow(dead_code)] // the example's `main`
#[path = "../../../examples/aerospike.rs"]
mod example;

use leasehold_testkit::aerospike::AerospikeFixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aerospike_example_runs_and_says_what_happened() {
    let fixture = AerospikeFixture::builder()
        .namespace("test")
        .start()
        .await
        .expect("start the fixture");
    let mut out = Vec::new();
    example::run(&fixture.host_string(), "test", &mut out)
        .await
        .expect("the example runs");
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with(
            "holding DC#farm1#orders#order-42 in set DC#farm1#distributed_lock, user key \
             orders#order-42 (fencing token "
        ),
        "{text}"
    );
    assert!(lines[1].starts_with("inspect: holder "), "{text}");
    assert!(
        lines[2]
            .starts_with("another task's try_lock: lock unavailable on DC#farm1#orders#order-42"),
        "{text}"
    );
    assert_eq!(lines[3], "listed: [\"DC#farm1#orders#order-42\"]", "{text}");
    assert_eq!(lines[4], "release: still ours = true", "{text}");
    // The record is gone.
    assert_eq!(
        fixture.record_count("DC#farm1#distributed_lock"),
        0,
        "{text}"
    );
}
