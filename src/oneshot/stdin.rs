//! What every one-shot mode needs from its process: read stdin with a limit, and run
//! one future to completion on a runtime of its own.

use std::io::Read;

/// Reads all of stdin, at most `max` bytes; `what` names the input in errors.
pub fn read_limited(stdin: &mut dyn Read, max: u64, what: &str) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    stdin
        .take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read the {what} from stdin: {e}"))?;
    if buf.len() as u64 > max {
        return Err(format!("{what} on stdin is larger than {max} bytes"));
    }
    Ok(buf)
}

/// Runs a future on a small runtime of its own: the one-shot modes are synchronous
/// processes.
pub fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    Ok(rt.block_on(f))
}
