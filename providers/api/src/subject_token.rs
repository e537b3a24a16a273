//! Subject tokens read from a file: the projected ServiceAccount token a pod mounts (or an
//! OIDC token a CI system writes), which an exchange sends as the caller's proof of
//! identity. Shared by every provider that reads one, and by `doctor`.
//!
//! Bounded (a token is about 1 KiB; nothing past [`MAX_TOKEN_FILE`] bytes is read), wiped
//! on drop, and never quoted: an error names the file and the reason, never its content.

use std::io::Read as _;
use std::path::Path;

use secrecy::SecretString;
use secrecy::zeroize::Zeroizing;

use crate::Error;

/// Most bytes read of a token file.
pub const MAX_TOKEN_FILE: u64 = 64 * 1024;

/// The bytes of token file `path`, at most [`MAX_TOKEN_FILE`] of them (a longer file is
/// an error, not a truncated token). A missing or unreadable file is `IdentityMissing`,
/// naming the file and the reason.
///
/// Blocking, but cheap: a projected token is a small file on a tmpfs.
pub fn read_bytes(path: &Path) -> Result<Zeroizing<Vec<u8>>, Error> {
    let shown = path.display();
    let mut out = Zeroizing::new(Vec::new());
    let read =
        std::fs::File::open(path).and_then(|f| f.take(MAX_TOKEN_FILE + 1).read_to_end(&mut out));
    match read {
        Ok(_) if out.len() as u64 > MAX_TOKEN_FILE => Err(Error::invalid_config(format!(
            "token file {shown} is larger than {MAX_TOKEN_FILE} bytes: not a token"
        ))),
        Ok(_) => Ok(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Error::identity_missing(format!(
                "token file {shown} does not exist (is the projected ServiceAccount token mounted?)"
            )))
        }
        Err(e) => Err(Error::identity_missing(format!(
            "token file {shown} cannot be read: {}",
            io_reason(&e)
        ))),
    }
}

/// The token in file `path` as text: UTF-8, surrounding whitespace trimmed (a trailing
/// newline is common), then non-empty printable ASCII, as every JWT is.
pub fn read_text(path: &Path) -> Result<SecretString, Error> {
    let raw = read_bytes(path)?;
    let shown = path.display();
    let text = std::str::from_utf8(&raw)
        .map_err(|_| Error::invalid_config(format!("token file {shown} is not UTF-8 text")))?
        .trim();
    if text.is_empty() {
        return Err(Error::identity_missing(format!(
            "token file {shown} is empty"
        )));
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid_config(format!(
            "token file {shown} does not hold a token (not printable ASCII)"
        )));
    }
    Ok(SecretString::from(text.to_string()))
}

/// An I/O error's reason, without repeating any file content.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        std::io::ErrorKind::IsADirectory => "it is a directory".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use secrecy::ExposeSecret as _;

    use super::*;
    use crate::ErrorKind;

    #[test]
    fn a_token_is_read_trimmed_and_errors_name_the_file_never_the_content() {
        let dir = std::env::temp_dir().join(format!("regbroker-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "eyJ.payload.sig\n").unwrap();
        assert_eq!(read_text(&file).unwrap().expose_secret(), "eyJ.payload.sig");

        std::fs::write(&file, "  \n").unwrap();
        let e = read_text(&file).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IdentityMissing);
        assert!(e.message().contains("empty"), "{e}");

        std::fs::write(&file, "secret-part with space").unwrap();
        let e = read_text(&file).unwrap_err();
        assert!(e.message().contains("not printable ASCII"), "{e}");
        assert!(!e.message().contains("secret-part"), "{e}");

        // Exactly the cap is read; one byte more is refused, not truncated.
        std::fs::write(&file, "a".repeat(MAX_TOKEN_FILE as usize)).unwrap();
        assert_eq!(read_bytes(&file).unwrap().len() as u64, MAX_TOKEN_FILE);
        std::fs::write(&file, "a".repeat(MAX_TOKEN_FILE as usize + 1)).unwrap();
        let e = read_bytes(&file).unwrap_err();
        assert!(e.message().contains("larger than 65536 bytes"), "{e}");

        let missing = dir.join("missing");
        let e = read_text(&missing).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IdentityMissing);
        assert!(e.message().contains("does not exist"), "{e}");
        assert!(e.message().contains(&*missing.to_string_lossy()), "{e}");
        let e = read_text(&dir).unwrap_err();
        assert!(e.message().contains("cannot be read"), "{e}");
        assert!(e.message().contains("it is a directory"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn io_reasons_are_short_and_say_what_is_wrong() {
        use std::io::{Error, ErrorKind as Io};
        // The OS errors as a read returns them (EACCES, EISDIR), whose own text names the
        // error number. Root reads any file, so a denied read is made here, not on disk.
        let denied = Error::from_raw_os_error(13);
        assert_eq!(denied.kind(), Io::PermissionDenied);
        assert_eq!(io_reason(&denied), "permission denied");
        let directory = Error::from_raw_os_error(21);
        assert_eq!(directory.kind(), Io::IsADirectory);
        assert_eq!(io_reason(&directory), "it is a directory");
        assert_eq!(io_reason(&Error::other("disk on fire")), "disk on fire");
    }
}
