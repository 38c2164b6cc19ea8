use super::*;
use crate::layers::test_support::{key, req};
use leasehold_testkit::scripted::ScriptedStore;

#[tokio::test]
async fn counts_each_request_kind() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    scripted.grant_extend().expect_inspect(Ok(None));
    let layer = CountingLayer::new();
    let store = layer.layer(scripted.clone());
    let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
    let lease = store.extend(&lease, Duration::from_secs(2)).await.unwrap();
    store.inspect(&key("a")).await.unwrap();
    store.release(&lease).await.unwrap();
    let counts = layer.counts();
    assert_eq!(
        (
            counts.acquires(),
            counts.extends(),
            counts.inspects(),
            counts.releases()
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(counts.total(), 4);
    counts.reset();
    assert_eq!(counts.total(), 0);
    scripted.verify();
}
