//! Who may ask: the optional bearer token (checked in constant time) and the rule that
//! credentials are served on a non-loopback address only behind a token, or when the
//! operator says `--insecure-listen`. The token file is read here for the server and for
//! the one-shot modes that present it to a sidecar.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use regbroker_provider::{ExposeSecret, SecretString};

use super::error::AppError;
use super::listen::Listen;

/// Whether `headers` present `Authorization: Bearer <token>` with this token, compared
/// in constant time (the length is not hidden).
pub(super) fn presents(headers: &HeaderMap, token: &SecretString) -> bool {
    use subtle::ConstantTimeEq as _;
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|p| bool::from(p.ct_eq(token.expose_secret().as_bytes())))
}

/// The answer to a request without the token: 401 with `WWW-Authenticate: Bearer`.
pub(super) fn unauthorized() -> Response {
    let mut res = AppError {
        status: StatusCode::UNAUTHORIZED,
        code: "unauthorized",
        message: "this endpoint needs `Authorization: Bearer <token>` with the configured token"
            .into(),
    }
    .into_response();
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// Reads a bearer token file; the error never quotes the file's contents.
pub fn read_token_file(path: &std::path::Path) -> Result<regbroker_provider::SecretString, String> {
    let raw = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read the token file: {e}", path.display()))?,
    );
    let token = raw.trim_end_matches(['\n', '\r']);
    if token.len() < 16 {
        return Err(format!(
            "{}: the token must be at least 16 characters",
            path.display()
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{}: the token must not contain whitespace",
            path.display()
        ));
    }
    Ok(token.to_string().into())
}

/// Refuses to serve credentials on a non-loopback TCP address unless they are guarded
/// there by a bearer token *and* TLS (else the token and every credential cross the
/// network in cleartext), or `insecure` (`--insecure-listen`) says the network is trusted.
/// Loopback addresses and unix sockets (guarded by their file mode) pass; TLS applies to
/// TCP only.
pub fn check_exposure(
    listen: &Listen,
    has_token: bool,
    has_tls: bool,
    insecure: bool,
) -> Result<(), String> {
    match listen {
        Listen::Unix(_) if has_tls => Err(
            "--tls-cert-file applies to a TCP --listen address, not to a unix socket".to_string(),
        ),
        Listen::Tcp(addr) if !(addr.ip().is_loopback() || insecure || has_token && has_tls) => {
            let missing = match (has_token, has_tls) {
                (false, false) => {
                    "without --auth-token-file and TLS (--tls-cert-file, --tls-key-file)"
                }
                (true, false) => {
                    "without TLS (--tls-cert-file, --tls-key-file): the bearer token and every credential would cross the network in cleartext"
                }
                _ => {
                    "without --auth-token-file: every client that can reach it would get every credential"
                }
            };
            Err(format!(
                "refusing to serve credentials on non-loopback address {addr} {missing}; \
                 pass --insecure-listen if the network between it and every client is trusted"
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::Listen;
    use regbroker_provider::ExposeSecret;

    #[test]
    fn exposure_off_loopback_needs_a_token_and_tls_or_the_insecure_opt_in() {
        let pod_ip = Listen::Tcp("10.0.0.7:8477".parse().unwrap());
        let loopback = Listen::Tcp("127.0.0.1:8477".parse().unwrap());
        let socket = Listen::Unix("/run/regbroker/sock".into());
        // (has_token, has_tls, insecure) -> allowed on the pod IP
        for (token, tls, insecure, allowed, names) in [
            (
                false,
                false,
                false,
                false,
                "without --auth-token-file and TLS",
            ),
            (true, false, false, false, "without TLS"),
            (false, true, false, false, "without --auth-token-file:"),
            (true, true, false, true, ""),
            (false, false, true, true, ""),
        ] {
            let got = check_exposure(&pod_ip, token, tls, insecure);
            assert_eq!(got.is_ok(), allowed, "{token} {tls} {insecure}: {got:?}");
            if let Err(e) = got {
                assert!(e.contains(names) && e.contains("--insecure-listen"), "{e}");
            }
        }
        assert_eq!(check_exposure(&loopback, false, false, false), Ok(()));
        assert_eq!(check_exposure(&socket, false, false, false), Ok(()));
        assert!(
            check_exposure(&socket, true, true, false)
                .unwrap_err()
                .contains("unix socket")
        );
    }

    #[test]
    fn a_token_file_needs_sixteen_characters_exactly_at_the_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{}\n", "t".repeat(16))).unwrap();
        assert_eq!(
            read_token_file(&path).unwrap().expose_secret(),
            "t".repeat(16),
            "16 characters (the trailing newline not counted) are enough"
        );
        std::fs::write(&path, format!("{}\n", "t".repeat(15))).unwrap();
        let err = read_token_file(&path).unwrap_err();
        assert!(err.contains("at least 16"), "{err}");
        assert!(
            !err.contains("ttttt"),
            "the contents are never quoted: {err}"
        );
    }

    #[test]
    fn a_token_with_whitespace_or_a_control_character_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        for bad in [
            "0123456789abcdef ghij",
            "0123456789abcdef\u{7}",
            "0123456789abcdef\tx",
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = read_token_file(&path).unwrap_err();
            assert!(err.contains("whitespace"), "{bad:?}: {err}");
        }
    }
}
