//! Mutual TLS for every gRPC connection.
//!
//! One set of three PEM files per process — its certificate, its private key
//! and the cluster's CA — gives both sides of a connection: a server that
//! accepts only clients with a certificate the CA signed, and a client that
//! accepts only servers the CA signed and presents its own certificate.
//! `crescentctl certs init DIR` writes such a set for a test or demo cluster.
//!
//! Roles still come from the bearer tokens (a client certificate proves
//! membership of the deployment, not which role): TLS adds confidentiality,
//! server authentication and a handshake no outsider passes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Longest a TLS handshake may take on a server before the connection is
/// closed: a client that opens a connection and stalls holds a connection
/// slot no longer than this.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest certificate or key file read (a chain of a few certificates).
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// The files `crescentctl certs init` writes.
pub const CA_CERT_FILE: &str = "ca.pem";
pub const NODE_CERT_FILE: &str = "node.pem";
pub const NODE_KEY_FILE: &str = "node.key";
pub const CLIENT_CERT_FILE: &str = "client.pem";
pub const CLIENT_KEY_FILE: &str = "client.key";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "TLS needs all three of --tls-cert, --tls-key and --tls-ca (CRESCENT_TLS_CERT, \
         CRESCENT_TLS_KEY, CRESCENT_TLS_CA); {missing} is missing"
    )]
    Incomplete { missing: &'static str },
    #[error("cannot read {what} {path}: {source}")]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path} is larger than {MAX_PEM_FILE_BYTES} bytes")]
    TooLarge { what: &'static str, path: PathBuf },
    #[error("{what} {path} holds no PEM block ({expected})")]
    NotPem {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("TLS set-up refused the certificate or key: {0}")]
    Rejected(String),
    #[error(
        "etcd over TLS (--etcd-tls, CRESCENT_ETCD_TLS, JSON etcd_tls) needs the TLS files: \
         --tls-cert, --tls-key and --tls-ca (CRESCENT_TLS_CERT, _KEY, _CA; JSON tls_cert, \
         tls_key, tls_ca)"
    )]
    EtcdWithoutFiles,
    #[error(
        "TLS on the data port (--data-tls, CRESCENT_DATA_TLS, JSON data_tls) needs the TLS \
         files: --tls-cert, --tls-key and --tls-ca (CRESCENT_TLS_CERT, _KEY, _CA; JSON \
         tls_cert, tls_key, tls_ca)"
    )]
    DataPortWithoutFiles,
}

/// The files a process reaches etcd with: its TLS files when `etcd_tls`
/// asks for TLS to etcd (which needs them), else none (clear text).
pub fn for_etcd(etcd_tls: bool, tls: Option<&TlsFiles>) -> Result<Option<&TlsFiles>, TlsError> {
    when_asked(etcd_tls, tls, TlsError::EtcdWithoutFiles)
}

/// `tls` when `asked`, `missing` when asked without files, else none.
fn when_asked(
    asked: bool,
    tls: Option<&TlsFiles>,
    missing: TlsError,
) -> Result<Option<&TlsFiles>, TlsError> {
    match (asked, tls) {
        (false, _) => Ok(None),
        (true, Some(files)) => Ok(Some(files)),
        (true, None) => Err(missing),
    }
}

/// The files the data port (a store's transfer port, and a client's
/// transport to it) speaks mutual TLS with: its TLS files when `data_tls`
/// asks for it, else none (clear text). Off unless asked: TLS halves 1 MiB
/// transfers on a machine without kernel TLS (docs/benchmarks.md), and the
/// grants already decide who may read or write what.
pub fn for_data_port(
    data_tls: bool,
    tls: Option<&TlsFiles>,
) -> Result<Option<&TlsFiles>, TlsError> {
    when_asked(data_tls, tls, TlsError::DataPortWithoutFiles)
}

/// A process's TLS material, read once at start.
#[derive(Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    ca_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Paths only: the key's bytes never reach a log.
        f.debug_struct("TlsFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("ca", &self.ca)
            .finish()
    }
}

