#![no_main]
//! Fuzz target `acr_exchange`: see `regbroker_fuzz::provider_checks::acr_exchange` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::provider_checks::acr_exchange(data));
