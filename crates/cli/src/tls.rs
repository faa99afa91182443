//! The TLS flags of `tidemark run` (for the worker processes it drives)
//! and `tidemark worker`: Flink's internal SSL, from PEM files
//! (`security.ssl.internal.cert-file`, `key-file`, `ca-file` in a
//! `--config` file).

use super::CliError;
use clap::Args;
use std::path::PathBuf;
use tidemark_actors::tls::{MutualTls, TlsFiles};

/// `--tls-cert`, `--tls-key`, `--tls-ca`: all three or none.
#[derive(Clone, Debug, Default, Args)]
pub struct TlsFlags {
    /// Mutual TLS between the driver and its worker processes: this
    /// process's certificate chain (PEM), which must name the hosts it is
    /// reached at; with --tls-key and --tls-ca.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The CA certificates (PEM) a peer's certificate must chain to; a
    /// peer whose certificate does not is refused.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

impl TlsFlags {
    /// The three files if all are given, none if none are; otherwise the
    /// option (by field name) that is missing.
    pub fn files(&self) -> Result<Option<TlsFiles>, &'static str> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            })),
            (None, _, _) => Err("tls_cert"),
            (_, None, _) => Err("tls_key"),
            (_, _, None) => Err("tls_ca"),
        }
    }

    /// Reads the files given, if any, naming the flag a problem is with.
    pub fn load(files: Option<&TlsFiles>) -> Result<Option<MutualTls>, CliError> {
        files
            .map(|files| {
                MutualTls::load(files).map_err(|e| CliError::Usage {
                    argument: "--tls-cert/--tls-key/--tls-ca".into(),
                    problem: e.to_string(),
                })
            })
            .transpose()
    }

    /// The flags that give the files of `tls` to a worker process.
    pub fn args(tls: &MutualTls) -> [String; 3] {
        let files = tls.files();
        [
            format!("--tls-cert={}", files.cert.display()),
            format!("--tls-key={}", files.key.display()),
            format!("--tls-ca={}", files.ca.display()),
        ]
    }
}
