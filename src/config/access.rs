//! The sections of who may read what and what is trusted: bearer tokens and the identities of
//! client certificates with the model id prefixes each may read (`[auth]`), the TLS listener's
//! certificates (`[tls]`), and the keys, CAs and per-source policies model signatures are
//! checked under (`[signing]`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Who may read what.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Auth {
    /// Tokens accepted (as HTTP bearer tokens, S3 keys…), each `TOKEN [PREFIX ...]`; with no
    /// tokens and no `token_file`, none is needed.
    pub tokens: Vec<TokenEntry>,
    /// A file of tokens, one entry per line, re-read when it changes.
    pub token_file: Option<PathBuf>,
    /// Whether `/metrics` needs a token too (when tokens are configured).
    pub metrics_require_token: bool,
    /// Client certificate identities (a subject CN or subject alternative name, typed `cn:`,
    /// `dns:`, `uri:` or `email:`) and what each may read, `KIND:NAME [PREFIX ...]` as a
    /// token's entry; they need `tls.client_ca_file`.
    pub client_identities: Vec<IdentityEntry>,
}

/// TLS on every listener (the HTTP contract with `/hf` and `/v2`, and the S3 endpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Tls {
    /// The certificate chain, PEM, leaf first; with `key_file` it turns TLS on for every
    /// listener (absent: plain HTTP).
    pub cert_file: Option<PathBuf>,
    /// The leaf's private key, PEM (PKCS#8, PKCS#1 or SEC1; RSA, ECDSA or Ed25519).
    pub key_file: Option<PathBuf>,
    /// A PEM bundle of the CAs client certificates must chain to: when set, every client must
    /// present one (absent: none is asked for).
    pub client_ca_file: Option<PathBuf>,
    /// Seconds a client may take to complete its handshake.
    pub handshake_timeout_secs: u64,
}

impl Default for Tls {
    fn default() -> Tls {
        Tls { cert_file: None, key_file: None, client_ca_file: None, handshake_timeout_secs: 10 }
    }
}

/// OpenSSF model signatures (`model_signing`'s `model.sig`): what is trusted, and what a
/// model's signature decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Signing {
    /// What a signature decides: `none` (not read), `if-signed` (a signed model whose signature
    /// fails is not served) or `required` (an unsigned or failing model is not served).
    pub policy: SigningPolicy,
    /// Trusted signers' public keys, PEM files (ECDSA P-256, P-384 or P-521; Ed25519).
    pub public_keys: Vec<PathBuf>,
    /// A PEM bundle of the CAs a signing certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// The signature file's name in a model's directory.
    pub signature_file: String,
    /// Per-source policies, `SOURCE=POLICY` (`SOURCE` as written in `sources.paths`).
    pub source_policies: Vec<SourcePolicy>,
    /// The largest signature file read, in bytes.
    pub max_signature_bytes: u64,
}

impl Default for Signing {
    fn default() -> Signing {
        Signing {
            policy: SigningPolicy::None,
            public_keys: Vec::new(),
            ca_file: None,
            signature_file: "model.sig".into(),
            source_policies: Vec::new(),
            max_signature_bytes: 64 << 20,
        }
    }
}

impl Signing {
    /// The policy of the source written `source` in `sources.paths`.
    pub fn policy_of(&self, source: &str) -> SigningPolicy {
        self.source_policies.iter().rev().find(|p| p.source == source).map_or(self.policy, |p| p.policy)
    }
}

/// What a model's signature decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SigningPolicy {
    /// Signatures are not read.
    None,
    /// A signed model is served only when its signature verifies; an unsigned one is served.
    IfSigned,
    /// Only a model whose signature verifies is served.
    Required,
}

impl SigningPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            SigningPolicy::None => "none",
            SigningPolicy::IfSigned => "if-signed",
            SigningPolicy::Required => "required",
        }
    }
}

/// One source's signing policy, written `SOURCE=POLICY`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SourcePolicy {
    pub source: String,
    pub policy: SigningPolicy,
}

impl TryFrom<String> for SourcePolicy {
    type Error = String;

    fn try_from(entry: String) -> Result<SourcePolicy, String> {
        let (source, policy) = entry.rsplit_once('=').ok_or("is not SOURCE=POLICY")?;
        let policy = match policy.trim() {
            "none" => SigningPolicy::None,
            "if-signed" => SigningPolicy::IfSigned,
            "required" => SigningPolicy::Required,
            other => return Err(format!("policy {other:?} is not none, if-signed or required")),
        };
        Ok(SourcePolicy { source: source.trim().to_owned(), policy })
    }
}

