#![no_main]
//! Fuzz target `kubelet_request`: see `regbroker_fuzz::checks::kubelet_request` for the properties checked.

libfuzzer_sys::fuzz_target!(|data: &[u8]| regbroker_fuzz::checks::kubelet_request(data));
