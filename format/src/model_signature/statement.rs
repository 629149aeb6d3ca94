//! The signed in-toto statement, as `model_signing` 1.x writes it (predicate
//! `https://model_signing/signature/v1.0`): one subject, the model, whose SHA-256 is over the
//! resources' digests in their order; a serialization (`files`, SHA-256, the paths left out);
//! and one resource per file, by its path below the model's directory. The 0.2 predicate
//! (`Digests/v0.1`, a subject per file) is read as its verifiers still read it. A directory's
//! files are matched against it as `model_signing verify` hashes that directory: every file
//! below it but those left out (the statement's, git's, the signature file), none unsigned.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use sha2::Digest as _;

use super::SignatureError;

const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
const PREDICATE_TYPE: &str = "https://model_signing/signature/v1.0";
const PREDICATE_TYPE_COMPAT: &str = "https://model_signing/Digests/v0.1";
/// What `model_signing verify` always leaves out (`--ignore-git-paths`, its default).
const GIT_PATHS: [&str; 4] = [".git", ".gitattributes", ".github", ".gitignore"];
/// The longest path a resource may name.
const MAX_NAME: usize = 4096;

#[derive(Deserialize)]
struct Header {
    #[serde(rename = "_type")]
    statement_type: String,
    #[serde(rename = "predicateType")]
    predicate_type: String,
}

#[derive(Deserialize)]
struct StatementJson {
    subject: Vec<SubjectJson>,
    predicate: PredicateJson,
}

#[derive(Deserialize)]
struct CompatJson {
    subject: Vec<SubjectJson>,
}

#[derive(Deserialize)]
struct SubjectJson {
    name: String,
    digest: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct PredicateJson {
    serialization: SerializationJson,
    resources: Vec<ResourceJson>,
}

#[derive(Deserialize)]
struct SerializationJson {
    method: String,
    hash_type: String,
    #[serde(rename = "allow_symlinks")]
    _allow_symlinks: Option<IgnoredAny>,
    #[serde(default)]
    ignore_paths: Vec<String>,
}

#[derive(Deserialize)]
struct ResourceJson {
    name: String,
    algorithm: String,
    digest: String,
}

/// A verified statement: who signed which files with which digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedModel {
    /// The signer, as shown (`key publisher.pub`, `certificate "CN=…" (email:…)`).
    pub signer: String,
    /// The model's name when signed (its directory's).
    pub name: String,
    /// Each signed file's SHA-256, by path below the model's directory.
    files: BTreeMap<String, [u8; 32]>,
    /// Paths left out when it was signed, below the model's directory.
    ignored: Vec<String>,
}

fn statement(detail: impl Into<String>) -> SignatureError {
    SignatureError::Statement(detail.into())
}

fn sha256_hex(field: &str, text: &str) -> Result<[u8; 32], SignatureError> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(text, &mut digest)
        .map_err(|_| statement(format!("{field} {text:?} is not a SHA-256 in hex")))?;
    Ok(digest)
}

