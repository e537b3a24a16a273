//! The provider's HTTP clients, and the bounded read of an upstream answer.
//!
//! Reads the proxy variables (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, as
//! reqwest does) when the client is built. An identity endpoint on a loopback or
//! link-local address (IMDS at `169.254.169.254`, App Service's `IDENTITY_ENDPOINT` on
//! `localhost`) is never reached through a proxy: the proxy would receive the Entra ID
//! token request, `x-identity-header` secret included, and the token. Every other host
//! (Entra ID, the registry's exchange) honours the proxy variables.

use std::net::IpAddr;
use std::time::Duration;

use azure_core::http::{AsyncRawResponse, HttpClient, Request};
use regbroker_provider::{Error, MAX_UPSTREAM_BODY};

use crate::reqwest;

/// The clients of one provider: one honouring the proxy variables, one never proxying
/// (for loopback and link-local hosts).
#[derive(Clone, Debug)]
pub(crate) struct Http {
    proxied: reqwest::Client,
    direct: reqwest::Client,
}

impl Http {
    /// The provider's own clients: no redirects, bounded timeouts, and (when given) only
    /// `roots` trusted (PEM).
    pub(crate) fn build(roots: &[Vec<u8>]) -> Result<Http, Error> {
        let builder = || -> Result<reqwest::ClientBuilder, Error> {
            let b = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(20))
                .redirect(reqwest::redirect::Policy::none());
            if roots.is_empty() {
                return Ok(b);
            }
            let certs = roots
                .iter()
                .map(|pem| reqwest::Certificate::from_pem(pem))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    Error::invalid_config("a TLS root certificate is not valid PEM").with_source(e)
                })?;
            Ok(b.tls_certs_only(certs))
        };
        let fail = |e| Error::invalid_config("cannot build the HTTP client").with_source(e);
        Ok(Http {
            proxied: builder()?.build().map_err(fail)?,
            direct: builder()?.no_proxy().build().map_err(fail)?,
        })
    }

    /// One client for everything (one given to the builder: its proxy settings are the
    /// caller's).
    pub(crate) fn single(client: reqwest::Client) -> Http {
        Http {
            proxied: client.clone(),
            direct: client,
        }
    }

    /// The client for a request to `url`.
    pub(crate) fn for_url(&self, url: &url::Url) -> &reqwest::Client {
        if never_proxied(url) {
            &self.direct
        } else {
            &self.proxied
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for Http {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
        let response = HttpClient::execute_request(self.for_url(request.url()), request).await?;
        if !response.status().is_success() {
            return Ok(response);
        }
        let (status, headers, body) = response.deconstruct();
        let body = collect_bounded(body).await?;
        Ok(AsyncRawResponse::from_bytes(
            status,
            headers,
            bounded_expires_in(body),
        ))
    }
}

/// An identity answer's body, read up to [`MAX_UPSTREAM_BODY`]: past that it is a
/// `DataConversion` error (which `identity::token_error` reports as a bad response), and
/// nothing past the cap is buffered. Entra ID and IMDS answer a few KiB.
pub(crate) async fn collect_bounded(
    mut body: azure_core::http::AsyncResponseBody,
) -> azure_core::Result<azure_core::Bytes> {
    use futures_core::Stream;
    let mut out = Vec::new();
    while let Some(chunk) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_next(cx)).await
    {
        let chunk = chunk?;
        if out.len() + chunk.len() > MAX_UPSTREAM_BODY {
            return Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::DataConversion,
                format!("the identity endpoint's answer is larger than {MAX_UPSTREAM_BODY} bytes"),
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.into())
}

/// An identity answer with its numeric `expires_in` (and `ext_expires_in`) clamped to
/// `0..=`[`regbroker_provider::MAX_LIFETIME`]. azure_identity 1.0 adds `expires_in`
/// seconds to the current time with a panicking `+` (`handle_entra_response`), so an
/// Entra ID answer of `"expires_in": 9223372036854775807` would abort the sidecar (found
/// by the `entra_error` fuzz target); no real token lives longer than the cap anyway.
/// Anything that is not a JSON object with such a field passes through unchanged.
pub(crate) fn bounded_expires_in(body: azure_core::Bytes) -> azure_core::Bytes {
    let max = regbroker_provider::MAX_LIFETIME.as_secs();
    let Ok(serde_json::Value::Object(mut map)) = serde_json::from_slice(&body) else {
        return body;
    };
    let mut changed = false;
    for key in ["expires_in", "ext_expires_in"] {
        if let Some(serde_json::Value::Number(n)) = map.get(key) {
            let within = n.as_u64().is_some_and(|v| v <= max);
            if !within {
                let clamped = if n.as_f64().is_some_and(|f| f > 0.0) {
                    max
                } else {
                    0
                };
                map.insert(key.to_string(), serde_json::Value::from(clamped));
                changed = true;
            }
        }
    }
    if !changed {
        return body;
    }
    serde_json::to_vec(&map)
        .map(azure_core::Bytes::from)
        .unwrap_or(body)
}

/// Whether `url`'s host is loopback or link-local (IPv4 or IPv6), or `localhost`.
pub(crate) fn never_proxied(url: &url::Url) -> bool {
    let ip = match url.host() {
        Some(url::Host::Ipv4(a)) => IpAddr::V4(a),
        Some(url::Host::Ipv6(a)) => IpAddr::V6(a),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            return d == "localhost" || d.ends_with(".localhost");
        }
        None => return false,
    };
    match ip {
        IpAddr::V4(a) => a.is_loopback() || a.is_link_local(),
        IpAddr::V6(a) => {
            a.is_loopback()
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_link_local())
        }
    }
}

