//! Test certificates: a private CA, a server certificate and a client certificate, generated
//! (with `rcgen`) into a temporary directory as PEM files.
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! use leasehold_testkit::tls::TestPki;
//! let pki = TestPki::generate(&["localhost"])?;
//! println!("trust {}", pki.ca_file().display());
//! let other = TestPki::generate(&["localhost"])?; // another CA: its certificates are not trusted
//! # Ok(()) }
//! ```

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA with one server and one client certificate, as PEM files in a temporary directory that
/// is removed on drop. `Debug` shows the paths, never the keys.
pub struct TestPki {
    dir: tempfile::TempDir,
    ca_pem: String,
}

fn other(what: &str, e: rcgen::Error) -> io::Error {
    io::Error::other(format!("cannot generate the test {what}: {e}"))
}

impl TestPki {
    /// Generates a CA, a server certificate valid for `server_names` (DNS names, or IP addresses
    /// written as such) and a client certificate, and writes them.
    ///
    /// # Errors
    ///
    /// Generating a key or certificate fails, or the files cannot be written.
    pub fn generate(server_names: &[&str]) -> io::Result<Self> {
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| other("CA", e))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("leasehold test CA {}", uuid::Uuid::new_v4().simple()),
        );
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(|e| other("CA key", e))?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(|e| other("CA", e))?;

        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names).map_err(|e| other(cn, e))?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            let key = KeyPair::generate().map_err(|e| other(cn, e))?;
            let cert = params.signed_by(&key, &ca).map_err(|e| other(cn, e))?;
            Ok::<_, io::Error>((cert.pem(), key.serialize_pem()))
        };
        let server_names = server_names.iter().map(|s| (*s).to_owned()).collect();
        let (server_cert, server_key) = leaf(
            server_names,
            "leasehold test server",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) = leaf(
            vec!["leasehold-test-client".to_owned()],
            "leasehold test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;

        let dir = tempfile::Builder::new()
            .prefix("leasehold-pki-")
            .tempdir()?;
        let ca_pem = ca.pem();
        for (name, pem) in [
            ("ca.pem", &ca_pem),
            ("server.pem", &server_cert),
            ("server.key", &server_key),
            ("client.pem", &client_cert),
            ("client.key", &client_key),
        ] {
            std::fs::write(dir.path().join(name), pem)?;
        }
        Ok(TestPki { dir, ca_pem })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM), to trust.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The CA certificate, PEM text.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server certificate (PEM).
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server's private key (PEM, PKCS#8).
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// The client certificate (PEM), for mutual TLS.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client's private key (PEM, PKCS#8).
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }
}

impl fmt::Debug for TestPki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// Asserts that `err` is what a store's connect gives for a server whose certificate no trusted
/// CA signed: a setup error that says what to fix, with the TLS client's own error kept as its
/// cause (naming the certificate or its issuer).
pub fn assert_untrusted_ca(err: &leasehold_core::Error) {
    assert_eq!(
        err.kind(),
        leasehold_core::ErrorKind::StoreSetup,
        "{}",
        err.chain()
    );
    assert!(
        err.to_string().contains("not signed by a trusted CA"),
        "says what to fix: {err}"
    );
    let cause = std::error::Error::source(err).expect("the TLS client's error is the cause");
    let cause = cause.to_string().to_lowercase();
    assert!(
        cause.contains("issuer") || cause.contains("certificate"),
        "the cause is the TLS client's: {cause}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files_and_hides_keys_from_debug() {
        let pki = TestPki::generate(&["localhost", "127.0.0.1"]).unwrap();
        for file in [
            pki.ca_file(),
            pki.server_cert_file(),
            pki.client_cert_file(),
        ] {
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{file:?}");
        }
        let key = std::fs::read_to_string(pki.server_key_file()).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        assert!(!format!("{pki:?}").contains("PRIVATE"));
        assert_eq!(
            pki.ca_pem(),
            std::fs::read_to_string(pki.ca_file()).unwrap()
        );
    }
}
