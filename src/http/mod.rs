//! The HTTP layer. So far the pure range and conditional-request logic the routes will use.

pub mod range;
