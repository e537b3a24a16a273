//! The test harness's bounded process helpers (`tests/common/process.rs`): a command
//! that runs on past its bound is killed and fails its test, naming the command and the
//! bound, instead of hanging the suite; a command that exits in time gives its output as
//! `Command::output` would, without a pipe deadlock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::process::run_bounded;

#[test]
fn a_command_that_runs_on_is_killed_at_the_bound_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let started = Instant::now();
    let failure = std::panic::catch_unwind(|| {
        run_bounded(
            Command::new("sh")
                .arg("-c")
                .arg(r#"echo $$ > "$1"; echo started; exec sleep 600"#)
                .arg("sh")
                .arg(&pid_file),
            None,
            Duration::from_secs(1),
        )
    })
    .expect_err("a command running past its bound fails the test");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let message = failure.downcast_ref::<String>().unwrap();
    assert!(message.contains("`sh -c "), "{message}");
    assert!(message.contains("did not exit within 1s"), "{message}");
    assert!(
        message.contains("started"),
        "what it wrote is quoted: {message}"
    );
    // Killed, not left running: `sleep` replaced the shell under the same pid.
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(
        !Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "process {pid} still runs"
    );
}

#[test]
fn large_input_and_output_do_not_deadlock() {
    let input = vec![b'x'; 1 << 20];
    let out = run_bounded(
        // Both pipes get more than a pipe buffer holds, stdout while stdin is written.
        Command::new("sh").args(["-c", "cat; head -c 1048576 /dev/zero >&2"]),
        Some(&input),
        Duration::from_secs(60),
    );
    assert!(out.status.success());
    assert_eq!(out.stdout, input);
    assert_eq!(out.stderr.len(), 1 << 20);
}
