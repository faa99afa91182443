//! TLS from PEM files, as Flink configures its SSL: mutual TLS between a
//! job's processes ([`MutualTls`]), and the REST API's server certificate
//! ([`RestTls`]) with the CA its clients trust ([`trusted`]).
//!
//! Mutual TLS between a job's processes, as Flink's internal SSL
//! (`security.ssl.internal.*`) configures it, but from PEM files: every
//! process presents the certificate of its `cert` file and accepts only a
//! peer whose certificate chains to the `ca` file, on the control plane
//! (gRPC, through tonic's rustls) and on the data links (tokio-rustls).
//! The dialing side also checks that the peer's certificate names the host
//! it dialed, as HTTPS does, so a certificate must name the hosts its
//! process is reached at (`127.0.0.1` for the workers `--workers`
//! launches).
//!
//! Without TLS, reaching a worker's ports is control of it: so a worker
//! serves beyond loopback without TLS only when told it is meant to
//! ([`check_exposure`]).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// How long a peer has for its TLS handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The PEM files of one process's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain this process presents, its own first.
    pub cert: PathBuf,
    /// The chain's private key.
    pub key: PathBuf,
    /// The CA certificates a peer's chain must lead to.
    pub ca: PathBuf,
}

/// Why TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file does not read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no PEM section of what it should.
    #[error("{} holds no PEM {what}: {problem}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The CA file holds a certificate that cannot anchor a chain.
    #[error("{} holds a CA certificate rustls cannot use: {source}", path.display())]
    Ca {
        /// The CA file.
        path: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// The certificate and key do not go together (or are unusable).
    #[error("the certificate in {} and the key in {} do not make an identity: {source}", cert.display(), key.display())]
    Identity {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        source: rustls::Error,
    },
    /// No client verifier can be built on the CA certificates.
    #[error("the CA certificates in {}: {source}", path.display())]
    Verifier {
        /// The CA file.
        path: PathBuf,
        /// Why.
        source: rustls::server::VerifierBuilderError,
    },
}

/// A worker about to serve where other hosts reach it with nothing to
/// tell its callers from strangers.
#[derive(Debug, thiserror::Error)]
#[error("{address} is reachable from other hosts, and without TLS anyone who reaches it controls the worker: give --tls-cert, --tls-key and --tls-ca, bind a loopback address, or say --insecure if only the job's processes can reach it")]
pub struct ExposedWithoutTls {
    /// The address.
    pub address: SocketAddr,
}

/// Refuses to serve at `address` beyond loopback without TLS, unless the
/// operator says the network around it is trusted (`insecure`).
pub fn check_exposure(
    address: SocketAddr,
    tls: Option<&MutualTls>,
    insecure: bool,
) -> Result<(), ExposedWithoutTls> {
    if address.ip().is_loopback() || tls.is_some() || insecure {
        Ok(())
    } else {
        Err(ExposedWithoutTls { address })
    }
}

/// One process's side of mutual TLS, ready for both planes.
#[derive(Clone)]
pub struct MutualTls {
    files: TlsFiles,
    /// The PEM texts, for tonic, which builds its configurations itself.
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for MutualTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MutualTls(…)")
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate of a PEM text; none is an error.
fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let problem = |problem: String| TlsError::Pem {
        path: path.to_owned(),
        what: "certificate",
        problem,
    };
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(e.to_string()))?;
    if certificates.is_empty() {
        return Err(problem("no BEGIN CERTIFICATE section".into()));
    }
    Ok(certificates)
}

/// The certificates in the PEM file `path`: a CA file's, for clients that
/// build their own trust from them.
pub fn ca_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    certificates(&read(path)?, path)
}

