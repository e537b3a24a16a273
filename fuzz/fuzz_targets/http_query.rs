#![no_main]
//! Fuzz target `http_query`: see `regbroker_fuzz::checks::http_query` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::checks::http_query(data));
