//! Where the one-shot modes (docker credential helper, kubelet credential provider) get
//! credentials: a running sidecar, or an in-process broker.
//!
//! A helper gets no flags from the client that runs it, so both read the environment:
//! - `REGBROKER_ENDPOINT`: `http://127.0.0.1:PORT`, `https://HOST:PORT` or
//!   `unix:/path/to/socket` of a running `regbroker serve`. When set, the sidecar is asked.
//! - `REGBROKER_CA_FILE`: for an `https://` endpoint, the PEM CA certificate(s) its
//!   certificate must chain to (required: a sidecar's certificate comes from a cluster's
//!   own CA, such as cert-manager's, not from the public web PKI).
//! - `REGBROKER_AUTH_TOKEN_FILE`: the sidecar's bearer token, if it needs one.
//! - otherwise an in-process broker built from `REGBROKER_CONFIG`,
//!   `REGBROKER_DOCKER_CONFIG` (comma-separated) and the clouds' own variables, with the
//!   optional disk cache `REGBROKER_CACHE_DIR` (see [`super::disk_cache`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::BodyExt;
use regbroker_provider::{Credential, ExposeSecret, Registry, SecretString};

use crate::broker::{Broker, BrokerError};

/// Env var naming a running sidecar.
pub const ENDPOINT_ENV: &str = "REGBROKER_ENDPOINT";
/// Env var naming the CA file an `https://` sidecar's certificate is checked against.
pub const CA_FILE_ENV: &str = "REGBROKER_CA_FILE";

/// How long to wait for a sidecar's answer.
const SIDECAR_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest sidecar answer read.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A credential.
    Found(Credential),
    /// Nothing serves this registry: the client should go anonymous.
    NotFound,
}

/// A running sidecar's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `http://HOST:PORT` (loopback, normally).
    Http(String),
    /// `https://HOST:PORT`: TLS, the certificate checked against [`CA_FILE_ENV`].
    Https(String),
    /// `unix:/path`.
    Unix(PathBuf),
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Endpoint, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        let usage =
            || format!("endpoint `{s}` must be http://HOST:PORT, https://HOST:PORT or unix:PATH");
        let (https, rest) = match (s.strip_prefix("https://"), s.strip_prefix("http://")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            (None, None) => return Err(usage()),
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
            return Err(usage());
        }
        if https {
            // The certificate is checked against the host part: it must parse as one.
            server_name(authority).map_err(|e| format!("endpoint `{s}`: {e}"))?;
            return Ok(Endpoint::Https(authority.to_string()));
        }
        Ok(Endpoint::Http(authority.to_string()))
    }
}

/// A source of credentials for one-shot modes.
#[derive(Debug)]
pub enum Backend {
    /// Ask a running sidecar, with its bearer token if it needs one (and, for `https`,
    /// the TLS settings that trust its CA).
    Sidecar(
        Endpoint,
        Option<SecretString>,
        Option<Arc<rustls::ClientConfig>>,
    ),
    /// Run the broker in this process.
    InProcess(Arc<Broker>),
}

/// Settings for [`Backend::from_env`], read from the environment by default.
#[derive(Debug, Default, Clone)]
pub struct Settings {
    /// A running sidecar, if any.
    pub endpoint: Option<Endpoint>,
    /// Config file.
    pub config: Option<PathBuf>,
    /// Docker config sources.
    pub docker_config: Vec<PathBuf>,
    /// Disk cache directory.
    pub cache_dir: Option<PathBuf>,
    /// Bearer token file for the sidecar (`REGBROKER_AUTH_TOKEN_FILE`).
    pub auth_token_file: Option<PathBuf>,
    /// Allow an `http://` sidecar that is not on loopback (`REGBROKER_INSECURE_ENDPOINT=true`):
    /// the bearer token and the credentials then cross the network in cleartext.
    pub insecure_endpoint: bool,
    /// CA certificates for an `https://` sidecar (`REGBROKER_CA_FILE`).
    pub ca_file: Option<PathBuf>,
}

