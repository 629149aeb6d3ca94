//! Who may read what, for every protocol: optional tokens, and client certificate identities
//! (`auth.client_identities`, matched against a certificate the TLS handshake verified), each
//! allowed every model or only those under some id prefixes. Tokens come from the config (`auth.tokens`,
//! `ZTSERVE_AUTH__TOKENS`) and a token file re-read when it changes. Only SHA-256 digests of tokens are kept (unless the S3
//! endpoint is on: SigV4 verification needs each token as its key's secret), and a presented
//! token is compared with every one of them in constant time, so neither the comparison's
//! timing nor a heap dump gives a token away; no token is ever logged. How a token is presented
//! is each protocol's business (the bearer header HTTP and the Hub API read with [`bearer`],
//! S3's signing keys); what it comes to is one [`Verdict`], whose refusal is counted once; a
//! model outside a token's prefixes answers exactly as a model that does not exist.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::Digest as _;
use subtle::ConstantTimeEq as _;

use crate::config::{IdentityEntry, TokenEntry};
use crate::storage::scan::FileIdentity;
use crate::telemetry::names;

/// How often the token file is checked for changes.
const TOKEN_FILE_POLL: Duration = Duration::from_secs(1);

/// What one request may read, once its protocol has checked its token.
#[derive(Debug, Clone)]
pub(crate) enum Access {
    /// Every model (no tokens configured, or a token without prefixes).
    Everything,
    /// Only models whose id is one of these prefixes or lies below one (`team-a` allows
    /// `team-a/llama`, not `team-ab/x`).
    Under(Arc<[String]>),
}

impl Access {
    pub(crate) fn allows(&self, id: &str) -> bool {
        match self {
            Access::Everything => true,
            Access::Under(prefixes) => prefixes
                .iter()
                .any(|p| id.strip_prefix(p.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))),
        }
    }
}

/// What a request's credentials come to ([`Tokens::verdict`]): one verdict per request,
/// whatever the protocol.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// What it may read: everything when no tokens are needed, else its token's grant.
    Allowed(Access),
    /// Tokens are needed and it carries none.
    Missing,
    /// The token it carries is not accepted.
    Invalid,
}

/// Why a request is refused for its credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Missing,
    Invalid,
}

impl Verdict {
    /// What the request may read, or why it is refused. A refusal is counted here, in
    /// `ztserve_auth_failures_total` by reason, and nowhere else, so a refused request counts
    /// once whichever protocol refuses it.
    pub(crate) fn access(&self) -> Result<Access, Refused> {
        let refused = match self {
            Verdict::Allowed(access) => return Ok(access.clone()),
            Verdict::Missing => Refused::Missing,
            Verdict::Invalid => Refused::Invalid,
        };
        let reason = if refused == Refused::Missing { "missing" } else { "invalid" };
        metrics::counter!(names::AUTH_FAILURES, "reason" => reason).increment(1);
        Err(refused)
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), as the
/// protocols that take bearer tokens (HTTP, the Hub API) present them.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

/// One accepted token: its digest and what it may read, and, only while the S3 endpoint is
/// on, its S3 key (SigV4 is a shared-secret scheme: verifying a signature needs the secret).
#[derive(Clone)]
struct Grant {
    sha256: [u8; 32],
    access: Access,
    s3: Option<S3Key>,
}

/// A token as S3 credentials: the access key id is the first 20 hex digits of the token's
/// SHA-256 (public: it names the key), the secret is the token.
#[derive(Clone)]
struct S3Key {
    access_key_id: String,
    secret: Arc<str>,
}

/// The S3 access key id of a token whose SHA-256 is `sha256`.
fn s3_access_key_id(sha256: &[u8; 32]) -> String {
    hex::encode(&sha256[..10])
}

/// Why a token entry was refused. Never carries the token itself.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub(crate) struct TokenError {
    pub origin: String,
    pub message: String,
}

/// What an entry's prefixes allow: everything when it has none.
fn access_under(prefixes: &[String]) -> Access {
    if prefixes.is_empty() { Access::Everything } else { Access::Under(prefixes.to_vec().into()) }
}

/// The grant of one parsed entry.
fn grant(entry: &TokenEntry, keep_s3_secret: bool) -> Grant {
    let access = access_under(&entry.prefixes);
    let sha256: [u8; 32] = sha2::Sha256::digest(entry.token.as_bytes()).into();
    let s3 =
        keep_s3_secret.then(|| S3Key { access_key_id: s3_access_key_id(&sha256), secret: entry.token.as_str().into() });
    Grant { sha256, access, s3 }
}

