//! Making the client: the URL, TLS files, and what a failed TLS handshake means.

use leasehold_core::{Error, Result};

use crate::config::RedisConfig;

/// The client for `config`: with the configured CA and client certificate when any is set.
pub(crate) fn client(config: &RedisConfig) -> Result<redis::Client> {
    let bad_url = |e: redis::RedisError| {
        Error::invalid_argument(format!(
            "{:?} is not a usable Redis URL (e.g. redis://127.0.0.1:6379)",
            config.redacted_url()
        ))
        .with_source(e)
    };
    #[cfg(feature = "tls")]
    if config.tls != crate::config::TlsFiles::default() {
        let read = |path: &std::path::Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                Error::invalid_argument(format!("cannot read the TLS {what} {}", path.display()))
                    .with_source(e)
            })
        };
        let root_cert = match &config.tls.ca {
            Some(path) => Some(read(path, "CA file")?),
            None => None,
        };
        let client_tls = match &config.tls.client {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert, "client certificate")?,
                client_key: read(key, "client key")?,
            }),
            None => None,
        };
        return redis::Client::build_with_tls(
            config.url.as_str(),
            redis::TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        // The redis crate's own message can quote the PEM it failed on: keep only ours.
        .map_err(|e| {
            Error::invalid_argument(format!(
                "the TLS files for {} cannot be used ({:?}): check they are PEM \
                 certificates (CA, client) and a PEM private key",
                config.redacted_url(),
                e.kind()
            ))
        });
    }
    redis::Client::open(config.url.as_str()).map_err(bad_url)
}

/// A failed TLS handshake, said plainly: an untrusted certificate or a wrong host name is a setup
/// problem, not an unreachable server.
pub(crate) fn tls_error(address: &str, error: &redis::RedisError) -> Option<Error> {
    let (failure, text) = leasehold_core::TlsFailure::classify(error)?;
    let hint = match failure {
        leasehold_core::TlsFailure::UntrustedCa => {
            "the server's certificate is not signed by a trusted CA: give the CA that signed it \
             (tls_ca_file / ?tls_ca=)"
        }
        leasehold_core::TlsFailure::WrongName => {
            "the server's certificate does not name the host in the URL: connect by a name the \
             certificate lists"
        }
        leasehold_core::TlsFailure::Handshake => {
            "the TLS handshake failed: check the CA, the client certificate and the host name"
        }
    };
    Some(Error::new(
        leasehold_core::ErrorKind::StoreSetup,
        format!("TLS with Redis at {address} failed: {hint} ({text})"),
    ))
}

pub(crate) fn address_of(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other:?}"),
    }
}
