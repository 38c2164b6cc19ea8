//! The shipped `leasehold` binary against the Aerospike wire fixture speaking TLS only (a
//! certificate this test generates): TLS name, CA file and client certificate from the URL
//! (`tls_name`, `tls_ca`, `tls_cert`, `tls_key`), with a user and password over TLS; an untrusted certificate and a wrong TLS name fail
//! with errors that say so. Fixture only: a real cluster's TLS setup (its CA, its names) is not
//! something a test can generate.

use leasehold_testkit::aerospike::AerospikeFixture;
use leasehold_testkit::tls::TestPki;

mod common;
use common::{leasehold, text};

async fn tls_fixture(pki: &TestPki) -> AerospikeFixture {
    AerospikeFixture::builder()
        .tls(pki.server_cert_file(), pki.server_key_file())
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_name_a_private_ca_and_a_login_runs_a_command_under_the_lock() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let fixture = AerospikeFixture::builder()
        .tls(pki.server_cert_file(), pki.server_key_file())
        .credentials("app", "s3cret-pw")
        .start()
        .await
        .unwrap();
    let url = format!(
        "aerospike://app:s3cret-pw@{}/test?farm=farm1&tls_name=localhost&tls_ca={}&tls_cert={}&tls_key={}",
        fixture.host_string(),
        pki.ca_file().display(),
        pki.client_cert_file().display(),
        pki.client_key_file().display(),
    );
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            leasehold(
                &url,
                &["run", "tls-job", "--", "sh", "-c", "echo under-lock"],
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("under-lock"));
    let out = tokio::task::spawn_blocking(move || leasehold(&url, &["inspect", "tls-job"]))
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "released: {}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_a_wrong_name_and_no_name_say_so() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let fixture = tls_fixture(&pki).await;
    let stranger = TestPki::generate(&["localhost"]).unwrap();
    let hosts = fixture.host_string();
    let run = |url: String| async move {
        tokio::task::spawn_blocking(move || leasehold(&url, &["inspect", "k"]))
            .await
            .unwrap()
    };

    let out = run(format!(
        "aerospike://app:s3cret-pw@{hosts}/test?farm=farm1&tls_name=localhost&tls_ca={}",
        stranger.ca_file().display()
    ))
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("not signed by a trusted CA"), "{err}");
    assert!(!err.contains("s3cret-pw"), "{err}");

    let out = run(format!(
        "aerospike://{hosts}/test?farm=farm1&tls_name=wrong.example&tls_ca={}",
        pki.ca_file().display()
    ))
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("does not list the TLS name"), "{err}");

    // TLS files without a TLS name: refused before any I/O.
    let out = run(format!(
        "aerospike://{hosts}/test?farm=farm1&tls_ca={}",
        pki.ca_file().display()
    ))
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("host:tls_name:port"), "{err}");

    // Unusable key material is named by path, never quoted.
    let key = std::fs::read_to_string(pki.client_key_file()).unwrap();
    let out = run(format!(
        "aerospike://{hosts}/test?farm=farm1&tls_name=localhost&tls_ca={}&tls_cert={}&tls_key={}",
        pki.ca_file().display(),
        pki.client_key_file().display(),
        pki.client_cert_file().display(),
    ))
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains(key.lines().nth(1).unwrap()), "{err}");
    assert!(!err.contains("PRIVATE KEY"), "{err}");
}
