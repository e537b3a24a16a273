//! The properties of the provider answer targets (issue 18, finding 1): each cloud's
//! answer parsing, driven through the same public functions the providers run on every
//! answer. Beyond "no panic":
//! - an accepted answer gives a non-empty password and an expiry at most
//!   [`MAX_LIFETIME`] after it was received (a year-10000 `expiresAt` or `exp` included);
//! - a refused answer is `upstream_bad_response` (Entra ID: the kind its status maps to)
//!   with one of a fixed set of messages: nothing of the body, the token or a secret.
//!
//! Only the answer-parsing functions of the provider crates are called: no provider is
//! built, nothing reaches the network (Entra ID's answer is handed to the SDK by an
//! in-process transport).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use regbroker_provider::{Credential, Error, ErrorKind, ExposeSecret, MAX_LIFETIME};

/// When every fuzzed answer is received (2027-01-15).
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn within_cap(c: &Credential, input: &[u8]) {
    assert!(
        !c.secret().expose_secret().is_empty(),
        "an empty password was accepted: {input:?}"
    );
    if let Some(at) = c.expires_at() {
        assert!(
            at <= now() + MAX_LIFETIME,
            "expiry {at:?} beyond the cap for {input:?}"
        );
    }
}

/// Asserts `chain` is `message`, or `message: <serde_json category> at line L column C`:
/// a position, never the bytes around it.
fn chain_is_positions_only(e: &Error) {
    let chain = e.chain();
    let Some(rest) = chain.strip_prefix(e.message()) else {
        panic!("chain {chain:?} does not start with the message");
    };
    if rest.is_empty() {
        return;
    }
    let rest = rest
        .strip_prefix(": ")
        .unwrap_or_else(|| panic!("{chain:?}"));
    let category = [
        "I/O error",
        "invalid JSON",
        "missing or mistyped field",
        "truncated JSON",
    ]
    .into_iter()
    .find(|c| rest.starts_with(c))
    .unwrap_or_else(|| panic!("unexpected cause in {chain:?}"));
    let pos = &rest[category.len()..];
    let ok = pos
        .strip_prefix(" at line ")
        .and_then(|p| p.split_once(" column "))
        .is_some_and(|(l, c)| {
            !l.is_empty()
                && !c.is_empty()
                && l.bytes().all(|b| b.is_ascii_digit())
                && c.bytes().all(|b| b.is_ascii_digit())
        });
    assert!(ok, "unexpected cause in {chain:?}");
}

/// `regbroker_aws::credential_from_authorization_data`, as the ECR and ECR Public
/// fetches call it. Input: a flags byte (bit 0: authorization data present, bit 1:
/// `expiresAt` present, bit 2: ECR Public), 8 bytes of `expiresAt` seconds and 4 of
/// nanoseconds (big-endian), then the `authorizationToken` text.
pub fn ecr_authorization_data(data: &[u8]) {
    if data.len() < 13 {
        return;
    }
    let flags = data[0];
    let secs = i64::from_be_bytes(data[1..9].try_into().unwrap_or_default());
    let nanos = u32::from_be_bytes(data[9..13].try_into().unwrap_or_default()) % 1_000_000_000;
    let Ok(token) = std::str::from_utf8(&data[13..]) else {
        return;
    };
    let what = if flags & 4 != 0 {
        "ECR Public GetAuthorizationToken in us-east-1"
    } else {
        "ECR GetAuthorizationToken for account 123456789012 in eu-west-1"
    };
    let at = (flags & 2 != 0).then(|| regbroker_aws::DateTime::from_secs_and_nanos(secs, nanos));
    let answer = (flags & 1 != 0).then_some((token, at));
    match regbroker_aws::credential_from_authorization_data(what, answer, now()) {
        Ok(c) => {
            within_cap(&c, data);
            assert_eq!(c.username(), regbroker_aws::USERNAME);
            // The password is what follows `AWS:` in the decoded token, nothing else.
            let decoded = regbroker_aws::decode_token(token).map(|p| p.expose_secret().to_string());
            assert_eq!(decoded.as_deref(), Ok(c.secret().expose_secret()));
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::BadResponse, "{e}");
            let allowed = [
                "no authorization data in the answer",
                "the authorization token is not base64",
                "the authorization token is not UTF-8",
                "the authorization token is not `AWS:<password>`",
            ];
            assert!(
                allowed
                    .iter()
                    .any(|why| e.message() == format!("{what}: {why}")),
                "unexpected message {:?}",
                e.message()
            );
            assert_eq!(e.chain(), e.message());
        }
    }
}

/// `regbroker_azure::exchange::parse_exchange_answer` on a whole answer body, then the
/// credential the exchange makes of it.
pub fn acr_exchange(data: &[u8]) {
    match regbroker_azure::exchange::parse_exchange_answer(data, now()) {
        Ok(answer) => {
            if answer.exp_unreadable {
                assert_eq!(answer.expires_at, now() + regbroker_azure::FALLBACK_TTL);
            }
            let c = Credential::issued(
                regbroker_azure::ACR_USERNAME,
                answer.refresh_token,
                Some(answer.expires_at),
                now(),
            );
            within_cap(&c, data);
        }
        Err(why) => assert!(
            [
                "with a body that is not the expected JSON",
                "without a refresh_token"
            ]
            .contains(&why),
            "unexpected message {why:?}"
        ),
    }
}