impl TlsFiles {
    /// TLS from the three flags: `None` when none is given, an error naming
    /// the missing one when only some are.
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Option<Self>, TlsError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Self::read(cert, key, ca).map(Some),
            (cert, key, _) => Err(TlsError::Incomplete {
                missing: if cert.is_none() {
                    "--tls-cert"
                } else if key.is_none() {
                    "--tls-key"
                } else {
                    "--tls-ca"
                },
            }),
        }
    }

    /// Reads and checks the three files.
    pub fn read(cert: &Path, key: &Path, ca: &Path) -> Result<Self, TlsError> {
        let cert_pem = read_pem("certificate", cert, "CERTIFICATE")?;
        let key_pem = read_pem("private key", key, "PRIVATE KEY")?;
        let ca_pem = read_pem("CA certificate", ca, "CERTIFICATE")?;
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            ca: ca.to_path_buf(),
            cert_pem,
            key_pem,
            ca_pem,
        })
    }

    /// The files `crescentctl certs init DIR` wrote for a node (master or store).
    pub fn node_in(dir: &Path) -> Result<Self, TlsError> {
        Self::read(
            &dir.join(NODE_CERT_FILE),
            &dir.join(NODE_KEY_FILE),
            &dir.join(CA_CERT_FILE),
        )
    }

    /// The files `crescentctl certs init DIR` wrote for a client (engine, operator).
    pub fn client_in(dir: &Path) -> Result<Self, TlsError> {
        Self::read(
            &dir.join(CLIENT_CERT_FILE),
            &dir.join(CLIENT_KEY_FILE),
            &dir.join(CA_CERT_FILE),
        )
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// The certificate chain, the key and the CA roots, parsed for rustls.
    fn parsed(&self) -> Result<Parsed, TlsError> {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |e: &dyn std::fmt::Display| TlsError::Rejected(e.to_string());
        let chain = CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&format!("{}: {e}", self.cert.display())))?;
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| bad(&format!("{}: {e}", self.key.display())))?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let ca = ca.map_err(|e| bad(&format!("{}: {e}", self.ca.display())))?;
            roots
                .add(ca)
                .map_err(|e| bad(&format!("{}: {e}", self.ca.display())))?;
        }
        Ok(Parsed {
            chain,
            key,
            roots: Arc::new(roots),
        })
    }

    /// The rustls configurations a server presents: gRPC (this certificate,
    /// and a client certificate the CA signed required; ALPN h2), the
    /// store's data port (the same checks; ALPN [`DATA_ALPN`]) and the
    /// admin HTTP port (this certificate, no client certificate asked for —
    /// Prometheus and SGLang's segment poll come without one; the admin
    /// endpoints still need the admin token; ALPN http/1.1).
    fn serving_configs(&self) -> Result<ServingConfigs, TlsError> {
        use tokio_rustls::rustls;
        let bad = |e: &dyn std::fmt::Display| TlsError::Rejected(e.to_string());
        let Parsed { chain, key, roots } = self.parsed()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad(&e))?;
        let mutual =
            |provider: Arc<rustls::crypto::CryptoProvider>, alpn: &[u8]| -> Result<_, TlsError> {
                let mut config = rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| bad(&e))?
                    .with_client_cert_verifier(verifier.clone())
                    .with_single_cert(chain.clone(), key.clone_key())
                    .map_err(|e| bad(&e))?;
                config.alpn_protocols = vec![alpn.to_vec()];
                Ok(Arc::new(config))
            };
        let grpc = mutual(provider.clone(), b"h2")?;
        let data = mutual(data_provider(), DATA_ALPN)?;
        let mut http = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key)
            .map_err(|e| bad(&e))?;
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServingConfigs {
            grpc,
            data,
            http: Arc::new(http),
            chain,
            roots,
        })
    }

    /// Whether `other` holds the same certificate, key and CA bytes (a
    /// reload that changed nothing need not drop any connection).
    pub fn same_as(&self, other: &TlsFiles) -> bool {
        self.cert_pem == other.cert_pem
            && self.key_pem == other.key_pem
            && self.ca_pem == other.ca_pem
    }

    /// A client that trusts only servers the CA signed and presents this
    /// certificate.
    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(self.identity())
    }

    /// The same for the stores' data ports (rustls directly: the data
    /// port is not gRPC): only stores whose certificate the CA signed,
    /// for the name or IP address the store is reached at, and this
    /// certificate presented.
    pub fn data_client_config(&self) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, TlsError> {
        use tokio_rustls::rustls;
        let bad = |e: &dyn std::fmt::Display| TlsError::Rejected(e.to_string());
        let Parsed { chain, key, roots } = self.parsed()?;
        let mut config = rustls::ClientConfig::builder_with_provider(data_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| bad(&e))?;
        config.alpn_protocols = vec![DATA_ALPN.to_vec()];
        Ok(Arc::new(config))
    }
}

/// The ALPN protocol of the store's data port over TLS: a gRPC or HTTPS
/// client sent there by mistake is refused at the handshake instead of
/// having its bytes read as transfer requests.
pub const DATA_ALPN: &[u8] = b"crescent-data/1";

