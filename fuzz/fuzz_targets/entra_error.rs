#![no_main]
//! Fuzz target `entra_error`: see `regbroker_fuzz::provider_checks::entra_error` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::provider_checks::entra_error(data));