impl From<SourcePolicy> for String {
    fn from(entry: SourcePolicy) -> String {
        format!("{}={}", entry.source, entry.policy.as_str())
    }
}

/// One client certificate identity and the model id prefixes it may read (none: every model),
/// as written `IDENTITY [PREFIX ...]` in `auth.client_identities`. The identity is typed by
/// where in the certificate it must appear (`cn:` the subject's common name, `dns:`, `uri:` or
/// `email:` a subject alternative name of that kind), so a name of one kind never passes for
/// another (an e-mail address equal to a writer's DNS name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdentityEntry {
    pub identity: String,
    pub prefixes: Vec<String>,
}

impl IdentityEntry {
    pub fn parse(entry: &str) -> Result<IdentityEntry, String> {
        let mut words = entry.split_whitespace();
        let identity = words.next().ok_or("is empty")?;
        let typed = IDENTITY_KINDS.iter().any(|kind| {
            identity.strip_prefix(kind).and_then(|rest| rest.strip_prefix(':')).is_some_and(|v| !v.is_empty())
        });
        if !typed {
            return Err(format!(
                "identity {identity:?} names no kind: write cn:NAME (the subject's common name), dns:NAME, uri:NAME or email:NAME"
            ));
        }
        Ok(IdentityEntry { identity: identity.to_owned(), prefixes: parse_prefixes(words)? })
    }
}

/// The kinds of name a client certificate identity is typed by, as `KIND:NAME`.
const IDENTITY_KINDS: [&str; 4] = ["cn", "dns", "uri", "email"];

impl TryFrom<String> for IdentityEntry {
    type Error = String;

    fn try_from(entry: String) -> Result<IdentityEntry, String> {
        IdentityEntry::parse(&entry)
    }
}

impl From<IdentityEntry> for String {
    fn from(entry: IdentityEntry) -> String {
        std::iter::once(entry.identity).chain(entry.prefixes).collect::<Vec<_>>().join(" ")
    }
}

/// Model id prefixes as an entry writes them, each checked.
fn parse_prefixes<'a>(words: impl Iterator<Item = &'a str>) -> Result<Vec<String>, String> {
    let mut prefixes = Vec::new();
    for prefix in words {
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() || prefix.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
            return Err(format!("prefix {prefix:?} is not a model id prefix like team-a or team-a/vision"));
        }
        prefixes.push(prefix.to_owned());
    }
    Ok(prefixes)
}

/// The shortest token accepted: 16 characters of a random token are ~96 bits.
pub const MIN_TOKEN_LEN: usize = 16;

/// One token and the model id prefixes it may read (none: every model), as written
/// `TOKEN [PREFIX ...]` in `auth.tokens`, `ZTSERVE_AUTH__TOKENS` or a line of the token file;
/// checked when it is read. Never shown: `Debug` redacts the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TokenEntry {
    pub token: String,
    pub prefixes: Vec<String>,
}

impl TokenEntry {
    /// Parses `TOKEN [PREFIX ...]`; the error never repeats the token.
    pub fn parse(entry: &str) -> Result<TokenEntry, String> {
        let mut words = entry.split_whitespace();
        let token = words.next().ok_or("is empty")?;
        // RFC 6750's b64token: what a client can send in `Authorization: Bearer`.
        let b64token = token.trim_end_matches('=').bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
        if !b64token || token.starts_with('=') {
            return Err(
                "the token has characters a bearer token cannot carry (allowed: A-Z a-z 0-9 - . _ ~ + / and trailing =)"
                    .into(),
            );
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!("the token is {} characters; at least {MIN_TOKEN_LEN} are required", token.len()));
        }
        Ok(TokenEntry { token: token.to_owned(), prefixes: parse_prefixes(words)? })
    }
}

impl TryFrom<String> for TokenEntry {
    type Error = String;

    fn try_from(entry: String) -> Result<TokenEntry, String> {
        TokenEntry::parse(&entry)
    }
}

impl From<TokenEntry> for String {
    fn from(entry: TokenEntry) -> String {
        std::iter::once(entry.token).chain(entry.prefixes).collect::<Vec<_>>().join(" ")
    }
}

impl std::fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry").field("token", &"<redacted>").field("prefixes", &self.prefixes).finish()
    }
}
