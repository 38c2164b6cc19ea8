//! What a failed connect means — a TLS failure or refused credentials is a setup problem, not an
//! unreachable cluster — and the TLS options built from the configured files.

use leasehold_core::{Error, ErrorKind};

/// A failed TLS handshake, said plainly, with the client's error as its cause: an untrusted
/// certificate or a wrong host name is a setup problem, not an unreachable cluster. Any other
/// error is handed back.
pub(crate) fn tls_error(
    address: &str,
    error: etcd_client::Error,
) -> std::result::Result<Error, etcd_client::Error> {
    leasehold_core::TlsFailure::setup_error(&format!("etcd at {address}"), error)
}

/// A failed connect whose cause says the credentials are wrong is a setup problem: said so, with
/// the connect's own error (the member and etcd's answer) kept as its cause.
pub(crate) fn setup_or(error: Error) -> Error {
    // The cause says it: read the whole chain, not the display alone.
    let text = error.chain().to_string();
    if text.contains("authentication failed")
        || text.contains("invalid user ID or password")
        || text.contains("permission denied")
    {
        let operation = error.operation();
        let refused = Error::new(
            ErrorKind::StoreSetup,
            "etcd refused the credentials: check the user and password",
        )
        .with_source(error);
        match operation {
            Some(operation) => refused.with_operation(operation),
            None => refused,
        }
    } else {
        error
    }
}

#[cfg(feature = "tls")]
pub(crate) fn tls_options(
    tls: &crate::config::TlsFiles,
) -> leasehold_core::Result<etcd_client::TlsOptions> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            Error::invalid_argument(format!("cannot read the TLS {what} {}", path.display()))
                .with_source(e)
        })
    };
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = &tls.ca {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA file")?));
    }
    if let Some((cert, key)) = &tls.client {
        options = options.identity(etcd_client::Identity::from_pem(
            read(cert, "client certificate")?,
            read(key, "client key")?,
        ));
    }
    Ok(options)
}
