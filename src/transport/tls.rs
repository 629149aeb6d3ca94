//! TLS for every listener (`[tls]`): rustls with the aws-lc-rs provider, TLS 1.2 and 1.3 only,
//! the certificate chain and key read from PEM files (RSA, ECDSA or Ed25519), checked at start
//! (readable, a key that matches the leaf, the leaf valid now) and reloaded when either file
//! changes, as cert-manager rotates a mounted Secret: a new handshake takes the new
//! certificate, an open connection keeps its session, and a reload that fails keeps the old
//! certificate and logs why. With `client_ca_file`, every client must present a certificate
//! that chains to it (refused at the handshake otherwise), and its identity (subject CN and
//! subject alternative names) goes with each of the connection's requests ([`ClientIdentity`]).
//!
//! aws-lc-rs rather than ring: it is rustls's default provider, already in the tree for the
//! HTTP clients, has the faster AES-GCM and ChaCha20 on x86-64 and aarch64, supports every key
//! type a certificate here may have, and has a FIPS-validated build should an operator need one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use crate::storage::scan::FileIdentity;
use crate::telemetry::names;

/// How often the certificate and key files are checked for changes.
const RELOAD_POLL: Duration = Duration::from_secs(1);

/// Why TLS cannot be set up from its files. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("cannot read {what} {file}: {source}")]
    Read { what: &'static str, file: PathBuf, source: std::io::Error },
    #[error("{what} {file} holds no PEM {expected}")]
    Empty { what: &'static str, file: PathBuf, expected: &'static str },
    #[error("{what} {file} is not valid PEM: {message}")]
    Pem { what: &'static str, file: PathBuf, message: String },
    #[error("key file {key} does not match the certificate of {cert}: {message}")]
    Mismatch { cert: PathBuf, key: PathBuf, message: String },
    #[error("certificate {file} is not valid now: {message}")]
    NotValidNow { file: PathBuf, message: String },
    #[error("client CA file {file} cannot verify clients: {message}")]
    ClientCa { file: PathBuf, message: String },
}

/// The TLS settings of every listener.
#[derive(Debug, Clone)]
pub(crate) struct TlsSettings {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

impl TlsSettings {
    pub(crate) fn from_config(config: &crate::config::Config) -> Option<TlsSettings> {
        let tls = &config.tls;
        Some(TlsSettings {
            cert_file: tls.cert_file.clone()?,
            key_file: tls.key_file.clone()?,
            client_ca_file: tls.client_ca_file.clone(),
        })
    }
}

/// The provider every TLS connection of the server uses, its own and its clients'.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// What every TLS listener of a server shares: its configuration, with the certificate that
/// reloads.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
    certificate: Arc<ReloadingCertificate>,
}

impl Tls {
    /// TLS from `settings`, its files read and checked now.
    pub(crate) fn new(settings: &TlsSettings) -> Result<Tls, TlsError> {
        let provider = provider();
        let certificate = Arc::new(ReloadingCertificate::load(settings, &provider)?);
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("the aws-lc-rs provider supports TLS 1.2 and 1.3");
        let builder = match &settings.client_ca_file {
            None => builder.with_no_client_auth(),
            Some(file) => {
                let roots = read_roots(file, "client CA file")?;
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::ClientCa { file: file.clone(), message: e.to_string() })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&certificate) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)), certificate })
    }

    /// Re-reads the certificate and key whenever either file changes, forever.
    pub(crate) async fn watch(self) {
        let mut interval = tokio::time::interval(RELOAD_POLL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let certificate = Arc::clone(&self.certificate);
            let _ = tokio::task::spawn_blocking(move || certificate.reload_if_changed()).await;
        }
    }
}

/// The certificates of PEM file `file` (`what` names it in errors): at least one.
fn read_certificates(file: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(file).map_err(|source| TlsError::Read { what, file: file.to_owned(), source })?;
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::Pem {
        what,
        file: file.to_owned(),
        message: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what, file: file.to_owned(), expected: "certificate" });
    }
    Ok(certs)
}

/// The roots of a PEM bundle of CA certificates.
pub(crate) fn read_roots(file: &Path, what: &'static str) -> Result<rustls::RootCertStore, TlsError> {
    let certs = read_certificates(file, what)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| TlsError::Pem { what, file: file.to_owned(), message: e.to_string() })?;
    }
    Ok(roots)
}

/// What identifies one version of a file (a change to any of it reloads).
fn stamp(path: &Path) -> Option<FileIdentity> {
    // `metadata` follows symlinks, so a Kubernetes Secret's `..data` swap is seen as a change.
    std::fs::metadata(path).ok().map(|m| FileIdentity::of(&m))
}

/// The server's certificate and key, swapped whole when their files change.
#[derive(Debug)]
struct ReloadingCertificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// The files' versions last read, whether or not they could be used.
    stamps: Mutex<(Option<FileIdentity>, Option<FileIdentity>)>,
}

