#![no_main]
//! Fuzz target `registry_parse`: see `regbroker_fuzz::checks::registry_parse` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::checks::registry_parse(data));
