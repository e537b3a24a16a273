#![no_main]
//! Fuzz target `ecr_authorization_data`: see `regbroker_fuzz::provider_checks::ecr_authorization_data` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::provider_checks::ecr_authorization_data(data));