/// Whether `name` is a path `model_signing` could have written for a file below a directory.
fn is_relative_path(name: &str) -> bool {
    name.len() <= MAX_NAME
        && !name.starts_with('/')
        && !name.contains('\0')
        && name.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

impl SignedModel {
    /// Reads the statement `payload` that `signer` signed.
    pub fn from_payload(payload: &[u8], signer: String) -> Result<SignedModel, SignatureError> {
        let header: Header = serde_json::from_slice(payload).map_err(|e| statement(e.to_string()))?;
        if header.statement_type != STATEMENT_TYPE {
            return Err(statement(format!("_type {:?}, not {STATEMENT_TYPE:?}", header.statement_type)));
        }
        let mut ignored: Vec<String> = GIT_PATHS.iter().map(|p| p.to_string()).collect();
        let mut files = BTreeMap::new();
        let mut add = |name: String, digest: [u8; 32]| {
            if !is_relative_path(&name) {
                return Err(statement(format!("resource {name:?} is not a path below the model's directory")));
            }
            match files.insert(name.clone(), digest) {
                Some(_) => Err(statement(format!("resource {name:?} is listed twice"))),
                None => Ok(()),
            }
        };
        let name = match header.predicate_type.as_str() {
            PREDICATE_TYPE => {
                let json: StatementJson = serde_json::from_slice(payload).map_err(|e| statement(e.to_string()))?;
                let [subject] = &json.subject[..] else {
                    return Err(statement(format!("{} subjects, where the model is the one", json.subject.len())));
                };
                let serialization = &json.predicate.serialization;
                match serialization.method.as_str() {
                    "files" => {}
                    "shards" => {
                        return Err(SignatureError::Unsupported(
                            "serialized by shards: ztserve matches each file's whole SHA-256, so sign by files \
                             (model_signing's default)"
                                .into(),
                        ));
                    }
                    other => return Err(statement(format!("serialization method {other:?}"))),
                }
                if serialization.hash_type != "sha256" {
                    return Err(SignatureError::Unsupported(format!(
                        "files hashed with {:?}: ztserve knows each file's SHA-256, so sign with sha256 \
                         (model_signing's default)",
                        serialization.hash_type
                    )));
                }
                let mut root = sha2::Sha256::new();
                for resource in json.predicate.resources {
                    if resource.algorithm != serialization.hash_type {
                        return Err(statement(format!(
                            "resource {:?} is hashed with {:?}, not the serialization's {:?}",
                            resource.name, resource.algorithm, serialization.hash_type
                        )));
                    }
                    let digest = sha256_hex(&format!("the digest of {:?}", resource.name), &resource.digest)?;
                    root.update(digest);
                    add(resource.name, digest)?;
                }
                let said = subject.digest.get("sha256").ok_or_else(|| statement("the subject has no sha256"))?;
                let said = sha256_hex("the subject's sha256", said)?;
                if said != <[u8; 32]>::from(root.finalize()) {
                    return Err(statement("the subject's sha256 is not that of the resources' digests"));
                }
                ignored.extend(serialization.ignore_paths.iter().filter_map(|p| relative_ignore(p)));
                subject.name.clone()
            }
            PREDICATE_TYPE_COMPAT => {
                let json: CompatJson = serde_json::from_slice(payload).map_err(|e| statement(e.to_string()))?;
                for subject in json.subject {
                    let said = subject.digest.get("sha256").ok_or_else(|| statement("a subject has no sha256"))?;
                    let digest = sha256_hex(&format!("the sha256 of {:?}", subject.name), said)?;
                    add(subject.name, digest)?;
                }
                String::new()
            }
            other => return Err(statement(format!("predicate type {other:?}, not {PREDICATE_TYPE:?}"))),
        };
        Ok(SignedModel { signer, name, files, ignored })
    }

    /// How many files it signs.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Whether `path` (below the model's directory) is left out, as `model_signing` leaves out
    /// a path below an ignored one; `signature_file` is the signature's own name.
    pub fn ignores(&self, path: &str, signature_file: &str) -> bool {
        let below =
            |ignored: &str| path.strip_prefix(ignored).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        below(signature_file) || self.ignored.iter().any(|ignored| below(ignored))
    }

    /// Checks that it was signed as `name` (an artifact bundle's whole name, which its
    /// signature binds; a model's directory name is not checked, as `model_signing` does not).
    pub fn match_name(&self, name: &str) -> Result<(), SignatureError> {
        if self.name == name {
            return Ok(());
        }
        Err(SignatureError::NameDiffers { signed: self.name.clone(), asked: name.to_owned() })
    }

    /// Matches the names of the directory's files (those not left out) against the signed
    /// ones: none may be unsigned, none missing.
    pub fn match_names<'a>(&self, present: impl IntoIterator<Item = &'a str>) -> Result<(), SignatureError> {
        let mut seen = std::collections::BTreeSet::new();
        let mut unsigned = Vec::new();
        for path in present {
            if self.files.contains_key(path) {
                seen.insert(path);
            } else {
                unsigned.push(path.to_owned());
            }
        }
        let missing: Vec<String> = self.files.keys().filter(|p| !seen.contains(p.as_str())).cloned().collect();
        if unsigned.is_empty() && missing.is_empty() {
            return Ok(());
        }
        unsigned.sort();
        Err(SignatureError::FilesDiffer { unsigned, missing })
    }

    /// Checks each file's SHA-256 against the signed one (after [`SignedModel::match_names`]).
    pub fn check_digest(&self, path: &str, actual: &[u8; 32]) -> Result<(), SignatureError> {
        match self.files.get(path) {
            Some(signed) if signed == actual => Ok(()),
            Some(signed) => Err(SignatureError::DigestMismatch {
                path: path.to_owned(),
                actual: hex::encode(actual),
                signed: hex::encode(signed),
            }),
            None => Err(SignatureError::FilesDiffer { unsigned: vec![path.to_owned()], missing: Vec::new() }),
        }
    }
}

/// The statement `model_signing` signs for the files of directory `name` (each by its path
/// below it and its SHA-256), serialized by files with SHA-256 and nothing left out. Resources
/// are in path order, and the subject's digest is over theirs in that order.
pub fn write_statement(name: &str, files: &[(String, [u8; 32])]) -> Vec<u8> {
    let mut sorted: Vec<&(String, [u8; 32])> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut root = sha2::Sha256::new();
    let resources: Vec<serde_json::Value> = sorted
        .iter()
        .map(|(path, digest)| {
            root.update(digest);
            serde_json::json!({ "name": path, "algorithm": "sha256", "digest": hex::encode(digest) })
        })
        .collect();
    let statement = serde_json::json!({
        "_type": STATEMENT_TYPE,
        "subject": [{ "name": name, "digest": { "sha256": hex::encode(root.finalize()) } }],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": { "method": "files", "hash_type": "sha256", "allow_symlinks": false, "ignore_paths": [] },
            "resources": resources,
        },
    });
    serde_json::to_vec(&statement).expect("a statement serializes")
}

/// An ignored path as the statement records it, below the model's directory (`./a/` is `a`),
/// or none for one outside it.
fn relative_ignore(path: &str) -> Option<String> {
    let trimmed = path.trim_start_matches("./").trim_end_matches('/');
    (!trimmed.is_empty() && !trimmed.starts_with('/') && !trimmed.split('/').any(|p| p == ".."))
        .then(|| trimmed.to_owned())
}
