#![no_main]
//! Fuzz target `acr_refresh_token`: see `regbroker_fuzz::provider_checks::acr_refresh_token` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::provider_checks::acr_refresh_token(data));
