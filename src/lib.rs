//! ztserve: serve tensors stored in zTensor (`.zt`) files, safetensors checkpoints and GGUF files.
//!
//! Module map. Layers run one way, server -> {http, s3, hf, oci} -> {transport, access} ->
//! {service, artifacts} -> {catalog, decode, digests, signing, served} -> storage -> format,
//! with `api`, `config` and `telemetry` beside them; no module imports one above it, and the
//! wire protocols never name each other (`tests/it/layers.rs` keeps it so). `docs/architecture.md` says more.
//! - [`api`]: what server and clients share: route templates, URL builders, header names.
//! - [`config`]: the typed configuration: defaults < file < `ZTSERVE_<SECTION>__<KEY>` < flags.
//! - [`format`]: the `ztserve-format` crate, pure byte layout: every `.zt` generation,
//!   safetensors, GGUF, the safetensors view, slices, model signatures, into one manifest.
//! - [`storage`]: where bytes come from (local files mapped, S3, Hub repositories), reads bound
//!   to one version, and the node's disk cache; the only `unsafe` is in `storage::mapped`.
//! - `catalog`: which models the listed files make, their manifests, companions and broken
//!   files, and which models one repository publishes together.
//! - `decode`: shared, cached decoding of components not stored verbatim.
//! - `artifacts`: the one writable store: blobs by digest, bundles published once and whole,
//!   their signatures made and checked.
//! - `digests`: where each published file's SHA-256 is kept and the queue that computes them.
//! - `signing`: OpenSSF model signatures checked against trusted keys and CAs, and made with a key.
//! - `served`: what the service makes and transport sends, below both: a representation's
//!   bytes (`ByteSource`), the guard its last piece waits for, a failure as clients are told it.
//! - `service`: the domain between the catalog and the protocols: the catalog swap, a model's
//!   bytes, representations, views, slices, digests policy and signature verdicts.
//! - `access`: who may read what: tokens, S3 signing keys, client certificate identities.
//! - `transport`: what every listener shares: the connection loop and its limits, `sendfile`,
//!   the request layers, byte responses with ranges, TLS.
//! - `http`: the HTTP contract (axum): routes, negotiation, errors (the only place its statuses
//!   are chosen).
//! - `s3`: the S3-compatible read endpoint (`s3s`): the loaders' bucket, what the Hub API
//!   lists, and the stored files' bucket.
//! - `hf`: the Hugging Face Hub's read API at `/hf`: repositories, revisions, LFS files.
//! - `oci`: the OCI distribution API's read side at `/v2`: ModelPack artifacts and layers.
//! - [`server`]: the composition root: builds everything, binds listeners, runs rescans, drains.
//! - [`telemetry`]: the tracing subscriber and the Prometheus recorder.
//! - [`tools`]: the file tools: `inspect`, `verify`, `cat`, `convert`, `digest`, `write-demo`;
//!   and `artifacts`, a directory published to and restored from a server's artifact store.
//! - [`pull`]: `ztserve pull`: a served model copied to a local file, resumable, checked.

#![deny(unsafe_code)]

// `pub` only what main, the tests, the examples and the benchmarks use.
mod access;
pub mod api;
mod artifacts;
mod catalog;
pub mod config;
mod decode;
mod digests;
mod hf;
mod http;
mod oci;
pub mod pull;
mod s3;
mod served;
pub mod server;
mod service;
mod signing;
pub mod storage;
pub mod telemetry;
pub mod tools;
mod transport;

/// The byte layout, a crate of its own (`format/`) so the compiler keeps it pure.
pub use ztserve_format as format;
