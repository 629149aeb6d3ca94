//! A test certificate authority (rcgen), the server and client certificates it issues as PEM
//! files, and requests over TLS that verify the server against it (tokio-rustls): what the TLS
//! tests and the real clients over TLS share.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SignatureAlgorithm,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The key types a certificate here may have.
pub const KEY_TYPES: [(&str, &SignatureAlgorithm); 3] = [
    ("rsa", &rcgen::PKCS_RSA_SHA256),
    ("ecdsa-p256", &rcgen::PKCS_ECDSA_P256_SHA256),
    ("ed25519", &rcgen::PKCS_ED25519),
];

/// A CA of its own, which writes its certificate to `dir/ca.pem`.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub dir: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("ca.pem"), issuer.pem()).unwrap();
        TestCa { issuer, dir: dir.to_owned() }
    }

    /// The CA's certificate, PEM.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate for `localhost` and `127.0.0.1` with a key of `alg`, written as
    /// `{name}.crt` (leaf then CA) and `{name}.key`.
    pub fn server(&self, name: &str, alg: &'static SignatureAlgorithm) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "ztserve test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.write(name, params, alg)
    }

    /// A server certificate as [`TestCa::server`] whose validity ended yesterday.
    pub fn expired_server(&self, name: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(30);
        params.not_after = now - time::Duration::days(1);
        self.write(name, params, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    /// A client certificate whose subject CN is `common_name` (and, when given, a URI SAN such as
    /// a SPIFFE ID), written as `{name}.crt` and `{name}.key`.
    pub fn client(&self, name: &str, common_name: &str, uri: Option<&str>) -> (PathBuf, PathBuf) {
        let sans = uri.map(|uri| rcgen::SanType::URI(uri.try_into().unwrap()));
        self.client_with(name, common_name, sans.into_iter().collect())
    }

    /// A client certificate of `common_name` with subject alternative names `sans`.
    pub fn client_with(&self, name: &str, common_name: &str, sans: Vec<rcgen::SanType>) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.subject_alt_names = sans;
        self.write(name, params, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    fn write(&self, name: &str, params: CertificateParams, alg: &'static SignatureAlgorithm) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate_for(alg).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_file, key_file) = (self.dir.join(format!("{name}.crt")), self.dir.join(format!("{name}.key")));
        std::fs::write(&cert_file, format!("{}{}", cert.pem(), self.issuer.pem())).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }
}

/// A TLS client that trusts `ca_file` alone, presenting `client` (certificate and key files)
/// when given, speaking only `versions`.
pub fn client_config(
    ca_file: &Path,
    client: Option<&(PathBuf, PathBuf)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert).unwrap().map(Result::unwrap).collect();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key).unwrap()).unwrap()
        }
    };
    Arc::new(config)
}

/// A connection over TLS to `address`, verified as `localhost`.
pub type TlsConnection = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// Connects to `address` and completes the handshake, or says why it failed.
pub async fn connect(address: &str, config: &Arc<rustls::ClientConfig>) -> std::io::Result<TlsConnection> {
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
    connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await
}

/// The certificate the server presented on `connection`.
pub fn server_certificate(connection: &TlsConnection) -> CertificateDer<'static> {
    connection.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// A response read off a TLS connection: its status and body.
pub struct TlsReply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `GET path` on `connection`, kept alive, with `headers`; the whole response, read by its
/// `Content-Length`.
pub async fn get(connection: &mut TlsConnection, path: &str, headers: &[(&str, &str)]) -> std::io::Result<TlsReply> {
    send(connection, "GET", path, headers, b"").await
}

/// `METHOD path` with `body` on `connection`, kept alive, with `headers`; the whole response.
pub async fn send(
    connection: &mut TlsConnection,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<TlsReply> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "PUT" {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    connection.write_all(request.as_bytes()).await?;
    connection.write_all(body).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if connection.read(&mut byte).await? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection closed mid-head"));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0);
    let mut body = vec![0; length];
    connection.read_exact(&mut body).await?;
    Ok(TlsReply { status, body })
}

/// `GET path` on a new connection to `address` trusting `config`.
pub async fn get_once(
    address: &str,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<TlsReply> {
    let mut connection = connect(address, config).await?;
    get(&mut connection, path, headers).await
}
