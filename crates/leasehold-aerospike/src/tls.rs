//! The client's TLS configuration from [`AerospikeConfig`](crate::AerospikeConfig)'s files.

use std::sync::Arc;

use aerospike::TlsPolicy;
use leasehold_core::{Error, Result};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSettings;

/// Reads the CA and client files (their contents never reach a message) and builds the policy.
pub(crate) fn policy(tls: &TlsSettings) -> Result<TlsPolicy> {
    let unusable = |what: &str, path: &std::path::Path| {
        Error::invalid_argument(format!(
            "the TLS {what} {} cannot be used: it must be PEM",
            path.display()
        ))
    };
    // A file that cannot be read says so, with the I/O error as its cause; any other PEM error
    // is `unusable` without its cause, which can quote a line of the file (a key's, say).
    let unreadable = |what: &str, path: &std::path::Path, error: pem::Error| match error {
        pem::Error::Io(io) => {
            Error::invalid_argument(format!("cannot read the TLS {what} {}", path.display()))
                .with_source(io)
        }
        _ => unusable(what, path),
    };
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| unreadable("CA file", path, e))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(unusable("CA file", path));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    // The provider is named, not taken from the process default: that default is ambiguous (and
    // `builder()` panics) when another crate enables a second one.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal("no TLS protocol version available").with_source(e))?
        .with_root_certificates(roots);
    let config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| unreadable("client certificate", cert, e))?;
            if chain.is_empty() {
                return Err(unusable("client certificate", cert));
            }
            let key_der =
                PrivateKeyDer::from_pem_file(key).map_err(|e| unreadable("client key", key, e))?;
            builder.with_client_auth_cert(chain, key_der).map_err(|_| {
                Error::invalid_argument(format!(
                    "the TLS client certificate {} and key {} do not go together",
                    cert.display(),
                    key.display()
                ))
            })?
        }
    };
    Ok(TlsPolicy::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_cannot_be_read_says_so_and_keeps_the_cause_one_not_pem_names_no_content() {
        let dir = std::env::temp_dir().join(format!("leasehold-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing-ca.pem");
        let settings = TlsSettings {
            ca: Some(missing.clone()),
            ..TlsSettings::default()
        };
        let error = policy(&settings).unwrap_err();
        assert!(
            error.to_string().contains("cannot read the TLS CA file"),
            "{error}"
        );
        let source = std::error::Error::source(&error).expect("the I/O error is kept");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("an I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);

        let garbage = dir.join("key.pem");
        std::fs::write(&garbage, "-----BEGIN NONSENSE s3cret-line\n").unwrap();
        let settings = TlsSettings {
            ca: Some(garbage),
            ..TlsSettings::default()
        };
        let error = policy(&settings).unwrap_err();
        assert!(error.to_string().contains("must be PEM"), "{error}");
        assert!(
            !error.chain().to_string().contains("s3cret"),
            "{}",
            error.chain()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