/// The ACR refresh token (a JWT whose `exp` is read unverified): the input is the
/// token, in an otherwise well-formed exchange answer.
pub fn acr_refresh_token(data: &[u8]) {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let body = serde_json::json!({ "refresh_token": token }).to_string();
    match regbroker_azure::exchange::parse_exchange_answer(body.as_bytes(), now()) {
        Ok(answer) => {
            assert_eq!(answer.refresh_token.expose_secret(), token);
            let c = Credential::issued(
                regbroker_azure::ACR_USERNAME,
                answer.refresh_token,
                Some(answer.expires_at),
                now(),
            );
            within_cap(&c, data);
        }
        Err(why) => {
            assert!(token.is_empty(), "{token:?} refused: {why}");
            assert_eq!(why, "without a refresh_token");
        }
    }
}

/// Google's answers, by the first byte: 0 a token answer (metadata server, `token_uri`,
/// STS), 1 an IAM Credentials `generateAccessToken` answer (the second byte picks the
/// lifetime asked for, in minutes), 2 the metadata server's universe domain. The rest is
/// the body.
pub fn google_answer(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    match kind % 3 {
        0 => match regbroker_gcp::answers::parse_token_answer(rest, now()) {
            Ok(c) => {
                within_cap(&c, data);
                assert_eq!(c.username(), regbroker_gcp::USERNAME);
                assert!(!c.secret().expose_secret().trim().is_empty());
            }
            Err(e) => google_refusal(
                &e,
                "token endpoint",
                &["unexpected body", "empty access token"],
            ),
        },
        1 => {
            let Some((&minutes, body)) = rest.split_first() else {
                return;
            };
            let lifetime = Duration::from_secs(60 * (u64::from(minutes) + 1));
            match regbroker_gcp::answers::parse_generated_token_answer(body, now(), lifetime) {
                Ok(c) => {
                    within_cap(&c, data);
                    let at = c.expires_at().unwrap_or(now());
                    assert!(at <= now() + lifetime, "longer than asked: {data:?}");
                }
                Err(e) => google_refusal(
                    &e,
                    "IAM Credentials",
                    &[
                        "unexpected body",
                        "empty access token",
                        "unreadable expireTime",
                    ],
                ),
            }
        }
        _ => match regbroker_gcp::answers::parse_universe_domain_answer(rest) {
            Ok(u) => {
                // A DNS name, stable when read again.
                assert!(!u.is_empty() && u.contains('.'), "{u:?}");
                assert_eq!(
                    regbroker_gcp::answers::parse_universe_domain_answer(u.as_bytes()).ok(),
                    Some(u.clone())
                );
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::BadResponse);
                assert_eq!(
                    e.message(),
                    "GCE metadata server answered with a universe domain that is not a DNS name"
                );
                assert_eq!(e.chain(), e.message());
            }
        },
    }
}

fn google_refusal(e: &Error, what: &str, endings: &[&str]) {
    assert_eq!(e.kind(), ErrorKind::BadResponse, "{e}");
    assert!(
        endings.iter().any(
            |end| e.message() == format!("{what} answered with an {end}")
                || e.message() == format!("{what} answered with a {end}")
        ),
        "unexpected message {:?}",
        e.message()
    );
    chain_is_positions_only(e);
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"))
    })
}

/// Entra ID's token endpoint answering HTTP `100 + (first two bytes % 500)` with the rest
/// as body, read by the real azure_identity credential
/// (`regbroker_azure::identity::entra_token_answer`) and mapped by the provider.
pub fn entra_error(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let status = 100 + u16::from_be_bytes([data[0], data[1]]) % 500;
    let body = data[2..].to_vec();
    let Some(e) = runtime().block_on(regbroker_azure::identity::entra_token_answer(status, body))
    else {
        assert!(
            (200..300).contains(&status),
            "HTTP {status} taken for a token"
        );
        return;
    };
    let secret = regbroker_azure::identity::ENTRA_ANSWER_SECRET;
    assert!(
        !e.chain().contains(secret),
        "the client secret leaked: {}",
        e.chain()
    );
    // The message is one of the provider's templates: who asked, the scope, the status
    // and Entra ID's numeric error codes; never text of the body.
    let who = "client secret identity regbroker-fuzz";
    let scope = "https://containerregistry.azure.net/.default";
    let shape: String = {
        let m = e.message().replace(who, "W").replace(scope, "S");
        let mut out = String::new();
        let mut in_number = false;
        for ch in m.chars() {
            if ch.is_ascii_digit() || ch == ',' || ch == '-' {
                if !in_number {
                    out.push('#');
                }
                in_number = true;
            } else {
                in_number = false;
                out.push(ch);
            }
        }
        out
    };
    let templates = [
        (
            "Entra ID refused a token for W (scope S# HTTP #)",
            ErrorKind::IdentityRejected,
        ),
        (
            "Entra ID refused a token for W (scope S# HTTP # Entra ID error codes #)",
            ErrorKind::IdentityRejected,
        ),
        (
            "Entra ID is throttling token requests for W (HTTP #)",
            ErrorKind::Throttled,
        ),
        (
            "Entra ID token request for W failed (HTTP #)",
            ErrorKind::Unavailable,
        ),
        (
            "Entra ID token request for W failed (HTTP # Entra ID error codes #)",
            ErrorKind::Unavailable,
        ),
        (
            "Entra ID token request for W answered HTTP #",
            ErrorKind::BadResponse,
        ),
        (
            "Entra ID token request for W answered HTTP # Entra ID error codes #",
            ErrorKind::BadResponse,
        ),
        (
            "Entra ID token answer for W could not be read",
            ErrorKind::BadResponse,
        ),
        (
            "Entra ID token request for W could not be sent",
            ErrorKind::Unavailable,
        ),
        (
            "Entra ID token request for W failed",
            ErrorKind::IdentityRejected,
        ),
    ];
    assert!(
        templates.iter().any(|(t, k)| *t == shape && *k == e.kind()),
        "unexpected error {:?} ({:?}) for HTTP {status}",
        e.message(),
        e.kind()
    );
}