/// Parses one line of the token file, `TOKEN [PREFIX ...]` as the config's entries are;
/// `origin` names the line in errors (never its text).
fn parse_entry(entry: &str, origin: &str, keep_s3_secret: bool) -> Result<Grant, TokenError> {
    let parsed = TokenEntry::parse(entry).map_err(|message| TokenError { origin: origin.to_owned(), message })?;
    Ok(grant(&parsed, keep_s3_secret))
}

/// Parses a token file: one entry per line; blank lines and lines starting with `#` skipped.
fn parse_file(text: &str, path: &Path, keep_s3_secrets: bool) -> Result<Vec<Grant>, TokenError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        .map(|(n, line)| parse_entry(line, &format!("token file {} line {}", path.display(), n + 1), keep_s3_secrets))
        .collect()
}

/// What identifies one version of the token file (a change to any of it re-reads the file).
type FileStamp = FileIdentity;

fn stamp(path: &Path) -> std::io::Result<FileStamp> {
    // `metadata` follows symlinks, so a Kubernetes secret's `..data` swap is seen as a change.
    Ok(FileIdentity::of(&std::fs::metadata(path)?))
}

/// Each listed client certificate identity with what its prefixes grant.
fn identity_grants(identities: &[IdentityEntry]) -> Vec<(String, Access)> {
    identities.iter().map(|e| (e.identity.clone(), access_under(&e.prefixes))).collect()
}

/// The tokens in force, and the client certificate identities granted models.
pub(crate) struct Tokens {
    /// No tokens and no identities configured at all: every request may read everything.
    open: bool,
    /// Each listed client certificate identity and what it may read.
    identities: Vec<(String, Access)>,
    from_config: Vec<Grant>,
    file: Option<PathBuf>,
    /// The token file's grants and the version they were read from.
    from_file: RwLock<(Vec<Grant>, Option<FileStamp>)>,
    /// Whether tokens are kept as S3 secrets too (the S3 endpoint is on).
    keep_s3_secrets: bool,
}

impl Tokens {
    /// The tokens and client certificate identities granted writing to the artifact store:
    /// `entries` and `identities` alone, counted in no gauge (`ztserve_auth_tokens` counts the
    /// readers').
    pub(crate) fn writers(entries: &[TokenEntry], identities: &[IdentityEntry]) -> Tokens {
        Tokens {
            open: entries.is_empty() && identities.is_empty(),
            identities: identity_grants(identities),
            from_config: entries.iter().map(|e| grant(e, false)).collect(),
            file: None,
            from_file: RwLock::new((Vec::new(), None)),
            keep_s3_secrets: false,
        }
    }

    /// The tokens of `entries` (config and environment, checked as they loaded) and `file`.
    /// An invalid line, or an unreadable file, is an error: the server must not start with
    /// less protection than configured. With `keep_s3_secrets`, each token is also kept as the
    /// secret of its S3 key.
    pub(crate) fn new(
        entries: &[TokenEntry],
        file: Option<&Path>,
        keep_s3_secrets: bool,
        identities: &[IdentityEntry],
    ) -> Result<Tokens, TokenError> {
        let from_config = entries.iter().map(|e| grant(e, keep_s3_secrets)).collect();
        let file = file.map(Path::to_path_buf);
        let tokens = Tokens {
            open: entries.is_empty() && file.is_none() && identities.is_empty(),
            identities: identity_grants(identities),
            from_config,
            file,
            from_file: RwLock::new((Vec::new(), None)),
            keep_s3_secrets,
        };
        if let Some(path) = &tokens.file {
            let read = std::fs::read_to_string(path)
                .map_err(|e| TokenError { origin: format!("token file {}", path.display()), message: e.to_string() })?;
            let stamp = stamp(path).ok();
            *tokens.from_file.write().expect("never poisoned") = (parse_file(&read, path, keep_s3_secrets)?, stamp);
        }
        metrics::gauge!(names::AUTH_TOKENS).set(tokens.count() as f64);
        for (identity, _) in &tokens.identities {
            metrics::counter!(names::AUTH_CLIENT_REQUESTS, "identity" => identity.clone()).absolute(0);
        }
        Ok(tokens)
    }

    /// Whether requests need a token.
    pub(crate) fn required(&self) -> bool {
        !self.open
    }

