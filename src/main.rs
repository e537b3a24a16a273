//! The `regbroker` binary: a thin shell around [`regbroker::cli`].

#![forbid(unsafe_code)]

/// The static musl sidecar (the image) allocates with mimalloc: musl's malloc takes one
/// global lock per call, which halved the sidecar's throughput under load. The one-shot
/// helper link (`--cfg regbroker_helper_link`, scripts/build-release.sh) keeps musl's:
/// it allocates little, and mimalloc's set-up would be 200,000 of its 450,000
/// start-up instructions.
#[cfg(all(target_env = "musl", not(regbroker_helper_link)))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    regbroker::cli::main()
}
