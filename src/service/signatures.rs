//! Model signatures as the service enforces them: each source's policy (`signing.policy`,
//! `signing.source_policies`), the verdict of a model version's signature (reached once per
//! version of its signed directory and kept), and the admission of a model to any protocol.
//! A verdict needs every file of the signed directory's SHA-256: they are the digests the
//! service computes ahead (never a `SHA256SUMS`'s or a source's stated digest), so until they
//! are known a request gets the retryable answer pending digests get. After each scan every
//! signed model is verified in the background, so listings show verdicts before anyone asks.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::catalogs::Catalogs;
use super::hashing::Hashing;
use super::learnt::LearntByVersion;
use super::published::Publication;
use super::verdict::{SignatureState, SignatureVerdict, StatementCheck};
use super::{PublishedFile, ServiceError};
use crate::catalog::{Catalog, Model, SignedDirectory};
use crate::config::SigningPolicy;
use crate::format::Manifest;
use crate::signing::{SignatureError, SignedModel, Trust};
use crate::telemetry::names;

/// How long the background verification waits for digests between looks at the catalog.
const BACKGROUND_WAIT: Duration = Duration::from_secs(30);

/// The admission of models under their sources' signing policies: the verdicts, reached and
/// kept per version, and the background verification after each scan.
pub(crate) struct SignatureAdmission {
    /// What signatures are checked against (the keys and CAs configured, loaded at start),
    /// when any source reads them.
    trust: Option<Trust>,
    signing: crate::config::Signing,
    learnt: Arc<LearntByVersion>,
    /// The signed files' bytes.
    publication: Arc<Publication>,
    /// The digests a verdict compares.
    hashing: Arc<Hashing>,
    /// The current catalog, which the background verification follows.
    catalogs: Arc<Catalogs>,
}

/// What a [`SignatureAdmission`] reads from the rest of the service.
pub(crate) struct AdmissionParts {
    pub(crate) learnt: Arc<LearntByVersion>,
    pub(crate) publication: Arc<Publication>,
    pub(crate) hashing: Arc<Hashing>,
    pub(crate) catalogs: Arc<Catalogs>,
}

impl SignatureAdmission {
    /// Loads the trust when any source reads signatures.
    pub(super) fn new(
        signing: crate::config::Signing,
        parts: AdmissionParts,
    ) -> Result<SignatureAdmission, crate::signing::TrustError> {
        let trust = if Self::any_enforced(&signing) {
            Some(Trust::load(&signing.public_keys, signing.ca_file.as_deref())?)
        } else {
            None
        };
        let AdmissionParts { learnt, publication, hashing, catalogs } = parts;
        Ok(SignatureAdmission { trust, signing, learnt, publication, hashing, catalogs })
    }

    /// Whether any source reads signatures.
    pub(super) fn any_enforced(config: &crate::config::Signing) -> bool {
        config.policy != SigningPolicy::None || config.source_policies.iter().any(|p| p.policy != SigningPolicy::None)
    }
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

impl SignatureAdmission {
    /// The signing policy of `model`'s source.
    pub(crate) fn policy(&self, model: &Model) -> SigningPolicy {
        self.signing.policy_of(&model.source.name)
    }

