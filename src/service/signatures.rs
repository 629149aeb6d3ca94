//! Model signatures as the service enforces them: each source's policy (`signing.policy`,
//! `signing.source_policies`), the verdict of a model version's signature (reached once per
//! version of its signed directory and kept), and the admission of a model to any protocol.
//! A verdict needs every file of the signed directory's SHA-256: they are the digests the
//! service computes ahead (never a `SHA256SUMS`'s or a source's stated digest), so until they
//! are known a request gets the retryable answer pending digests get. After each scan every
//! signed model is verified in the background, so listings show verdicts before anyone asks.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Published, PublishedFile, Service, ServiceError, companion_etag};
use crate::catalog::{Catalog, Model, SignedDirectory};
use crate::config::SigningPolicy;
use crate::format::Manifest;
use crate::signing::{SignatureError, SignedModel, Trust};
use crate::telemetry::names;

/// How long the background verification waits for digests between looks at the catalog.
const BACKGROUND_WAIT: Duration = Duration::from_secs(30);

/// What signatures are checked against: the keys and CAs configured, loaded at start.
pub(crate) struct Signatures {
    trust: Trust,
}

impl Signatures {
    pub(super) fn new(config: &crate::config::Signing) -> Result<Signatures, crate::signing::TrustError> {
        let trust = Trust::load(&config.public_keys, config.ca_file.as_deref())?;
        Ok(Signatures { trust })
    }

    /// Whether any source reads signatures.
    pub(super) fn any_enforced(config: &crate::config::Signing) -> bool {
        config.policy != SigningPolicy::None || config.source_policies.iter().any(|p| p.policy != SigningPolicy::None)
    }
}

/// What a model version's signature was found to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SignatureState {
    /// No signature file covers it.
    Unsigned,
    /// Its signature verifies, and every file of its signed directory matches.
    Verified {
        signer: String,
        files: usize,
    },
    Failed(SignatureError),
}

/// A verdict, with when it was reached and for which version of the signed directory.
#[derive(Debug)]
pub(crate) struct SignatureVerdict {
    pub(crate) state: SignatureState,
    pub(crate) checked_at: SystemTime,
    /// The signed directory's version it holds for (empty for an unsigned model).
    directory_version: String,
}

/// A model's signature as a listing shows it.
#[derive(Debug, Clone)]
pub(crate) enum SignatureStatus {
    /// Its source's policy is `none`: signatures are not read.
    NotChecked,
    /// Not reached yet (its digests are being computed).
    Pending(SigningPolicy),
    Reached(SigningPolicy, Arc<SignatureVerdict>),
}

impl SignatureStatus {
    /// As JSON (`None` when signatures are not read): `state` (`verified`, `unsigned`,
    /// `failed`, `pending`), the policy, and the signer, when it was checked and why it failed.
    pub(crate) fn to_json(&self) -> Option<serde_json::Value> {
        let (policy, verdict) = match self {
            SignatureStatus::NotChecked => return None,
            SignatureStatus::Pending(policy) => {
                return Some(serde_json::json!({ "state": "pending", "policy": policy.as_str() }));
            }
            SignatureStatus::Reached(policy, verdict) => (policy, verdict),
        };
        let checked_at = rfc3339(verdict.checked_at);
        let mut json = serde_json::json!({ "policy": policy.as_str(), "checked_at": checked_at });
        match &verdict.state {
            SignatureState::Unsigned => json["state"] = "unsigned".into(),
            SignatureState::Verified { signer, files } => {
                json["state"] = "verified".into();
                json["signer"] = signer.as_str().into();
                json["files"] = (*files).into();
            }
            SignatureState::Failed(error) => {
                json["state"] = "failed".into();
                json["reason"] = serde_json::json!({ "code": error.code(), "message": error.to_string() });
            }
        }
        Some(json)
    }

    /// Whether its verdict is not reached yet.
    pub(crate) fn is_pending(&self) -> bool {
        matches!(self, SignatureStatus::Pending(_))
    }

