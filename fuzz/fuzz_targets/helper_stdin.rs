#![no_main]
//! Fuzz target `helper_stdin`: see `regbroker_fuzz::checks::helper_stdin` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::checks::helper_stdin(data));