    /// The signature of `model` as far as it is known, without waiting.
    pub(crate) fn status(&self, catalog: &Catalog, model: &Model) -> SignatureStatus {
        let policy = self.policy(model);
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
    pub(crate) fn refusal(&self, catalog: &Catalog, model: &Model) -> Option<ServiceError> {
        self.status(catalog, model).refusal(&model.id, &self.signing.signature_file)
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
        let policy = self.policy(model);
        if policy == SigningPolicy::None {
            return Ok(SignatureStatus::NotChecked);
        }
        let verdict = match self.kept_verdict(catalog, model) {
            Some(verdict) => verdict,
            None => self.reach_verdict(catalog, model, manifest, wait).await?,
        };
        let status = SignatureStatus::Reached(policy, verdict);
        match status.refusal(&model.id, &self.signing.signature_file) {
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
    pub(crate) fn publish_gauge(&self, catalog: &Catalog) {
        if self.trust.is_none() {
            return;
        }
        let mut counts = [("verified", 0u64), ("unsigned", 0), ("failed", 0), ("pending", 0)];
        for model in catalog.models().filter(|m| m.state.is_ok()) {
            let state = self.status(catalog, model).state();
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
        let signing = &self.signing;
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
                let trust = self.trust.as_ref();
                let trust =
                    trust.ok_or_else(|| ServiceError::Internal("signatures are read with no trust loaded".into()))?;
                Ok(trust.verify(&bytes, limit).map(Arc::new))
            })
            .await
            .map_err(Checked::NotYet)?;
        let signed = checked.clone().map_err(Checked::Refused)?;
        let files = signed_files(model, dir, &signed, &signing.signature_file);
        signed.match_names(files.iter().map(|f| f.path.as_str())).map_err(Checked::Refused)?;
        let asked: Vec<&PublishedFile> = files.iter().collect();
        let digests = self
            .hashing
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
        let bytes = self.publication.representations().companion_file(model, &companion)?;
        bytes.source.open(0..bytes.source.len()).map_ok(|piece| piece.to_vec()).try_concat().await
    }

    /// Verifies every signed model of `catalog` whose source reads signatures, in the
    /// background, one at a time, each as soon as its digests are known; stops when a newer
    /// catalog replaces this one.
    pub(super) fn verify_ahead(self: &Arc<Self>, catalog: &Arc<Catalog>) {
        if self.trust.is_none() {
            return;
        }
        let (admission, catalog) = (Arc::clone(self), Arc::clone(catalog));
        tokio::spawn(async move {
            for model in catalog.models() {
                let Ok(manifest) = &model.state else { continue };
                if admission.policy(model) == SigningPolicy::None {
                    continue;
                }
                loop {
                    if !Arc::ptr_eq(&admission.catalogs.current(), &catalog) {
                        return;
                    }
                    match admission.admit(&catalog, model, manifest, BACKGROUND_WAIT).await {
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
        .map(|(index, file)| super::published::signed_file(model, index, file))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::digests::FileDigests;
    use crate::service::fixture::{Scanned, one_tensor_safetensors, scanned};
    use crate::service::hashing::DigestWaits;

    const LONG: Duration = Duration::from_secs(60);

    fn admission_over(scanned: &Scanned, policy: SigningPolicy) -> Arc<SignatureAdmission> {
        let signing = crate::config::Signing { policy, ..Default::default() };
        let waits = DigestWaits { file: LONG, listing: LONG, request_timeout: None };
        let digests = crate::config::Digests::default();
        let publication = Arc::clone(&scanned.publication);
        let hashing =
            Arc::new(Hashing::new(&digests, FileDigests::open(None).unwrap(), publication, signing.clone(), waits));
        let parts = AdmissionParts {
            learnt: Arc::clone(&scanned.learnt),
            publication: Arc::clone(&scanned.publication),
            hashing,
            catalogs: Arc::clone(&scanned.catalogs),
        };
        Arc::new(SignatureAdmission::new(signing, parts).unwrap())
    }

    fn one_model(dir: &Path) {
        std::fs::create_dir_all(dir.join("org/m")).unwrap();
        std::fs::write(dir.join("org/m/model.safetensors"), one_tensor_safetensors(&[1.0])).unwrap();
    }

    fn the_model(scanned: &Scanned) -> (Arc<Model>, Arc<Manifest>) {
        let model = Arc::clone(scanned.catalog.models().next().expect("a model listed"));
        let manifest = model.state.as_ref().expect("the model reads").clone();
        (model, manifest)
    }

    #[tokio::test]
    async fn a_source_whose_policy_is_none_is_not_checked() {
        let dir = tempfile::tempdir().unwrap();
        one_model(dir.path());
        let scanned = scanned(dir.path(), None).await;
        let admission = admission_over(&scanned, SigningPolicy::None);
        let (model, manifest) = the_model(&scanned);
        assert!(matches!(admission.status(&scanned.catalog, &model), SignatureStatus::NotChecked));
        let admitted = admission.admit(&scanned.catalog, &model, &manifest, LONG).await.unwrap();
        assert!(matches!(admitted, SignatureStatus::NotChecked));
        assert!(admission.trust.is_none(), "no trust is loaded when no source reads signatures");
    }

    #[tokio::test]
    async fn an_unsigned_model_is_refused_when_required_and_served_if_signed() {
        let dir = tempfile::tempdir().unwrap();
        one_model(dir.path());
        let signature_file = crate::config::Signing::default().signature_file;
        let scanned = scanned(dir.path(), Some(&signature_file)).await;
        let (model, manifest) = the_model(&scanned);

        let required = admission_over(&scanned, SigningPolicy::Required);
        assert!(required.status(&scanned.catalog, &model).is_pending(), "no verdict before anyone asks");
        let refused = required.admit(&scanned.catalog, &model, &manifest, LONG).await.unwrap_err();
        assert!(matches!(refused, ServiceError::Unsigned { .. }), "{refused:?}");
        assert_eq!(required.status(&scanned.catalog, &model).state(), "unsigned", "the verdict is kept");
        assert!(required.refusal(&scanned.catalog, &model).is_some());

        let if_signed = admission_over(&scanned, SigningPolicy::IfSigned);
        let admitted = if_signed.admit(&scanned.catalog, &model, &manifest, LONG).await.unwrap();
        assert_eq!(admitted.state(), "unsigned");
        assert!(if_signed.refusal(&scanned.catalog, &model).is_none());
    }

    #[tokio::test]
    async fn a_signature_that_is_no_bundle_fails_the_model_under_either_policy() {
        let dir = tempfile::tempdir().unwrap();
        one_model(dir.path());
        let signature_file = crate::config::Signing::default().signature_file;
        std::fs::write(dir.path().join("org/m").join(&signature_file), b"not a sigstore bundle").unwrap();
        let scanned = scanned(dir.path(), Some(&signature_file)).await;
        let (model, manifest) = the_model(&scanned);
        for policy in [SigningPolicy::IfSigned, SigningPolicy::Required] {
            let admission = admission_over(&scanned, policy);
            let refused = admission.admit(&scanned.catalog, &model, &manifest, LONG).await.unwrap_err();
            assert!(matches!(refused, ServiceError::SignatureFailed { .. }), "{policy:?}: {refused:?}");
            assert_eq!(admission.status(&scanned.catalog, &model).state(), "failed");
        }
    }
}
