//! What every wire protocol's listener shares, below the protocols: the connection loop and
//! its limits ([`connections`]: count, head size, header and idle timeouts, graceful drain),
//! connections that send slices of mapped files with `sendfile` instead of copying them
//! ([`zero_copy`]), the layers every request passes ([`layers`]: metrics, tracing, panic
//! catching, timeout, concurrency limit), the one dispatcher of protocols that route below
//! their prefix by a grammar of their own ([`prefixed`]), byte responses with ranges and conditionals
//! ([`respond`] over the pure [`range`]) for the protocols that answer plain GETs for bytes,
//! what every protocol's error response has in common ([`error_parts`]), and TLS with its
//! reloading certificate and client identities ([`tls`]).
//! Nothing here knows HTTP routes, S3 or any other protocol's meaning of a request.

mod connections;
pub(crate) mod error_parts;
mod layers;
pub(crate) mod prefixed;
pub(crate) mod range;
pub(crate) mod respond;
pub(crate) mod tls;
mod zero_copy;

pub(crate) use connections::{ConnectionSettings, serve};
pub(crate) use layers::{Refusals, RouteLabels, with_common_layers};
pub(crate) use tls::{ClientIdentity, Tls, TlsSettings, client_names};