/// The ring provider with the AES-128-GCM suites first, for the data port
/// (the other suites stay, in their order, for a peer without them): it
/// moves every KV byte, and AES-128 does 10 rounds per block to AES-256's
/// 14 (the encryption and decryption samples of a 1 MiB read benchmark fell
/// from 23 % to 17 % of the CPU time). gRPC keeps rustls's default order.
fn data_provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    use tokio_rustls::rustls::CipherSuite;
    let mut provider = tokio_rustls::rustls::crypto::ring::default_provider();
    // A stable sort: AES-128-GCM suites (false) before the rest (true).
    provider.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            CipherSuite::TLS13_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(provider)
}

struct Parsed {
    chain: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    key: tokio_rustls::rustls::pki_types::PrivateKeyDer<'static>,
    roots: Arc<tokio_rustls::rustls::RootCertStore>,
}

#[derive(Clone)]
struct ServingConfigs {
    grpc: Arc<tokio_rustls::rustls::ServerConfig>,
    data: Arc<tokio_rustls::rustls::ServerConfig>,
    http: Arc<tokio_rustls::rustls::ServerConfig>,
    /// This server's own chain and the CA, for [`ServingTls::check_serves`].
    chain: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    roots: Arc<tokio_rustls::rustls::RootCertStore>,
}

/// What a server presents and whom it accepts, re-read from its three files
/// by [`reload`](Self::reload) (on SIGHUP): new connections get the new
/// certificate and are checked against the new CA; established ones keep
/// the session they negotiated.
pub struct ServingTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    current: RwLock<ServingConfigs>,
}

impl std::fmt::Debug for ServingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingTls")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("ca", &self.ca)
            .finish()
    }
}

impl ServingTls {
    pub fn new(files: &TlsFiles) -> Result<Self, TlsError> {
        Ok(Self {
            cert: files.cert.clone(),
            key: files.key.clone(),
            ca: files.ca.clone(),
            current: RwLock::new(files.serving_configs()?),
        })
    }

    /// Reads the three files again. On any error (a missing, oversized or
    /// malformed file, a key that does not match its certificate) the
    /// configuration in use stays and the error says why.
    ///
    /// Returns the files it took, checked for the client side as well, so
    /// that what the process presents as a client (to its peers, to the
    /// masters) moves to the same files, or stays when these are broken.
    pub fn reload(&self) -> Result<TlsFiles, TlsError> {
        let files = TlsFiles::read(&self.cert, &self.key, &self.ca)?;
        let configs = files.serving_configs()?;
        files.data_client_config()?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = configs;
        Ok(files)
    }

    /// For the next gRPC connection: mutual TLS.
    pub fn grpc_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        tokio_rustls::TlsAcceptor::from(current.grpc.clone())
    }

    /// For the next connection to a store's data port: mutual TLS.
    pub fn data_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        tokio_rustls::TlsAcceptor::from(current.data.clone())
    }

    /// Whether the certificate in use passes a client's checks when this
    /// server is reached at `host` (a name or an IP address): signed by the
    /// CA, valid now, for server use and naming `host`. A store advertises
    /// its data port at one host; an error here means every client will
    /// refuse that port, which is better said once at start than at each
    /// transfer. The error says why.
    pub fn check_serves(&self, host: &str) -> Result<(), TlsError> {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::client::danger::ServerCertVerifier;
        let (chain, roots) = {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            (current.chain.clone(), current.roots.clone())
        };
        let bad = |e: &dyn std::fmt::Display| {
            TlsError::Rejected(format!(
                "{} is not a certificate clients accept for {host}: {e}",
                self.cert.display()
            ))
        };
        let name = server_name(host).map_err(|e| bad(&e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| bad(&e))?;
        let (leaf, intermediates) = chain
            .split_first()
            .ok_or_else(|| bad(&"the file holds no certificate"))?;
        verifier
            .verify_server_cert(
                leaf,
                intermediates,
                &name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map(|_| ())
            .map_err(|e| bad(&e))
    }

    /// For the next admin HTTP connection: server certificate only.
    pub fn http_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        tokio_rustls::TlsAcceptor::from(current.http.clone())
    }
}

/// The endpoint for `addr` (`host:port`): `https://` with `tls`, else
/// `http://`. Every gRPC client of Crescent builds its channels here.
pub fn endpoint(addr: &str, tls: Option<&ClientTlsConfig>) -> Result<Endpoint, TlsError> {
    let bad = |e: tonic::transport::Error| TlsError::Rejected(format!("{addr}: {e}"));
    match tls {
        None => Endpoint::from_shared(format!("http://{addr}")).map_err(bad),
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))
            .map_err(bad)?
            .tls_config(tls.clone())
            .map_err(bad),
    }
}