/// The CA certificates in `path`, as roots a peer's chain must lead to.
pub fn trusted(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in ca_certificates(path)? {
        roots.add(certificate).map_err(|source| TlsError::Ca {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(roots)
}

/// The crypto provider: the one kube and object_store build anyway.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A certificate chain and its key, as a process presents them.
struct Presented {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl Presented {
    fn read(cert: &Path, key: &Path) -> Result<Presented, TlsError> {
        Presented::parse(&read(cert)?, cert, &read(key)?, key)
    }

    fn parse(
        cert: &[u8],
        cert_path: &Path,
        key: &[u8],
        key_path: &Path,
    ) -> Result<Presented, TlsError> {
        Ok(Presented {
            chain: certificates(cert, cert_path)?,
            key: PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem {
                path: key_path.to_owned(),
                what: "private key",
                problem: e.to_string(),
            })?,
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
        })
    }

    /// The error of a chain and key that do not make an identity.
    fn unusable(&self, source: rustls::Error) -> TlsError {
        TlsError::Identity {
            cert: self.cert_path.clone(),
            key: self.key_path.clone(),
            source,
        }
    }

    /// A server presenting this identity to clients `verifier` admits.
    fn server(
        &self,
        verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    ) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| self.unusable(e))?;
        let builder = match verifier {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        builder
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| self.unusable(e))
    }
}

impl MutualTls {
    /// Reads and checks `files`: the certificate and key must match, and
    /// the CA file must hold at least one usable certificate.
    pub fn load(files: &TlsFiles) -> Result<MutualTls, TlsError> {
        let (cert, key, ca) = (read(&files.cert)?, read(&files.key)?, read(&files.ca)?);
        let presented = Presented::parse(&cert, &files.cert, &key, &files.key)?;
        let roots = Arc::new(trusted(&files.ca)?);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|source| TlsError::Verifier {
                path: files.ca.clone(),
                source,
            })?;
        let server = presented.server(Some(verifier))?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| presented.unusable(e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(presented.chain.clone(), presented.key.clone_key())
            .map_err(|e| presented.unusable(e))?;
        Ok(MutualTls {
            files: files.clone(),
            cert,
            key,
            ca,
            acceptor: Arc::new(server).into(),
            connector: Arc::new(client).into(),
        })
    }

    /// The files it was read from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The gRPC service's side: client certificates required.
    pub(crate) fn server(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// The gRPC client's side, to the service at `address` (`host:port`).
    pub(crate) fn client(&self, address: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(host(address))
            .timeout(HANDSHAKE_TIMEOUT)
    }

    /// Takes a link's TLS handshake, refusing a peer without a certificate
    /// of the CA's.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        self.acceptor.accept(stream).await
    }

    /// Opens TLS on a link dialed to `address` (`host:port`), whose
    /// certificate must name its host.
    pub(crate) async fn connect(
        &self,
        address: &str,
        stream: TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host(address).to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.connector.connect(name, stream).await
    }
}

/// The REST API's TLS (`security.ssl.rest.*`): the certificate it
/// presents. Its clients check it against a CA they trust; requests are
/// authenticated by the token, not by a client certificate, so that a
/// browser opens the page too.
#[derive(Clone)]
pub struct RestTls {
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for RestTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RestTls(…)")
    }
}

impl RestTls {
    /// Reads the certificate chain in `cert` and its key in `key`.
    pub fn load(cert: &Path, key: &Path) -> Result<RestTls, TlsError> {
        Ok(RestTls {
            config: Arc::new(Presented::read(cert, key)?.server(None)?),
        })
    }

    /// What the server takes its connections with.
    pub(crate) fn config(&self) -> ServerConfig {
        (*self.config).clone()
    }
}

/// The host of `host:port` or `[v6]:port`.
fn host(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_what_a_certificate_must_name() {
        assert_eq!(
            host("tidemark-worker-0.tidemark-workers:7001"),
            "tidemark-worker-0.tidemark-workers"
        );
        assert_eq!(host("127.0.0.1:7001"), "127.0.0.1");
        assert_eq!(host("[::1]:7001"), "::1");
    }

    #[test]
    fn only_loopback_serves_without_tls_unless_told_otherwise() {
        let loopback: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let v6: SocketAddr = "[::1]:7000".parse().unwrap();
        assert!(check_exposure(loopback, None, false).is_ok());
        assert!(check_exposure(v6, None, false).is_ok());
        for exposed in ["0.0.0.0:7000", "[::]:7000", "192.0.2.7:7000"] {
            let address: SocketAddr = exposed.parse().unwrap();
            let refused = check_exposure(address, None, false).unwrap_err();
            assert!(refused.to_string().contains("--tls-cert"), "{refused}");
            assert!(check_exposure(address, None, true).is_ok());
        }
    }
}
