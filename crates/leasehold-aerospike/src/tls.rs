//! The client's TLS configuration from [`AerospikeConfig`](crate::AerospikeConfig)'s files.

use std::sync::Arc;

use aerospike::TlsPolicy;
use leasehold_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
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
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|_| unusable("CA file", path))?;
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
                .ok()
                .filter(|chain| !chain.is_empty())
                .ok_or_else(|| unusable("client certificate", cert))?;
            let key_der =
                PrivateKeyDer::from_pem_file(key).map_err(|_| unusable("client key", key))?;
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