/// The name a client checks a server's certificate against when it
/// reaches it at `host` (`host` of `host:port`; brackets around an IPv6
/// address are dropped): an IP address matches an IP address entry of the
/// certificate, anything else a DNS name entry, as for gRPC's `https://`
/// endpoints (`crescentctl certs init` writes both kinds).
pub fn server_name(
    host: &str,
) -> Result<tokio_rustls::rustls::pki_types::ServerName<'static>, TlsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    tokio_rustls::rustls::pki_types::ServerName::try_from(bare.to_string())
        .map_err(|e| TlsError::Rejected(format!("{host:?} is not a host name or address: {e}")))
}

fn read_pem(what: &'static str, path: &Path, label: &'static str) -> Result<Vec<u8>, TlsError> {
    let unreadable = |source| TlsError::Unreadable {
        what,
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(unreadable)?.len();
    if len > MAX_PEM_FILE_BYTES {
        return Err(TlsError::TooLarge {
            what,
            path: path.to_path_buf(),
        });
    }
    let bytes = std::fs::read(path).map_err(unreadable)?;
    let text = String::from_utf8_lossy(&bytes);
    // "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----",
    // "-----BEGIN EC PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----".
    let has_block = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")));
    if !has_block {
        return Err(TlsError::NotPem {
            what,
            path: path.to_path_buf(),
            expected: label,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAKE_CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const FAKE_KEY: &str = "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n";

    fn files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let (c, k, a) = (dir.join("c.pem"), dir.join("k.pem"), dir.join("a.pem"));
        std::fs::write(&c, FAKE_CERT).unwrap();
        std::fs::write(&k, FAKE_KEY).unwrap();
        std::fs::write(&a, FAKE_CERT).unwrap();
        (c, k, a)
    }

    #[test]
    fn no_flags_is_no_tls_and_some_flags_name_the_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k, a) = files(dir.path());
        assert!(TlsFiles::from_flags(None, None, None).unwrap().is_none());
        for (args, missing) in [
            ((None, Some(&k), Some(&a)), "--tls-cert"),
            ((Some(&c), None, Some(&a)), "--tls-key"),
            ((Some(&c), Some(&k), None), "--tls-ca"),
        ] {
            let err = TlsFiles::from_flags(
                args.0.map(|p| p.as_path()),
                args.1.map(|p| p.as_path()),
                args.2.map(|p| p.as_path()),
            )
            .unwrap_err();
            assert!(err.to_string().contains(missing), "{err}");
        }
        let tls = TlsFiles::from_flags(Some(&c), Some(&k), Some(&a))
            .unwrap()
            .unwrap();
        assert!(!format!("{tls:?}").contains("AAAA"), "key bytes in Debug");
    }

    #[test]
    fn a_missing_oversized_or_non_pem_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k, a) = files(dir.path());
        let gone = dir.path().join("gone.pem");
        let err = TlsFiles::read(&c, &gone, &a).unwrap_err();
        assert!(matches!(err, TlsError::Unreadable { .. }), "{err}");
        assert!(err.to_string().contains("gone.pem"), "{err}");

        let text = dir.path().join("text.pem");
        std::fs::write(&text, "not a certificate").unwrap();
        let err = TlsFiles::read(&c, &k, &text).unwrap_err();
        assert!(matches!(err, TlsError::NotPem { .. }), "{err}");
        assert!(err.to_string().contains("text.pem"), "{err}");
        // A certificate where the key belongs is not a key.
        let err = TlsFiles::read(&c, &c, &a).unwrap_err();
        assert!(matches!(err, TlsError::NotPem { .. }), "{err}");

        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'A'; MAX_PEM_FILE_BYTES as usize + 1]).unwrap();
        let err = TlsFiles::read(&big, &k, &a).unwrap_err();
        assert!(matches!(err, TlsError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn a_store_is_checked_by_address_or_by_name_as_it_is_reached() {
        use tokio_rustls::rustls::pki_types::ServerName;
        for (host, ip) in [
            ("127.0.0.1", true),
            ("[::1]", true),
            ("store-1.example", false),
        ] {
            let name = server_name(host).unwrap();
            assert_eq!(matches!(name, ServerName::IpAddress(_)), ip, "{host}");
            assert_eq!(matches!(name, ServerName::DnsName(_)), !ip, "{host}");
        }
        assert!(server_name("not a host").is_err());
    }

    #[test]
    fn endpoints_use_https_exactly_when_tls_is_on() {
        let plain = endpoint("127.0.0.1:1", None).unwrap();
        assert_eq!(plain.uri().scheme_str(), Some("http"));
        let tls = ClientTlsConfig::new();
        let secure = endpoint("127.0.0.1:1", Some(&tls)).unwrap();
        assert_eq!(secure.uri().scheme_str(), Some("https"));
        assert!(endpoint("not a host", None).is_err());
    }
}
