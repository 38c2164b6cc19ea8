//! The embedded store passes the store conformance suite.

leasehold_testkit::conformance_tests!(async { leasehold::MemoryStore::new() });