impl Settings {
    /// Reads `REGBROKER_ENDPOINT`, `REGBROKER_CONFIG`, `REGBROKER_DOCKER_CONFIG` and
    /// `REGBROKER_CACHE_DIR` through `var` (the process env in production).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let nonempty = |k: &str| var(k).filter(|v| !v.is_empty());
        Ok(Settings {
            endpoint: nonempty(ENDPOINT_ENV)
                .map(|s| s.parse())
                .transpose()
                .map_err(|e| format!("{ENDPOINT_ENV}: {e}"))?,
            config: nonempty(CONFIG_ENV).map(PathBuf::from),
            docker_config: nonempty(DOCKER_CONFIG_ENV)
                .map(|s| {
                    s.split(',')
                        .filter(|p| !p.is_empty())
                        .map(PathBuf::from)
                        .collect()
                })
                .unwrap_or_default(),
            cache_dir: nonempty(crate::oneshot::disk_cache::ENV).map(PathBuf::from),
            auth_token_file: nonempty(AUTH_TOKEN_FILE_ENV).map(PathBuf::from),
            ca_file: nonempty(CA_FILE_ENV).map(PathBuf::from),
            insecure_endpoint: crate::env::bool_var(
                INSECURE_ENDPOINT_ENV,
                var(INSECURE_ENDPOINT_ENV).as_deref(),
            )?,
        })
    }
}

/// Env var naming the config file (rules, cache settings).
pub const CONFIG_ENV: &str = "REGBROKER_CONFIG";
/// Env var listing docker config files or Secret directories, comma-separated.
pub const DOCKER_CONFIG_ENV: &str = "REGBROKER_DOCKER_CONFIG";
/// Env var naming the sidecar's bearer token file.
pub const AUTH_TOKEN_FILE_ENV: &str = "REGBROKER_AUTH_TOKEN_FILE";

/// Env var that allows a cleartext `http://` sidecar off loopback.
pub const INSECURE_ENDPOINT_ENV: &str = "REGBROKER_INSECURE_ENDPOINT";

