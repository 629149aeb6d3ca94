//! Where bytes come from. For now, local files mapped into memory; the async `Storage` trait
//! over local directories and S3 builds on this.

pub mod local;
