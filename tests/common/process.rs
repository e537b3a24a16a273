//! Child processes the tests wait for, always with a bound.
//!
//! A command a test expects to exit may run on instead: a weakened check lets
//! `regbroker serve` start where it should refuse, or a peer waits for input that never
//! comes. An unbounded `Command::output()` then hangs the whole suite until the CI
//! harness gives up; these helpers kill the child at the bound and fail the test, naming
//! the command and the bound and quoting what it wrote so far.
//!
//! Uses only `std`, so the peer fixtures (`tests/registry_peer`, `tests/control_plane`,
//! `tests/flux_support`) can use it too.

use std::io::{Read, Write as _};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bound for one call of the `regbroker` binary or a small tool (htpasswd, kubectl,
/// `helm template`): seconds of work at most, with room for a busy 2-core CI machine.
pub const CLI_BOUND: Duration = Duration::from_secs(60);

/// The bound for a real client moving data through a real peer (skopeo or oras pushing
/// and pulling an image through a registry).
pub const PEER_CLIENT_BOUND: Duration = Duration::from_secs(300);

/// Runs `cmd` with stdout and stderr captured and `stdin` written to it (nothing: stdin
/// is `/dev/null`), as [`Command::output`] does, but waits at most `bound`: past it the
/// child is killed and the test fails naming the command and the bound.
pub fn run_bounded(cmd: &mut Command, stdin: Option<&[u8]>, bound: Duration) -> Output {
    let what = describe(cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let input = input.to_vec();
        // From a thread: a child that does not read all of its input before writing
        // much output would otherwise deadlock with us. A child that exits without
        // reading it closes the pipe: its exit status tells, not the write.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    wait_output_bounded(child, &what, bound)
}

/// Collects the output of an already started `child` (the pipes it has: stdout or stderr
/// not piped are empty in the result) and waits at most `bound` for it to exit; past the
/// bound the child is killed and the test fails naming `what` and the bound. Closes the
/// child's stdin first, as [`Child::wait_with_output`] does.
pub fn wait_output_bounded(mut child: Child, what: &str, bound: Duration) -> Output {
    drop(child.stdin.take());
    let stdout = Drain::start(child.stdout.take());
    let stderr = Drain::start(child.stderr.take());
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait on a child") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            // What it wrote until now; a process it started may hold the pipes open.
            let grace = Instant::now() + Duration::from_secs(1);
            stdout.finish(grace);
            stderr.finish(grace);
            panic!(
                "`{what}` did not exit within {bound:?}: killed it\n--- stdout\n{}\n--- stderr\n{}",
                stdout.text(),
                stderr.text()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Its output ends with it, unless a process it started keeps the pipes open.
    let grace = Instant::now() + Duration::from_secs(10);
    assert!(
        stdout.finish(grace) && stderr.finish(grace),
        "`{what}` exited ({status}) but something it started still holds its output open \
         10 s later\n--- stdout\n{}\n--- stderr\n{}",
        stdout.text(),
        stderr.text()
    );
    Output {
        status,
        stdout: stdout.take(),
        stderr: stderr.take(),
    }
}

/// `program arg...`, as a panic message names a command.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A long-running child (a `regbroker serve` under test) that is killed and reaped when
/// dropped: a test that fails before stopping it leaves no process behind holding the
/// suite's output open.
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Kill, then wait: bounded, the process is gone after SIGKILL.
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One output pipe, read to its end on a thread of its own (two pipes read in turn can
/// deadlock with a child filling the other), kept readable while it is being read.
struct Drain {
    bytes: Arc<Mutex<Vec<u8>>>,
    /// Disconnects when the reader reaches the end of the pipe (or there is none).
    done: mpsc::Receiver<()>,
}

impl Drain {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Drain {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let (at_end, done) = mpsc::channel::<()>();
        if let Some(mut pipe) = pipe {
            let sink = bytes.clone();
            std::thread::spawn(move || {
                let _at_end = at_end;
                let mut buf = [0u8; 8192];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => sink.lock().unwrap().extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            });
        }
        Drain { bytes, done }
    }

    /// Waits until the pipe's end, at most until `deadline`; whether it ended.
    fn finish(&self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        matches!(
            self.done.recv_timeout(left),
            Err(RecvTimeoutError::Disconnected)
        )
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.bytes.lock().unwrap())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }
}