/// Whether `authority` (`host:port`) names this machine: `localhost`, 127.0.0.0/8 or `[::1]`.
fn is_loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Backend {
    /// The backend `settings` ask for.
    pub fn new(settings: &Settings) -> Result<Backend, String> {
        if let Some(e) = &settings.endpoint {
            let token = match &settings.auth_token_file {
                Some(p) => Some(
                    crate::server::access::read_token_file(p)
                        .map_err(|e| format!("{e} (REGBROKER_AUTH_TOKEN_FILE)"))?,
                ),
                None => None,
            };
            if let Endpoint::Http(authority) = e
                && !is_loopback_authority(authority)
                && !settings.insecure_endpoint
            {
                return Err(format!(
                    "{ENDPOINT_ENV} is http:// to {authority}, which is not loopback: the bearer token and every credential would cross the network in cleartext. Use https:// with {CA_FILE_ENV}, or set {INSECURE_ENDPOINT_ENV}=true if the network is already encrypted (a service mesh)"
                ));
            }
            let tls = match (e, &settings.ca_file) {
                (Endpoint::Https(_), Some(ca)) => Some(Arc::new(client_tls(ca)?)),
                (Endpoint::Https(_), None) => {
                    return Err(format!(
                        "{ENDPOINT_ENV} is https: set {CA_FILE_ENV} to the PEM file of the CA that signed the sidecar's certificate"
                    ));
                }
                _ => None,
            };
            return Ok(Backend::Sidecar(e.clone(), token, tls));
        }
        let broker =
            crate::broker::build(settings.config.as_ref(), &settings.docker_config)?.broker;
        let broker = match &settings.cache_dir {
            None => broker,
            Some(dir) => {
                let disk = crate::oneshot::disk_cache::DiskCache::open(dir, broker.clock().clone())
                    .map_err(|e| {
                        format!(
                            "{}: {}: {e}",
                            crate::oneshot::disk_cache::ENV,
                            dir.display()
                        )
                    })?
                    .with_fallback_ttl(broker.cache().config().fallback_ttl)
                    .with_refetch_interval(broker.cache().config().refetch_interval);
                Arc::new(
                    Arc::into_inner(broker)
                        .ok_or("broker is shared")?
                        .with_persist(Arc::new(disk)),
                )
            }
        };
        Ok(Backend::InProcess(broker))
    }

    /// Looks up `registry`. `Err` holds a one-line message without secrets.
    pub async fn lookup(&self, registry: &Registry) -> Result<Lookup, String> {
        self.lookup_as(registry, None).await
    }

    /// Looks up `registry` as `workload`'s own identity (`None`: this process's). A
    /// workload is served in-process only: its ServiceAccount token is never sent to a
    /// sidecar.
    pub async fn lookup_as(
        &self,
        registry: &Registry,
        workload: Option<&regbroker_provider::WorkloadIdentity>,
    ) -> Result<Lookup, String> {
        match self {
            // A one-shot process exits right after answering, before a background
            // refresh could finish: past the refresh point it waits for the new one.
            Backend::InProcess(broker) => match match workload {
                Some(w) => broker.fresh_credential_for(registry, w).await,
                None => broker.fresh_credential(registry).await,
            } {
                Ok(served) => Ok(Lookup::Found(served.credential)),
                Err(BrokerError::NotConfigured(_)) => Ok(Lookup::NotFound),
                // A provider that declines the host (a GCP identity of another universe):
                // go anonymous, as the sidecar's 404 says.
                Err(BrokerError::Provider { error, .. })
                    if error.kind() == regbroker_provider::ErrorKind::NotConfigured =>
                {
                    tracing::info!(error = %error.chain(), "Provider does not serve this registry");
                    Ok(Lookup::NotFound)
                }
                Err(e) => {
                    // The broker has logged a failed fetch with its causes; this only adds
                    // them for a provider that refused the route itself.
                    if let BrokerError::Provider { error, .. } = &e {
                        tracing::debug!(error = %error.chain(), "Credential lookup failed");
                    }
                    Err(e.to_string())
                }
            },
            Backend::Sidecar(..) if workload.is_some() => Err(format!(
                "a ServiceAccount token (per-workload identity) is exchanged in this process only, never sent to a sidecar: unset {ENDPOINT_ENV} for this provider"
            )),
            Backend::Sidecar(endpoint, token, tls) => tokio::time::timeout(
                SIDECAR_TIMEOUT,
                ask_sidecar(endpoint, token.as_ref(), tls.as_ref(), registry),
            )
            .await
            .map_err(|_| format!("regbroker sidecar did not answer within {SIDECAR_TIMEOUT:?}"))?,
        }
    }

    /// A client's report that `registry` refused the credential it got (the helper's
    /// `erase`): the in-process broker forgets it, its disk cache record included, so the
    /// next lookup fetches anew (at most once per `refetch_interval`). A sidecar backend
    /// is not asked (`DELETE /v1/credentials` is its own).
    pub async fn report_refused(&self, registry: &Registry) -> Result<(), String> {
        match self {
            Backend::InProcess(broker) => match broker.report_refused(registry).await {
                Ok(done) => {
                    tracing::debug!(?done, "Refused credential reported");
                    Ok(())
                }
                Err(BrokerError::NotConfigured(_)) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
            Backend::Sidecar(..) => Ok(()),
        }
    }

    /// Whether `registry` is routed to a provider whose credential is the subject token
    /// itself (the `oidc` pass-through), decided without fetching. A sidecar's routes are
    /// not known here: `false`.
    pub fn passes_subject_token(&self, registry: &Registry) -> bool {
        match self {
            Backend::InProcess(broker) => matches!(
                broker.decide(registry).route,
                crate::broker::Route::Provider(p, _) if p.passes_subject_token()
            ),
            Backend::Sidecar(..) => false,
        }
    }

    /// Now, by the backend's clock.
    pub fn now(&self) -> SystemTime {
        match self {
            Backend::InProcess(b) => b.now(),
            Backend::Sidecar(..) => {
                regbroker_provider::Clock::now(&regbroker_provider::SystemClock)
            }
        }
    }

    /// Cache settings (the sidecar's are not known here: defaults).
    pub fn cache_config(&self) -> crate::broker::cache::Config {
        match self {
            Backend::InProcess(b) => b.cache().config().clone(),
            Backend::Sidecar(..) => crate::broker::cache::Config::default(),
        }
    }
}

/// The provider whose credential is the caller's own token (`regbroker_federated`'s
/// `oidc`), as a sidecar names it in its answer's `provider`.
const PASS_THROUGH: &str = "oidc";

async fn ask_sidecar(
    endpoint: &Endpoint,
    token: Option<&SecretString>,
    tls: Option<&Arc<rustls::ClientConfig>>,
    registry: &Registry,
) -> Result<Lookup, String> {
    let path = format!(
        "/v1/credentials?{}",
        serde_urlencoded::to_string([("registry", registry.as_str())]).map_err(|e| e.to_string())?
    );
    let unreachable = |e: &dyn std::fmt::Display| {
        format!(
            "cannot reach the regbroker sidecar at {}: {e}",
            show(endpoint)
        )
    };
    let (status, body) = match endpoint {
        Endpoint::Http(authority) => {
            let stream = tokio::net::TcpStream::connect(authority)
                .await
                .map_err(|e| unreachable(&e))?;
            http_get(stream, authority, &path, token)
                .await
                .map_err(|e| unreachable(&e))?
        }
        Endpoint::Https(authority) => {
            let tls = tls.ok_or_else(|| format!("{CA_FILE_ENV} is not set"))?;
            let name = server_name(authority)?;
            let stream = tokio::net::TcpStream::connect(authority)
                .await
                .map_err(|e| unreachable(&e))?;
            // rustls's error says why the certificate was refused (unknown issuer, wrong
            // name, expired); it holds no secret.
            let stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, stream)
                .await
                .map_err(|e| {
                    format!(
                        "TLS with the regbroker sidecar at {} failed (is {CA_FILE_ENV} the CA that signed its certificate?): {e}",
                        show(endpoint)
                    )
                })?;
            http_get(stream, authority, &path, token)
                .await
                .map_err(|e| unreachable(&e))?
        }
        Endpoint::Unix(p) => {
            let stream = tokio::net::UnixStream::connect(p)
                .await
                .map_err(|e| unreachable(&e))?;
            http_get(stream, "localhost", &path, token)
                .await
                .map_err(|e| unreachable(&e))?
        }
    };
    let json: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|_| format!("regbroker sidecar answered {status} with a body that is not JSON"))?;
    match status {
        200 => {
            let field = |k: &str| {
                json.get(k)
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| format!("regbroker sidecar answer lacks `{k}`"))
            };
            let expires_at = json
                .get("expiresAt")
                .and_then(|v| v.as_str())
                .and_then(|s| humantime::parse_rfc3339(s).ok());
            let credential = Credential::new(
                field("username")?,
                SecretString::from(field("password")?),
                expires_at,
            );
            // The pass-through provider's answer is the sidecar's own ServiceAccount
            // token: marked, so the kubelet plugin never hands it to every pod.
            Ok(Lookup::Found(if json["provider"] == PASS_THROUGH {
                credential.passing_subject_token()
            } else {
                credential
            }))
        }
        404 => Ok(Lookup::NotFound),
        _ => {
            let message = json["error"]["message"].as_str().unwrap_or("no message");
            Err(format!("regbroker sidecar answered {status}: {message}"))
        }
    }
}