/// Reads `response`'s body, at most [`MAX_UPSTREAM_BODY`] bytes: a longer body is an
/// error naming `what` and the cap, and nothing past the cap is buffered. `Ok(Err(..))`
/// is a transport error while reading.
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    what: &str,
) -> Result<Result<Vec<u8>, reqwest::Error>, Error> {
    let too_large = || {
        Error::bad_response(format!(
            "{what} answered with a body larger than {MAX_UPSTREAM_BODY} bytes"
        ))
    };
    if response
        .content_length()
        .is_some_and(|n| n > MAX_UPSTREAM_BODY as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_UPSTREAM_BODY {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Ok(body)),
            Err(e) => return Ok(Err(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn absurd_token_lifetimes_are_clamped_before_the_sdk_sees_them() {
        let max = regbroker_provider::MAX_LIFETIME.as_secs();
        let read = |b: &str| -> serde_json::Value {
            serde_json::from_slice(&bounded_expires_in(azure_core::Bytes::from(b.to_string())))
                .unwrap()
        };
        let v =
            read(r#"{"access_token":"t","expires_in":9223372036854775807,"ext_expires_in":1e300}"#);
        assert_eq!(v["expires_in"], max);
        assert_eq!(v["ext_expires_in"], max);
        assert_eq!(v["access_token"], "t");
        assert_eq!(read(r#"{"expires_in":-5}"#)["expires_in"], 0);
        assert_eq!(read(r#"{"expires_in":3599}"#)["expires_in"], 3599);
        // IMDS writes it as a string: untouched (the SDK reads expires_on there).
        assert_eq!(read(r#"{"expires_in":"86399"}"#)["expires_in"], "86399");
        let raw = azure_core::Bytes::from_static(b"not json");
        assert_eq!(bounded_expires_in(raw.clone()), raw);
    }

    #[test]
    fn loopback_and_link_local_hosts_are_never_proxied() {
        for local in [
            "http://169.254.169.254/metadata/identity/oauth2/token",
            "http://127.0.0.1:8081/msi/token",
            "http://localhost:40342/metadata/identity/oauth2/token",
            "http://LOCALHOST./x",
            "http://[::1]:8080/x",
            "http://[fe80::1]/x",
            "http://[::ffff:169.254.169.254]/x",
        ] {
            assert!(never_proxied(&url::Url::parse(local).unwrap()), "{local}");
        }
        for remote in [
            "https://login.microsoftonline.com/t/oauth2/v2.0/token",
            "https://myregistry.azurecr.io/oauth2/exchange",
            "http://10.0.0.1/x",
            "http://169.254.169.254.example.com/x",
            "http://localhost.example.com/x",
        ] {
            assert!(
                !never_proxied(&url::Url::parse(remote).unwrap()),
                "{remote}"
            );
        }
    }
}