    fn count(&self) -> usize {
        self.from_config.len() + self.from_file.read().expect("never poisoned").0.len()
    }

    /// The verdict on a request that carries `presented`, its token if any (as its protocol
    /// presents one), over a connection whose verified client certificate names `client`. A
    /// listed identity decides alone; otherwise the token does, as without client certificates.
    pub(crate) fn verdict(&self, presented: Option<&str>, client: Option<&[String]>) -> Verdict {
        if let Some((identity, access)) = self.identity_access(client) {
            metrics::counter!(names::AUTH_CLIENT_REQUESTS, "identity" => identity.to_owned()).increment(1);
            return Verdict::Allowed(access.clone());
        }
        if !self.required() {
            return Verdict::Allowed(Access::Everything);
        }
        match presented {
            None => Verdict::Missing,
            Some(token) => self.check(token).map_or(Verdict::Invalid, Verdict::Allowed),
        }
    }

    /// The first listed identity a client certificate's names hold, and what it may read.
    pub(crate) fn identity_access(&self, client: Option<&[String]>) -> Option<(&str, &Access)> {
        let names = client?;
        self.identities.iter().find(|(id, _)| names.contains(id)).map(|(id, access)| (id.as_str(), access))
    }

    /// What `token` may read, or `None` if it is not a valid token. Every grant is compared,
    /// whatever matched first.
    fn check(&self, token: &str) -> Option<Access> {
        let presented: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let from_file = self.from_file.read().expect("never poisoned");
        let mut found = None;
        for grant in self.from_config.iter().chain(&from_file.0) {
            if bool::from(grant.sha256.ct_eq(&presented)) && found.is_none() {
                found = Some(grant.access.clone());
            }
        }
        found
    }

    /// The secret of S3 access key `access_key_id` and what it may read, when it is a token's.
    pub(crate) fn s3_key(&self, access_key_id: &str) -> Option<(Arc<str>, Access)> {
        let from_file = self.from_file.read().expect("never poisoned");
        self.from_config.iter().chain(&from_file.0).find_map(|grant| {
            let key = grant.s3.as_ref().filter(|k| k.access_key_id == access_key_id)?;
            Some((Arc::clone(&key.secret), grant.access.clone()))
        })
    }

