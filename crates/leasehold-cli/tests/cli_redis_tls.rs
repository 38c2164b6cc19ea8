//! The shipped `leasehold` binary against a real TLS redis-server (`--port 0 --tls-port …`,
//! started here with certificates this test generates): `rediss://` works out of the box, with a
//! private CA and an optional client certificate from the URL (`tls_ca`, `tls_cert`, `tls_key`);
//! an untrusted certificate and a wrong host name fail with errors that say so; passwords and key
//! material never show. A `redis-server` built without TLS fails these tests with a message
//! saying so (never skipped).

use std::path::Path;

use leasehold_testkit::redis::RedisServer;
use leasehold_testkit::tls::TestPki;

mod common;
use common::{leasehold, text};

fn tls_server(pki: &TestPki, require_client_cert: bool) -> RedisServer {
    RedisServer::start_tls(pki, require_client_cert).unwrap_or_else(|e| {
        panic!("cannot start a TLS redis-server (`redis-server --tls-port`): {e}")
    })
}

fn url(host: &str, server: &RedisServer, query: &[(&str, &Path)]) -> String {
    let query: Vec<String> = query
        .iter()
        .map(|(k, v)| format!("{k}={}", v.display()))
        .collect();
    format!("rediss://{host}:{}/?{}", server.port(), query.join("&"))
}

#[test]
fn rediss_with_a_private_ca_runs_a_command_under_the_lock() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = tls_server(&pki, false);
    let store = url("localhost", &server, &[("tls_ca", &pki.ca_file())]);
    let out = leasehold(
        &store,
        &["run", "tls-job", "--", "sh", "-c", "echo under-lock"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("under-lock"));
    let out = leasehold(&store, &["inspect", "tls-job"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "released: {}",
        text(&out.stderr)
    );
}

#[test]
fn a_client_certificate_is_presented_when_the_server_requires_one() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = tls_server(&pki, true);
    let with_cert = url(
        "localhost",
        &server,
        &[
            ("tls_ca", &pki.ca_file()),
            ("tls_cert", &pki.client_cert_file()),
            ("tls_key", &pki.client_key_file()),
        ],
    );
    let out = leasehold(&with_cert, &["run", "mtls-job", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let without = url("localhost", &server, &[("tls_ca", &pki.ca_file())]);
    let out = leasehold(&without, &["inspect", "mtls-job"]);
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "refused without a certificate");
    assert_ne!(out.status.code(), Some(1), "not a 'not held' answer: {err}");
    assert!(
        err.contains(&format!("localhost:{}", server.port())),
        "{err}"
    );
}

#[test]
fn an_untrusted_certificate_and_a_wrong_host_name_say_so() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = tls_server(&pki, false);

    // Signed by a CA the client does not trust.
    let stranger = TestPki::generate(&["localhost"]).unwrap();
    let out = leasehold(
        &url("localhost", &server, &[("tls_ca", &stranger.ca_file())]),
        &["inspect", "k"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("not signed by a trusted CA"), "{err}");
    assert!(err.contains("tls_ca"), "says what to do: {err}");

    // The certificate names `localhost`, the URL 127.0.0.1.
    let out = leasehold(
        &url("127.0.0.1", &server, &[("tls_ca", &pki.ca_file())]),
        &["inspect", "k"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("does not name the host"), "{err}");
}

#[test]
fn passwords_and_key_material_never_show() {
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = tls_server(&pki, false);
    let stranger = TestPki::generate(&["localhost"]).unwrap();
    // A failing connection with a password in the URL.
    let store = format!(
        "rediss://alice:s3cret-pw@localhost:{}/?tls_ca={}",
        server.port(),
        stranger.ca_file().display()
    );
    let out = leasehold(&store, &["inspect", "k"]);
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(!err.contains("s3cret-pw"), "{err}");

    // Unusable TLS files: the key given as the certificate and the other way round.
    let key_pem = std::fs::read_to_string(pki.client_key_file()).unwrap();
    let key_body = key_pem.lines().nth(1).unwrap().to_owned();
    let store = url(
        "localhost",
        &server,
        &[
            ("tls_ca", &pki.ca_file()),
            ("tls_cert", &pki.client_key_file()),
            ("tls_key", &pki.client_cert_file()),
        ],
    );
    let out = leasehold(&store, &["inspect", "k"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "bad input: {err}");
    assert!(!err.contains(&key_body), "{err}");
    assert!(!err.contains("PRIVATE KEY"), "{err}");

    // A missing file is named before any I/O.
    let out = leasehold(
        &url(
            "localhost",
            &server,
            &[("tls_ca", Path::new("/nonexistent/ca.pem"))],
        ),
        &["inspect", "k"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}
