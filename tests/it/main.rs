//! The integration tests, one module per subject, in one test binary: each used to be a binary
//! of its own, and each linked the whole crate. nextest still runs every test in its own process,
//! so process-wide state (the metrics recorder, environment, signals) stays per test.

mod common;

mod access;
mod artifacts;
mod cli;
mod crashes;
mod decoding;
mod deltas;
mod deltas_ahead;
mod digests_ahead;
mod directories;
mod disk_cache;
mod docs;
mod drain;
mod fan_out;
mod faults;
mod format_rules;
mod gguf;
mod hf_hub;
mod hostile_gguf;
mod hostile_requests;
mod hostile_safetensors;
mod hostile_v2;
mod http_contract;
mod hub_source;
mod interop;
mod interop_safetensors;
mod interop_v2;
mod layers;
mod limits;
mod lineages;
mod load;
mod oci_registry;
mod openapi_conformance;
mod operations;
mod origin_faults;
mod proxy_cache;
mod pull;
mod regions;
mod s3;
mod s3_endpoint;
mod safetensors_view;
mod shards;
mod signing;
mod slices;
mod storage_conformance;
mod tls;
mod tls_clients;
mod zero_copy;
