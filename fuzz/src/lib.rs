//! Fuzz targets for regbroker's hostile-input surfaces; the properties live in
//! [`checks`] and [`provider_checks`], shared with the main crate's `tests/fuzz_regressions.rs`.

#![forbid(unsafe_code)]

pub mod checks;
pub mod provider_checks;
