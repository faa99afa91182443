//! Certificates for TLS tests: a CA of the test's own, and certificates it
//! signs for `localhost` and `127.0.0.1`, written as PEM files.

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};

/// A certificate authority whose certificate is in `ca`.
pub struct TestCa {
    /// The CA certificate's PEM file.
    pub ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    dir: PathBuf,
}

impl TestCa {
    /// A new CA, its files under `dir` named after `name`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} CA"));
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let ca = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca, certificate.pem()).unwrap();
        TestCa {
            ca,
            issuer: Issuer::new(params, key),
            dir: dir.to_owned(),
        }
    }

    /// A certificate of this CA's for `localhost` and `127.0.0.1`, for
    /// servers and clients both.
    pub fn issue(&self, name: &str) -> Identity {
        let params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        let identity = Identity {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&identity.cert, certificate.pem()).unwrap();
        std::fs::write(&identity.key, key.serialize_pem()).unwrap();
        identity
    }

    /// The flags of a process with a new certificate of this CA's that
    /// trusts this CA alone.
    pub fn flags(&self, name: &str) -> Vec<String> {
        self.issue(name).flags(&self.ca)
    }
}

/// A certificate and its key, as PEM files.
pub struct Identity {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl Identity {
    /// `--tls-cert`, `--tls-key` and `--tls-ca` presenting this identity
    /// and trusting the CA certificates in `ca`.
    pub fn flags(&self, ca: &Path) -> Vec<String> {
        vec![
            format!("--tls-cert={}", self.cert.display()),
            format!("--tls-key={}", self.key.display()),
            format!("--tls-ca={}", ca.display()),
        ]
    }
}
