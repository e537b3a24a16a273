//! The `regbroker` binary: a thin shell around [`regbroker::cli`].

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    regbroker::cli::main()
}
