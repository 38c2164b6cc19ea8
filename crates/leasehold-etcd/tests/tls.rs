//! `etcds://` against a real etcd whose client port speaks TLS only (certificates this test
//! generates): a private CA from the URL, a client certificate for `--client-cert-auth`, and an
//! untrusted certificate failing as a setup error that says so.

use std::time::Duration;

use leasehold::core::Acquire;
use leasehold::{LockKey, LockStore, OwnerToken};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::tls::TestPki;

fn acquire() -> Acquire {
    Acquire::new(
        LockKey::dc("f1", "tls", "job").unwrap(),
        OwnerToken::generate(),
        Duration::from_secs(10),
    )
}

async fn round_trip(store: &EtcdStore) {
    let lease = store
        .try_acquire(&acquire())
        .await
        .expect("acquire over TLS");
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_with_a_private_ca_and_a_client_certificate() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = EtcdServer::start_tls(&pki, true).expect("a TLS etcd");
    let url = format!(
        "{}?tls_ca={}&tls_cert={}&tls_key={}",
        server.url(),
        pki.ca_file().display(),
        pki.client_cert_file().display(),
        pki.client_key_file().display()
    );
    let store = EtcdStore::connect(EtcdConfig::from_url(&url).unwrap())
        .await
        .expect("connect over TLS with a client certificate");
    round_trip(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_without_the_ca_is_a_setup_error_saying_so() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let other = TestPki::generate(&["localhost"]).unwrap();
    let server = EtcdServer::start_tls(&pki, false).expect("a TLS etcd");
    let url = format!("{}?tls_ca={}", server.url(), other.ca_file().display());
    let err = EtcdStore::connect(
        EtcdConfig::from_url(&url)
            .unwrap()
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    leasehold_testkit::tls::assert_untrusted_ca(&err);

    let url = format!("{}?tls_ca={}", server.url(), pki.ca_file().display());
    let store = EtcdStore::connect(EtcdConfig::from_url(&url).unwrap())
        .await
        .expect("the right CA works");
    round_trip(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_set_in_the_builder_speaks_tls_to_plain_endpoints() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = EtcdServer::start_tls(&pki, true).expect("a TLS etcd");
    let config = EtcdConfig::new([format!("localhost:{}", server.addr().port())])
        .tls_ca_file(pki.ca_file())
        .tls_client_cert(pki.client_cert_file(), pki.client_key_file());
    assert!(config.endpoints()[0].starts_with("https://"), "{config:?}");
    let store = EtcdStore::connect(config)
        .await
        .expect("connect over TLS with a client certificate");
    round_trip(&store).await;
}
