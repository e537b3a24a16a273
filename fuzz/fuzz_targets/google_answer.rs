#![no_main]
//! Fuzz target `google_answer`: see `regbroker_fuzz::provider_checks::google_answer` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::provider_checks::google_answer(data));
