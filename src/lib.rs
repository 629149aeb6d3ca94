//! ztserve: serve tensors stored in zTensor (`.zt`) files, safetensors checkpoints and GGUF files.
//!
//! Module map. Layers run one way, server -> {http, s3, hf, oci} -> {transport, access} -> service ->
//! {catalog, decode, digests, signing} -> storage -> format, with `api`, `config` and `telemetry` beside
//! them; no module imports one above it, and the wire protocols never name each other
//! (`tests/it/layers.rs` keeps it so).
//! - [`api`]: what server and clients share: route templates, which paths are model routes,
//!   URL builders (ids written naturally where unambiguous, other names percent-encoded
//!   segments), `X-Zt-*` header names.
//! - [`config`]: one typed configuration in sections: defaults < file <
//!   `ZTSERVE_<SECTION>__<KEY>` env < flags, validated, the flat names of earlier releases as
//!   deprecated aliases.
//! - [`format`]: the `ztserve-format` crate (`format/`), pure byte layout: parse, validate,
//!   decode, verify and write every `.zt` generation, read safetensors headers and checkpoint
//!   indexes, and GGUF headers and split models (`format::gguf`), into the same manifest, plan a manifest's safetensors view (`format::view`) and
//!   slices of dense tensors as byte runs (`format::slice`), read OpenSSF model signature
//!   files and their statements (`format::model_signature`), and render manifests as JSON.
//! - [`storage`]: where bytes come from: one `Storage` trait for local directories (reads are
//!   regions of mapped files), S3 prefixes (`object_store`) and Hub repositories (the Hub's
//!   read API at `HF_ENDPOINT`, a file's version its content id), reads bound to one version,
//!   long reads split into parallel ranged GETs under a shared read-ahead budget; the node's
//!   disk cache for remote sources (`storage::cache`: blocks kept, checked and evicted, the
//!   last listing kept); the only `unsafe`, in `storage::mapped` (the crate denies it
//!   everywhere else).
//! - `catalog`: what the files say: the sources and their health, which models exist under
//!   them (a `.zt` file with any v2 shards, a safetensors file, a checkpoint's index and
//!   shards, a GGUF file or a split GGUF model's parts) and the files beside each (config, tokenizer), their parsed manifests (cached by
//!   file identity or ETag), and broken files.
//! - `decode`: shared, cached decoding of components not stored verbatim, one concern per
//!   file (stored-byte sources read with `pread` or streamed from S3, never loaded from a
//!   mapping, so a file truncated in place cannot raise SIGBUS; the decode cursor; the shared
//!   decode; private decodes; the cache bounded in bytes).
//! - `digests`: content digests as a component: where the SHA-256 of each published file and
//!   image layer is kept (memory and the digest store; a `SHA256SUMS`'s until checked), the
//!   queue of those to compute (urgency, one job per file shared by its askers, retries, what a
//!   rescan drops, progress) and how long they take; it knows nothing of models or requests.
//! - `signing`: OpenSSF model signatures (`model_signing`'s `model.sig`), checked against what
//!   is trusted: public keys (ECDSA, Ed25519) and signing certificates chained to configured CAs
//!   (aws-lc-rs, rustls-webpki); the bundle and its statement are read by
//!   `format::model_signature`. It knows nothing of models or requests.
//! - `service`: the domain between the catalog and the wire protocols, a facade over one type
//!   per concern (`Catalogs`, `Representations`, `ResolvedSlice`, `Views`, `Prefetches`):
//!   sources, the catalog swap and rescans, model lookup, a model's bytes and versions, what is learnt per model
//!   version (digest verdicts, seek tables, view plans, the rendered manifest), the files each
//!   version publishes and which of their SHA-256 to compute (ahead of need in the background
//!   or when asked, through `digests`; taken from a `SHA256SUMS` and checked on a whole read),
//!   the digest policy, content checks, decoder admission, the typed representations requests get
//!   (a component cut whole, by ranges or as a slice), each model's
//!   safetensors view as bytes (its header, then each tensor as its own route serves it),
//!   slices of dense objects for tensor-parallel ranks, cut where the bytes are, and
//!   prefetches into the disk cache, and each model version's signature verdict under its
//!   source's policy, which every protocol asks before it serves a byte.
//! - `access`: who may read what, for every protocol: tokens (config and a watched token
//!   file), kept as digests and compared in constant time, each allowed every model or some id
//!   prefixes; as S3 signing keys while the S3 endpoint is on; and client certificate
//!   identities granted models as tokens are.
//! - `transport`: what every listener shares below the protocols: the connection loop and its
//!   limits (count, head size, header timeout, an idle timeout that counts only waits on the
//!   client, drain), connections that send slices
//!   of mapped files with `sendfile` instead of copying them, and the layers every request
//!   passes (metrics, tracing, panic catching, timeout, concurrency), byte responses with
//!   ranges and conditionals for the protocols that answer plain GETs, and TLS (rustls, the
//!   certificate reloaded as its files change, client certificates' identities).
//! - `http`: the HTTP contract (axum) over the service: routes, conditional requests, content negotiation, streaming bodies, errors (the only place HTTP statuses are
//!   chosen); bearer tokens checked per request; one extractor gives handlers a ready,
//!   authorised model; the manifest rendered as JSON with its URLs, which the service keeps.
//! - `s3`: the S3-compatible read endpoint (on its own listener, built on `s3s`): the loaders'
//!   bucket, whose keys are what the Hub API lists of each model (companions and safetensors
//!   files), and the stored files' bucket, each model as its source holds it, served from the
//!   same service; tokens as SigV4 keys; S3 error codes chosen here only, from the service's
//!   error kinds.
//! - `hf`: the Hugging Face Hub's read API at `/hf` (`HF_ENDPOINT`): each model a repository
//!   of its companions and safetensors files (a directory's GGUF models one repository of
//!   their GGUF files), revisions as model versions, every file an LFS
//!   file whose oid is its SHA-256; the tokens as bearer tokens; Hub error codes chosen here
//!   only.
//! - `oci`: the OCI distribution API's read side at `/v2`: each model a repository (ids mapped
//!   to lowercase repository names without collisions) whose manifest is a ModelPack artifact,
//!   a raw layer per published file, digests from the content-digest store; tags `latest` and
//!   the version; the token flow over the existing tokens; registry error codes chosen here
//!   only.
//! - [`server`]: the composition root: builds the service, the tokens and every protocol's
//!   router, binds their listeners, runs rescans, the token watch and metrics upkeep, and
//!   drains every listener on SIGTERM or SIGINT.
//! - [`telemetry`]: the tracing subscriber (text or JSON logs) and the Prometheus recorder.
//! - [`tools`]: the file tools over local files: `inspect`, `verify`, `cat`, `convert`,
//!   `digest` (a directory's `SHA256SUMS`), `write-demo`, one module each.
//! - [`pull`]: `ztserve pull`, the client side: a served model copied to a local file by
//!   parallel ranged GETs bound to one ETag, journaled for resume, digest-checked, renamed into
//!   place only when complete (rebuilt through `format::write::plan`, or `--raw`).

#![deny(unsafe_code)]

// `pub` only what main, the tests, the examples and the benchmarks use.
mod access;
pub mod api;
mod catalog;
pub mod config;
mod decode;
mod digests;
mod hf;
mod http;
mod oci;
pub mod pull;
mod s3;
pub mod server;
mod service;
mod signing;
pub mod storage;
pub mod telemetry;
pub mod tools;
mod transport;

/// The byte layout, a crate of its own (`format/`) so the compiler keeps it pure.
pub use ztserve_format as format;
