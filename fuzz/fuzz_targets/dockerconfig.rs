#![no_main]
//! Fuzz target `dockerconfig`: see `regbroker_fuzz::checks::dockerconfig` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::checks::dockerconfig(data));
