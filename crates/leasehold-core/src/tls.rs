//! Telling a failed TLS handshake apart from an unreachable server, for every network store.

/// Why a TLS handshake failed, read from an error chain (rustls' wording), so a store can say
/// plainly what to fix: a wrong or missing CA and a wrong name are setup problems, not an outage.
///
/// ```
/// use leasehold_core::TlsFailure;
/// let io = std::io::Error::other("invalid peer certificate: UnknownIssuer");
/// let (why, text) = TlsFailure::classify(&io).unwrap();
/// assert_eq!(why, TlsFailure::UntrustedCa);
/// assert!(text.contains("UnknownIssuer"));
/// assert!(TlsFailure::classify(&std::io::Error::other("connection refused")).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The peer's certificate is not signed by a CA the client trusts.
    UntrustedCa,
    /// The peer's certificate does not name the host (or TLS name) the client asked for.
    WrongName,
    /// Another certificate or handshake failure.
    Handshake,
}

impl TlsFailure {
    /// Classifies `error` (its whole `source()` chain), returning the failure and the chain as
    /// one line of text; `None` when the error is not about TLS.
    pub fn classify(error: &(dyn std::error::Error + 'static)) -> Option<(TlsFailure, String)> {
        let text = crate::error::ErrorChain::of(error).to_string();
        let lower = text.to_lowercase();
        let failure = if ["unknownissuer", "unknown issuer", "badsignature"]
            .iter()
            .any(|s| lower.contains(s))
        {
            TlsFailure::UntrustedCa
        } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
            TlsFailure::WrongName
        } else if ["certificate", "handshake", "tls"]
            .iter()
            .any(|s| lower.contains(s))
        {
            TlsFailure::Handshake
        } else {
            return None;
        };
        Some((failure, text))
    }

    /// What to do about it, for a server reached by host name (URL-configured TLS files).
    pub fn hint(self) -> &'static str {
        match self {
            TlsFailure::UntrustedCa => {
                "the server's certificate is not signed by a trusted CA: give the CA that signed \
                 it (tls_ca_file / ?tls_ca=)"
            }
            TlsFailure::WrongName => {
                "the server's certificate does not name the host in the URL: connect by a name \
                 the certificate lists"
            }
            TlsFailure::Handshake => {
                "the TLS handshake failed: check the CA, the client certificate and the host name"
            }
        }
    }

    /// `error`, the client's own from a failed connect to `server` (`"Redis at host:port"`), as
    /// a setup error that says what to fix and keeps `error` as its cause when it is a failed
    /// TLS handshake; any other error is handed back for the store to map.
    ///
    /// ```
    /// use leasehold_core::{ErrorKind, TlsFailure};
    /// let tls = std::io::Error::other("invalid peer certificate: UnknownIssuer");
    /// let error = TlsFailure::setup_error("Redis at db:6379", tls).unwrap();
    /// assert_eq!(error.kind(), ErrorKind::StoreSetup);
    /// assert!(std::error::Error::source(&error).is_some());
    /// let refused = std::io::Error::other("connection refused");
    /// assert!(TlsFailure::setup_error("Redis at db:6379", refused).is_err());
    /// ```
    pub fn setup_error<E>(server: &str, error: E) -> std::result::Result<crate::error::Error, E>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let Some((failure, _)) = TlsFailure::classify(&error) else {
            return Err(error);
        };
        Ok(crate::error::Error::new(
            crate::error::ErrorKind::StoreSetup,
            format!("TLS with {server} failed: {}", failure.hint()),
        )
        .with_source(error))
    }
}