    /// Re-reads the token file if it changed. A file that cannot be read or parsed revokes
    /// every token it held (the config's stay): failing closed, so a broken edit never
    /// leaves a removed token working. The error is logged and counted.
    pub(crate) fn reload_if_changed(&self) {
        let Some(path) = &self.file else { return };
        // A missing file has no stamp: it is reported once, when it goes, not every poll.
        let now = stamp(path).ok();
        if now == self.from_file.read().expect("never poisoned").1 {
            return;
        }
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| TokenError { origin: format!("token file {}", path.display()), message: e.to_string() })
            .and_then(|text| parse_file(&text, path, self.keep_s3_secrets));
        let outcome = match parsed {
            Ok(grants) => {
                tracing::info!(file = %path.display(), tokens = grants.len(), "token file re-read");
                *self.from_file.write().expect("never poisoned") = (grants, now);
                "ok"
            }
            Err(e) => {
                tracing::error!(error = %e, "token file unusable: its tokens are refused until it is fixed");
                *self.from_file.write().expect("never poisoned") = (Vec::new(), now);
                "error"
            }
        };
        metrics::counter!(names::AUTH_TOKEN_FILE_RELOADS, "outcome" => outcome).increment(1);
        metrics::gauge!(names::AUTH_TOKENS).set(self.count() as f64);
    }

    /// Re-reads the token file whenever it changes, forever.
    pub(crate) async fn watch(self: Arc<Self>) {
        if self.file.is_none() {
            return;
        }
        let mut interval = tokio::time::interval(TOKEN_FILE_POLL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            let tokens = Arc::clone(&self);
            let _ = tokio::task::spawn_blocking(move || tokens.reload_if_changed()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-team";

    #[test]
    fn prefixes_allow_whole_segments_only() {
        let grant = parse_entry(&format!("{TOKEN} team-a/ org/vision"), "t", false).unwrap();
        for (id, allowed) in [
            ("team-a", true),
            ("team-a/llama", true),
            ("team-a/x/y", true),
            ("team-ab/x", false),
            ("team", false),
            ("org/vision/clip", true),
            ("org/visionary", false),
            ("org", false),
            ("other", false),
        ] {
            assert_eq!(grant.access.allows(id), allowed, "{id}");
        }
        assert!(parse_entry(TOKEN, "t", false).unwrap().access.allows("anything/at/all"));
    }

    #[test]
    fn a_token_is_an_s3_key_only_while_the_endpoint_keeps_secrets() {
        let id = s3_access_key_id(&sha2::Sha256::digest(TOKEN.as_bytes()).into());
        assert_eq!(id.len(), 20);
        let entries = [TokenEntry::parse(&format!("{TOKEN} team-a")).unwrap()];
        let kept = Tokens::new(&entries, None, true, &[]).unwrap();
        let (secret, access) = kept.s3_key(&id).expect("the token's key");
        assert_eq!((&*secret, access.allows("team-a/x"), access.allows("b")), (TOKEN, true, false));
        assert!(kept.s3_key("0123456789abcdef0123").is_none());
        assert!(Tokens::new(&entries, None, false, &[]).unwrap().s3_key(&id).is_none(), "no secret kept");
    }

    #[test]
    fn bad_lines_of_the_token_file_are_refused_by_line_without_repeating_the_token() {
        for (entry, expected) in [
            ("", "is empty"),
            ("short", "at least 16"),
            ("has\"quote0123456789", "characters"),
            (&format!("{TOKEN} ../etc"), "prefix"),
        ] {
            let error = parse_entry(entry, "token file t line 3", false).err().unwrap().to_string();
            assert!(error.starts_with("token file t line 3: ") && error.contains(expected), "{entry:?}: {error}");
            let token = entry.split_whitespace().next().unwrap_or("");
            assert!(token.is_empty() || !error.contains(token), "{error} repeats the token");
        }
    }

    #[test]
    fn only_a_listed_token_is_accepted_and_an_emptied_file_accepts_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("# team A\n{TOKEN} team-a\n\n")).unwrap();
        let entries = [TokenEntry::parse("ffffffffffffffffffff").unwrap()];
        let tokens = Tokens::new(&entries, Some(&path), false, &[]).unwrap();
        assert!(tokens.required());
        assert!(matches!(tokens.check("ffffffffffffffffffff"), Some(Access::Everything)));
        assert!(matches!(tokens.check(TOKEN), Some(Access::Under(_))));
        assert!(tokens.check("0123456789abcdef-tea").is_none(), "a prefix of a token");
        assert!(tokens.check(&format!("{TOKEN}x")).is_none());
        std::fs::write(&path, "").unwrap();
        tokens.reload_if_changed();
        assert!(tokens.check(TOKEN).is_none(), "a token removed from the file still works");
        assert!(tokens.required(), "an empty token file must not open the server");
        std::fs::write(&path, format!("{TOKEN} team-a\nbroken line with \"quotes\"\n")).unwrap();
        tokens.reload_if_changed();
        assert!(tokens.check(TOKEN).is_none(), "a file with an invalid line keeps nothing");
        assert!(tokens.check("ffffffffffffffffffff").is_some(), "the config's tokens stay");
        assert!(!Tokens::new(&[], None, false, &[]).unwrap().required());
    }

    #[test]
    fn a_listed_identity_decides_alone_and_an_unlisted_one_falls_back_to_tokens() {
        let identities = [IdentityEntry::parse("cn:worker-a team-a").unwrap()];
        let tokens = Tokens::new(&[], None, false, &identities).unwrap();
        assert!(tokens.required(), "identities close the server to the unidentified");
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let listed = names(&["dns:worker-a.example", "cn:worker-a"]);
        match tokens.verdict(Some("not-a-token-at-all"), Some(&listed)) {
            Verdict::Allowed(access) => assert!(access.allows("team-a/x") && !access.allows("team-b/x")),
            other => panic!("{other:?}"),
        }
        // A name of another kind equal to the listed one's is not it.
        for unlisted in [names(&["cn:worker-z"]), names(&["dns:worker-a", "email:worker-a", "uri:worker-a"])] {
            assert!(matches!(tokens.verdict(None, Some(&unlisted)), Verdict::Missing));
        }
        let unlisted = names(&["cn:worker-z"]);
        assert!(matches!(tokens.verdict(None, Some(&unlisted)), Verdict::Missing));
        assert!(matches!(tokens.verdict(Some(TOKEN), Some(&unlisted)), Verdict::Invalid));
        assert!(matches!(tokens.verdict(None, None), Verdict::Missing));
    }
}