    /// The state's name (`not_checked`, `pending`, `unsigned`, `verified`, `failed`).
    pub(crate) fn state(&self) -> &'static str {
        match self {
            SignatureStatus::NotChecked => "not_checked",
            SignatureStatus::Pending(_) => "pending",
            SignatureStatus::Reached(_, verdict) => match verdict.state {
                SignatureState::Unsigned => "unsigned",
                SignatureState::Verified { .. } => "verified",
                SignatureState::Failed(_) => "failed",
            },
        }
    }

    /// The signer, once verified.
    pub(crate) fn signer(&self) -> Option<&str> {
        match self {
            SignatureStatus::Reached(_, verdict) => match &verdict.state {
                SignatureState::Verified { signer, .. } => Some(signer),
                _ => None,
            },
            _ => None,
        }
    }

    /// Why the model is not served under its policy, if it is not (and the verdict is reached).
    pub(crate) fn refusal(&self, model: &str, signature_file: &str) -> Option<ServiceError> {
        let SignatureStatus::Reached(policy, verdict) = self else { return None };
        match (&verdict.state, policy) {
            (SignatureState::Failed(error), SigningPolicy::IfSigned | SigningPolicy::Required) => {
                Some(ServiceError::SignatureFailed { model: model.to_owned(), source: error.clone() })
            }
            (SignatureState::Unsigned, SigningPolicy::Required) => {
                Some(ServiceError::Unsigned { model: model.to_owned(), signature_file: signature_file.to_owned() })
            }
            _ => None,
        }
    }
}

/// `at` as RFC 3339 in UTC, to the second.
fn rfc3339(at: SystemTime) -> String {
    let t = time::OffsetDateTime::from(at);
    let month = u8::from(t.month());
    format!("{:04}-{month:02}-{:02}T{:02}:{:02}:{:02}Z", t.year(), t.day(), t.hour(), t.minute(), t.second())
}

impl Service {
    /// The signing policy of `model`'s source.
    pub(crate) fn signing_policy(&self, model: &Model) -> SigningPolicy {
        self.settings.signing.policy_of(&model.source.name)
    }

    /// The signature of `model` as far as it is known, without waiting.
    pub(crate) fn signature_status(&self, catalog: &Catalog, model: &Model) -> SignatureStatus {
        let policy = self.signing_policy(model);
        if policy == SigningPolicy::None {
            return SignatureStatus::NotChecked;
        }
        match self.kept_verdict(catalog, model) {
            Some(verdict) => SignatureStatus::Reached(policy, verdict),
            None => SignatureStatus::Pending(policy),
        }
    }

    /// The verdict kept for `model`'s version and its signed directory's current version.
    fn kept_verdict(&self, catalog: &Catalog, model: &Model) -> Option<Arc<SignatureVerdict>> {
        let verdict = self.learnt.of(model).signature.load_full()?;
        let current = catalog.signed_directory(&model.id).map_or("", |d| d.version.as_str());
        (verdict.directory_version == current).then_some(verdict)
    }

    /// Why `model` is not served under its source's policy, when its verdict says so already.
    pub(crate) fn signature_refusal(&self, catalog: &Catalog, model: &Model) -> Option<ServiceError> {
        self.signature_status(catalog, model).refusal(&model.id, &self.settings.signing.signature_file)
    }

    /// The model `id` and its manifest, as [`Service::model`] gives them, once its signature
    /// lets it be served (waiting for its digests as a request for one file does).
    pub(crate) async fn servable_model(
        self: &Arc<Self>,
        id: &str,
    ) -> Result<(Arc<Model>, Arc<Manifest>, SignatureStatus), ServiceError> {
        let catalog = self.catalog();
        let (model, manifest) = self.model(id)?;
        let status = self.admit(&catalog, &model, &manifest, self.digest_wait(false)).await?;
        Ok((model, manifest, status))
    }