impl ReloadingCertificate {
    fn load(settings: &TlsSettings, provider: &Arc<CryptoProvider>) -> Result<ReloadingCertificate, TlsError> {
        let stamps = (stamp(&settings.cert_file), stamp(&settings.key_file));
        let key = certified_key(&settings.cert_file, &settings.key_file, provider)?;
        tracing::info!(cert_file = %settings.cert_file.display(), leaf = %describe_leaf(&key), "TLS certificate loaded");
        Ok(ReloadingCertificate {
            cert_file: settings.cert_file.clone(),
            key_file: settings.key_file.clone(),
            provider: Arc::clone(provider),
            current: ArcSwap::from_pointee(key),
            stamps: Mutex::new(stamps),
        })
    }

    /// Reads the files again if either changed; keeps the certificate in force when they
    /// cannot be used (a rotation caught between its two writes is read again at the next
    /// change, or poll). Each outcome is logged and counted.
    fn reload_if_changed(&self) {
        let now = (stamp(&self.cert_file), stamp(&self.key_file));
        {
            let mut stamps = self.stamps.lock().expect("never poisoned");
            if *stamps == now {
                return;
            }
            *stamps = now;
        }
        let outcome = match certified_key(&self.cert_file, &self.key_file, &self.provider) {
            Ok(key) => {
                tracing::info!(cert_file = %self.cert_file.display(), leaf = %describe_leaf(&key), "TLS certificate reloaded");
                self.current.store(Arc::new(key));
                "ok"
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate not reloaded: the one loaded before stays in use");
                "error"
            }
        };
        metrics::counter!(names::TLS_RELOADS, "outcome" => outcome).increment(1);
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The chain of `cert_file` with the key of `key_file`, checked: the key matches the leaf, and
/// the leaf is valid now.
fn certified_key(cert_file: &Path, key_file: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let chain = read_certificates(cert_file, "certificate file")?;
    check_validity(&chain[0], cert_file)?;
    let what = "key file";
    let pem = std::fs::read(key_file).map_err(|source| TlsError::Read { what, file: key_file.into(), source })?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what, file: key_file.into(), expected: "private key (PKCS#8, PKCS#1 or SEC1)" }
        }
        e => TlsError::Pem { what, file: key_file.into(), message: e.to_string() },
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Mismatch {
        cert: cert_file.into(),
        key: key_file.into(),
        message: e.to_string(),
    })
}

/// Refuses a leaf certificate that has expired or is not valid yet.
fn check_validity(leaf: &CertificateDer<'_>, file: &Path) -> Result<(), TlsError> {
    let invalid = |message: String| TlsError::NotValidNow { file: file.into(), message };
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| invalid(format!("unreadable: {e}")))?;
    let validity = cert.validity();
    let now = x509_parser::time::ASN1Time::now();
    if now > validity.not_after {
        return Err(invalid(format!("it expired at {}", validity.not_after)));
    }
    if now < validity.not_before {
        return Err(invalid(format!("it is valid only from {}", validity.not_before)));
    }
    Ok(())
}

/// The leaf's subject and expiry, for the log.
fn describe_leaf(key: &CertifiedKey) -> String {
    match key.end_entity_cert().ok().and_then(|leaf| x509_parser::parse_x509_certificate(leaf).ok()) {
        Some((_, cert)) => format!("{} (valid until {})", cert.subject(), cert.validity().not_after),
        None => "unreadable".to_owned(),
    }
}

/// Who a client certificate names: its subject's common name and its subject alternative
/// names (DNS names, URIs such as SPIFFE IDs, e-mail addresses), each typed by its kind as the
/// config writes identities (`cn:worker-a`, `dns:…`, `uri:spiffe://…`, `email:…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientIdentity {
    pub names: Vec<String>,
}

impl ClientIdentity {
    /// The identity of a verified client certificate; `None` when it names nothing.
    pub(crate) fn of(leaf: &CertificateDer<'_>) -> Option<ClientIdentity> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
        let mut names: Vec<String> =
            cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok().map(|cn| format!("cn:{cn}"))).collect();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) => names.push(format!("dns:{n}")),
                    GeneralName::URI(n) => names.push(format!("uri:{n}")),
                    GeneralName::RFC822Name(n) => names.push(format!("email:{n}")),
                    _ => {}
                }
            }
        }
        names.dedup();
        (!names.is_empty()).then_some(ClientIdentity { names })
    }

    /// The name it is known by in logs: its first.
    pub(crate) fn display_name(&self) -> &str {
        &self.names[0]
    }
}

/// The names of the client certificate a request's connection presented, if any: what the
/// access rules match `auth.client_identities` against.
pub(crate) fn client_names(extensions: &axum::http::Extensions) -> Option<&[String]> {
    extensions.get::<Arc<ClientIdentity>>().map(|identity| identity.names.as_slice())
}
