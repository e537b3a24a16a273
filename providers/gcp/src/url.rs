//! Checks on the endpoints a credentials file names.
//!
//! Reads no env var. A credentials file decides where a signed assertion or a subject
//! token is sent, so its URLs must be `https` (plain `http` only to a loopback address,
//! for local emulators and tests) and must not carry userinfo.

use std::net::IpAddr;

use regbroker_provider::Error;
use reqwest::Url;

/// `raw` parsed and checked; `what` names the setting in messages.
pub(crate) fn checked_endpoint(raw: &str, what: &str) -> Result<Url, Error> {
    let url = Url::parse(raw)
        .map_err(|e| Error::invalid_config(format!("{what} is not a URL")).with_source(e))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::invalid_config(format!(
            "{what} must not contain userinfo"
        )));
    }
    let host = url.host_str().unwrap_or_default();
    match url.scheme() {
        "https" if !host.is_empty() => Ok(url),
        "http" if is_loopback(host) => Ok(url),
        _ => Err(Error::invalid_config(format!(
            "{what} must be an https URL (http is allowed only to a loopback address)"
        ))),
    }
}

/// Like [`checked_endpoint`], but plain `http` is also allowed to a link-local address
/// (`169.254.169.254`: a cloud's instance metadata service hands out subject tokens).
pub(crate) fn checked_subject_token_url(raw: &str, what: &str) -> Result<Url, Error> {
    if let Ok(url) = Url::parse(raw) {
        let link_local = url.scheme() == "http"
            && url.username().is_empty()
            && url.password().is_none()
            && url
                .host_str()
                .and_then(|h| h.parse::<std::net::Ipv4Addr>().ok())
                .is_some_and(|ip| ip.is_link_local());
        if link_local {
            return Ok(url);
        }
    }
    checked_endpoint(raw, what)
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http() {
        for ok in [
            "https://oauth2.googleapis.com/token",
            "https://sts.googleapis.com/v1/token",
            "http://127.0.0.1:8080/token",
            "http://127.9.9.9/token",
            "http://localhost:1/token",
            "http://[::1]:99/token",
        ] {
            assert!(checked_endpoint(ok, "x").is_ok(), "{ok}");
        }
        for bad in [
            "http://oauth2.googleapis.com/token",
            "http://127.0.0.1.evil.com/token",
            "http://10.0.0.1/token",
            "https://user:pw@oauth2.googleapis.com/token",
            "ftp://127.0.0.1/token",
            "file:///etc/passwd",
            "oauth2.googleapis.com/token",
            "",
        ] {
            assert!(checked_endpoint(bad, "x").is_err(), "{bad}");
        }
        assert!(checked_subject_token_url("http://169.254.169.254/metadata/identity", "x").is_ok());
        assert!(checked_endpoint("http://169.254.169.254/metadata/identity", "x").is_err());
        assert!(checked_subject_token_url("http://10.0.0.1/token", "x").is_err());
    }
}