    /// Whether `model` may be served under its source's policy: its verdict reached (waiting at
    /// most `wait` for the digests it needs) and not a refusal.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        wait: Duration,
    ) -> Result<SignatureStatus, ServiceError> {
        let policy = self.signing_policy(model);
        if policy == SigningPolicy::None {
            return Ok(SignatureStatus::NotChecked);
        }
        let verdict = match self.kept_verdict(catalog, model) {
            Some(verdict) => verdict,
            None => self.reach_verdict(catalog, model, manifest, wait).await?,
        };
        let status = SignatureStatus::Reached(policy, verdict);
        match status.refusal(&model.id, &self.settings.signing.signature_file) {
            Some(refused) => Err(refused),
            None => Ok(status),
        }
    }

    /// Checks `model`'s signature now, waiting at most `wait` for its files' digests, and
    /// keeps the verdict. What may change by itself (a digest being computed, a store that does
    /// not answer) is an error, not a verdict.
    async fn reach_verdict(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        wait: Duration,
    ) -> Result<Arc<SignatureVerdict>, ServiceError> {
        let (state, directory_version) = match catalog.signed_directory(&model.id) {
            None => (SignatureState::Unsigned, String::new()),
            Some(dir) => {
                let state = match self.check_signed_directory(catalog, model, manifest, dir, wait).await {
                    Ok(signed) => {
                        SignatureState::Verified { files: signed.file_count(), signer: signed.signer.clone() }
                    }
                    Err(Checked::Refused(error)) => SignatureState::Failed(error),
                    Err(Checked::NotYet(error)) => return Err(error),
                };
                (state, dir.version.clone())
            }
        };
        let verdict = Arc::new(SignatureVerdict { state, checked_at: SystemTime::now(), directory_version });
        let learnt = self.learnt.of(model);
        let previous = learnt.signature.swap(Some(Arc::clone(&verdict)));
        if previous.is_none_or(|p| p.state != verdict.state || p.directory_version != verdict.directory_version) {
            self.report_verdict(model, &verdict);
        }
        Ok(verdict)
    }

    /// Logs and counts a new verdict, and sets the gauge of models by signature state.
    fn report_verdict(&self, model: &Model, verdict: &SignatureVerdict) {
        let outcome = match &verdict.state {
            SignatureState::Unsigned => {
                tracing::info!(model = %model.id, "model is unsigned");
                "unsigned"
            }
            SignatureState::Verified { signer, files } => {
                tracing::info!(model = %model.id, signer = %signer, files, "model signature verified");
                "verified"
            }
            SignatureState::Failed(error) => {
                tracing::error!(model = %model.id, code = error.code(), reason = %error, "model signature fails");
                "failed"
            }
        };
        metrics::counter!(names::SIGNATURE_CHECKS, "outcome" => outcome).increment(1);
    }

    /// Sets `ztserve_model_signatures{state}` from `catalog`'s models whose policy reads them:
    /// at each scrape, so it is exact then and costs nothing between scrapes.
    pub(crate) fn publish_signature_gauge(&self, catalog: &Catalog) {
        if self.signatures.is_none() {
            return;
        }
        let mut counts = [("verified", 0u64), ("unsigned", 0), ("failed", 0), ("pending", 0)];
        for model in catalog.models().filter(|m| m.state.is_ok()) {
            let state = self.signature_status(catalog, model).state();
            if let Some((_, count)) = counts.iter_mut().find(|(name, _)| *name == state) {
                *count += 1;
            }
        }
        for (state, count) in counts {
            metrics::gauge!(names::MODEL_SIGNATURES, "state" => state).set(count as f64);
        }
    }

    /// The signature of `dir` checked, then its files matched against it, by name and then by
    /// the SHA-256 of each.
    async fn check_signed_directory(
        self: &Arc<Self>,
        catalog: &Arc<Catalog>,
        model: &Arc<Model>,
        manifest: &Arc<Manifest>,
        dir: &Arc<SignedDirectory>,
        wait: Duration,
    ) -> Result<Arc<SignedModel>, Checked> {
        let signing = &self.settings.signing;
        let limit = signing.max_signature_bytes;
        if dir.signature.size > limit {
            return Err(Checked::Refused(SignatureError::TooLarge { size: dir.signature.size, limit }));
        }
        let check = {
            let learnt = self.learnt.of(model);
            let mut kept = learnt.signed_statement.lock().expect("never poisoned");
            match &*kept {
                Some((version, check)) if *version == dir.version => Arc::clone(check),
                _ => {
                    let check = Arc::new(StatementCheck::default());
                    *kept = Some((dir.version.clone(), Arc::clone(&check)));
                    check
                }
            }
        };
        let checked = check
            .get_or_try_init(|| async {
                let bytes = self.signature_bytes(model, dir).await?;
                let signatures = self.signatures.as_ref();
                let signatures = signatures
                    .ok_or_else(|| ServiceError::Internal("signatures are read with no trust loaded".into()))?;
                Ok(signatures.trust.verify(&bytes, limit).map(Arc::new))
            })
            .await
            .map_err(Checked::NotYet)?;
        let signed = checked.clone().map_err(Checked::Refused)?;
        let files = signed_files(model, dir, &signed, &signing.signature_file);
        signed.match_names(files.iter().map(|f| f.path.as_str())).map_err(Checked::Refused)?;
        let asked: Vec<&PublishedFile> = files.iter().collect();
        let digests = self
            .published_sha256s(catalog, model, manifest, &asked, super::DigestOf::ComputedFile, wait)
            .await
            .map_err(Checked::NotYet)?;
        for (file, digest) in files.iter().zip(&digests) {
            signed.check_digest(&file.path, digest).map_err(Checked::Refused)?;
        }
        Ok(signed)
    }

    /// The bytes of `dir`'s signature file.
    async fn signature_bytes(&self, model: &Arc<Model>, dir: &SignedDirectory) -> Result<Vec<u8>, ServiceError> {
        use futures_util::TryStreamExt as _;
        let companion = crate::catalog::Companion { name: String::new(), object: dir.signature.clone() };
        let bytes = self.representations.companion_file(model, &companion)?;
        bytes.source.open(0..bytes.source.len()).map_ok(|piece| piece.to_vec()).try_concat().await
    }

    /// Every file of `model`'s signed directory, as published files by their path below it:
    /// those whose digests its verdict may need (which the signature leaves out is known only
    /// once it is read).
    pub(crate) fn signature_files(&self, catalog: &Catalog, model: &Model) -> Vec<PublishedFile> {
        let Some(dir) = catalog.signed_directory(&model.id) else { return Vec::new() };
        dir.files.iter().enumerate().map(|(index, file)| signed_file(model, index, file)).collect()
    }

    /// Verifies every signed model of `catalog` whose source reads signatures, in the
    /// background, one at a time, each as soon as its digests are known; stops when a newer
    /// catalog replaces this one.
    pub(super) fn verify_signatures_ahead(self: &Arc<Self>, catalog: &Arc<Catalog>) {
        if self.signatures.is_none() {
            return;
        }
        let (service, catalog) = (Arc::clone(self), Arc::clone(catalog));
        tokio::spawn(async move {
            for model in catalog.models() {
                let Ok(manifest) = &model.state else { continue };
                if service.signing_policy(model) == SigningPolicy::None {
                    continue;
                }
                loop {
                    if !Arc::ptr_eq(&service.catalog(), &catalog) {
                        return;
                    }
                    match service.admit(&catalog, model, manifest, BACKGROUND_WAIT).await {
                        Err(ServiceError::DigestPending { .. }) => continue,
                        Err(ServiceError::SignatureFailed { .. } | ServiceError::Unsigned { .. }) | Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(model = %model.id, error = %e, "cannot check the model's signature yet; it is checked when asked or after the next scan");
                            break;
                        }
                    }
                }
            }
        });
    }
}

/// A signature file's check (its signer and statement), once per version of its directory: a
/// statement of 100k files is tens of MB of JSON, read once however many ask.
pub(crate) type StatementCheck = tokio::sync::OnceCell<Result<Arc<SignedModel>, SignatureError>>;

/// Why a check reached no verdict, or the verdict it reached.
enum Checked {
    Refused(SignatureError),
    NotYet(ServiceError),
}

/// `dir`'s files that `signed` does not leave out.
fn signed_files(
    model: &Model,
    dir: &SignedDirectory,
    signed: &SignedModel,
    signature_file: &str,
) -> Vec<PublishedFile> {
    dir.files
        .iter()
        .enumerate()
        .filter(|(_, file)| !signed.ignores(&file.name, signature_file))
        .map(|(index, file)| signed_file(model, index, file))
        .collect()
}

/// File `index` of `model`'s signed directory, as a published file.
fn signed_file(model: &Model, index: usize, file: &crate::catalog::Companion) -> PublishedFile {
    PublishedFile {
        path: file.name.clone(),
        what: Published::Signed(index),
        size: file.object.size,
        etag: companion_etag(model, file),
    }
}
