#![no_main]
//! Fuzz target `glob_pattern`: see `regbroker_fuzz::checks::glob_pattern` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::checks::glob_pattern(data));