fn show(e: &Endpoint) -> String {
    match e {
        Endpoint::Http(a) => format!("http://{a}"),
        Endpoint::Https(a) => format!("https://{a}"),
        Endpoint::Unix(p) => format!("unix:{}", p.display()),
    }
}

/// The host of `HOST:PORT` (`[v6]:PORT` too) as a TLS server name (DNS name or IP).
fn server_name(authority: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| format!("`{host}` is not a host name or IP address"))
}

/// TLS client settings trusting only the CA certificates in `ca_file`.
fn client_tls(ca_file: &std::path::Path) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let what = format!("{CA_FILE_ENV}: {}", ca_file.display());
    let pem = std::fs::read(ca_file).map_err(|e| format!("{what}: cannot read it: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|_| format!("{what}: not a valid PEM file"))?;
        roots
            .add(cert)
            .map_err(|e| format!("{what}: not a usable CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{what}: no CERTIFICATE block in it"));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

async fn http_get<S>(
    stream: S,
    host: &str,
    path: &str,
    token: Option<&SecretString>,
) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error + Send + Sync>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let mut req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    if let Some(token) = token {
        let mut value =
            hyper::header::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))?;
        value.set_sensitive(true);
        req.headers_mut()
            .insert(hyper::header::AUTHORIZATION, value);
    }
    let res = sender.send_request(req).await?;
    let status = res.status().as_u16();
    let body = http_body_util::Limited::new(res.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await?
        .to_bytes()
        .to_vec();
    conn.abort();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn endpoint_forms() {
        assert_eq!(
            "http://127.0.0.1:8477".parse(),
            Ok(Endpoint::Http("127.0.0.1:8477".into()))
        );
        assert_eq!(
            "http://127.0.0.1:8477/".parse(),
            Ok(Endpoint::Http("127.0.0.1:8477".into()))
        );
        assert_eq!(
            "https://regbroker.flux-system.svc:8477".parse(),
            Ok(Endpoint::Https("regbroker.flux-system.svc:8477".into()))
        );
        assert!(server_name("[::1]:8477").is_ok());
        assert!(server_name("10.0.0.7:8477").is_ok());
        assert_eq!(
            "unix:/run/x.sock".parse(),
            Ok(Endpoint::Unix("/run/x.sock".into()))
        );
        for bad in [
            "127.0.0.1:8477",
            "ftp://127.0.0.1:8477",
            "https://bad_host!:8477",
            "unix:",
            "http://",
            "http://a@b:1",
            "http://a:1/x",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cleartext_sidecar_off_loopback_is_refused_unless_allowed() {
        for local in [
            "http://127.0.0.1:8477",
            "http://127.9.9.9:1",
            "http://[::1]:8477",
            "http://localhost:8477",
        ] {
            let settings = Settings {
                endpoint: Some(local.parse().unwrap()),
                ..Settings::default()
            };
            assert!(Backend::new(&settings).is_ok(), "{local}");
        }
        for remote in [
            "http://10.0.0.7:8477",
            "http://regbroker.flux-system.svc:8477",
            "http://[2001:db8::1]:8477",
            "http://127.0.0.1.example.com:80",
        ] {
            let mut settings = Settings {
                endpoint: Some(remote.parse().unwrap()),
                ..Settings::default()
            };
            let err = Backend::new(&settings).unwrap_err();
            assert!(
                err.contains("cleartext") && err.contains(INSECURE_ENDPOINT_ENV),
                "{err}"
            );
            settings.insecure_endpoint = true;
            assert!(Backend::new(&settings).is_ok(), "{remote} with the opt-in");
        }
        let from_env = Settings::from_env(|k| match k {
            "REGBROKER_ENDPOINT" => Some("http://10.0.0.7:8477".into()),
            "REGBROKER_INSECURE_ENDPOINT" => Some("1".into()),
            _ => None,
        })
        .unwrap();
        assert!(from_env.insecure_endpoint);
    }

    #[test]
    fn the_helper_refuses_a_cache_dir_owned_by_someone_else() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"{"auths": {"r.example.com": {"username": "u", "password": "static-pw"}}}"#,
        )
        .unwrap();
        let cache = if rustix::process::geteuid().is_root() {
            // Another local user (nobody) made the directory, world-writable.
            let d = dir.path().join("shared");
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
            d
        } else {
            // Unprivileged, a test cannot give a directory away: "/" (root's) stands in.
            assert_ne!(
                std::fs::metadata("/").unwrap().uid(),
                rustix::process::geteuid().as_raw()
            );
            PathBuf::from("/")
        };
        let settings = Settings {
            docker_config: vec![config],
            cache_dir: Some(cache.clone()),
            ..Default::default()
        };
        let mut out = Vec::new();
        let code = crate::oneshot::helper::run(
            "get",
            || Ok(settings),
            &mut &b"r.example.com\n"[..],
            &mut out,
        );
        let out = String::from_utf8(out).unwrap();
        // Invalid settings: exit 64.
        assert_eq!(code, 64, "{out}");
        assert!(out.contains("REGBROKER_CACHE_DIR"), "{out}");
        assert!(out.contains("owned by uid"), "{out}");
        assert!(!out.contains("static-pw"), "{out}");
    }

    #[test]
    fn settings_from_env_map() {
        let env: HashMap<&str, &str> = HashMap::from([
            ("REGBROKER_ENDPOINT", "unix:/run/regbroker.sock"),
            ("REGBROKER_DOCKER_CONFIG", "/a.json,/b"),
            ("REGBROKER_CACHE_DIR", ""),
        ]);
        let s = Settings::from_env(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(
            s.endpoint,
            Some(Endpoint::Unix("/run/regbroker.sock".into()))
        );
        assert_eq!(
            s.docker_config,
            vec![PathBuf::from("/a.json"), PathBuf::from("/b")]
        );
        assert_eq!(s.cache_dir, None);
        let bad =
            Settings::from_env(|k| (k == "REGBROKER_ENDPOINT").then(|| "ftp://x".to_string()));
        assert!(bad.unwrap_err().contains("REGBROKER_ENDPOINT"));
    }
}
