//! The bytes of `/v1/credentials`' 200 answer, written by hand.
//!
//! `serde_json` escapes a string one byte at a time through a table; on an ECR-sized
//! password (about 1.6 KB) that was the largest single item of a cache hit's user time
//! (6.6 % of the server's samples under `wrk -c16`, BENCHMARKS.md "The hit path"). A
//! string with no byte JSON must escape is copied as it is, after a check the compiler
//! vectorises; any other string is escaped by `serde_json` itself, so the bytes are
//! always what `serde_json` writes for the same fields (a unit test holds them to it).
//!
//! The answer holds the secret, so its buffer is sized exactly before the first byte is
//! written (a `Vec` that grew would free its old buffer, secret and all, unzeroised) and
//! is zeroised when the last reference to it goes, which is once hyper has written it.

use bytes::Bytes;
use zeroize::Zeroizing;

/// The fields of the answer, in the order earlier releases printed them (alphabetical).
/// `expires_at` is `None` for a credential without a known expiry (`"expiresAt":null`).
pub(super) struct CredentialBody<'a> {
    pub(super) expires_at: Option<&'a str>,
    pub(super) password: &'a str,
    pub(super) provider: &'a str,
    pub(super) registry: &'a str,
    pub(super) username: &'a str,
}

const EXPIRES_AT: &[u8] = b"{\"expiresAt\":";
const PASSWORD: &[u8] = b",\"password\":";
const PROVIDER: &[u8] = b",\"provider\":";
const REGISTRY: &[u8] = b",\"registry\":";
const USERNAME: &[u8] = b",\"username\":";
const NULL: &[u8] = b"null";

impl CredentialBody<'_> {
    /// The answer as JSON, in a buffer zeroised when the returned bytes are dropped.
    pub(super) fn to_bytes(&self) -> Bytes {
        let len = EXPIRES_AT.len()
            + self.expires_at.map_or(NULL.len(), quoted_len)
            + PASSWORD.len()
            + quoted_len(self.password)
            + PROVIDER.len()
            + quoted_len(self.provider)
            + REGISTRY.len()
            + quoted_len(self.registry)
            + USERNAME.len()
            + quoted_len(self.username)
            + 1;
        let mut out = Zeroizing::new(Vec::with_capacity(len));
        out.extend_from_slice(EXPIRES_AT);
        match self.expires_at {
            Some(t) => push_quoted(&mut out, t),
            None => out.extend_from_slice(NULL),
        }
        out.extend_from_slice(PASSWORD);
        push_quoted(&mut out, self.password);
        out.extend_from_slice(PROVIDER);
        push_quoted(&mut out, self.provider);
        out.extend_from_slice(REGISTRY);
        push_quoted(&mut out, self.registry);
        out.extend_from_slice(USERNAME);
        push_quoted(&mut out, self.username);
        out.push(b'}');
        debug_assert_eq!(out.len(), len, "the answer's length was miscounted");
        Bytes::from_owner(out)
    }
}

/// Whether JSON needs `s` escaped: a quote, a backslash or a control character below
/// 0x20 (the bytes `serde_json` escapes; it writes everything else as it is). A fold
/// without an early exit, so that it runs on whole vectors.
fn plain(s: &str) -> bool {
    s.bytes()
        .fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'))
}

/// Bytes of `s` as a JSON string, quotes included, as `serde_json` writes it: two for
/// `\"`, `\\` and the short escapes `\b \t \n \f \r`, six for another control character
/// (`\u00XX`).
fn quoted_len(s: &str) -> usize {
    if plain(s) {
        return s.len() + 2;
    }
    let escaped: usize = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    escaped + 2
}

/// Appends `s` as a JSON string; `out` has room for [`quoted_len`] more bytes.
fn push_quoted(out: &mut Vec<u8>, s: &str) {
    if plain(s) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing to a Vec cannot fail, and a `&str` always serialises.
        let _ = serde_json::to_writer(out, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the answer was before: serde_json over the same fields.
    #[derive(serde::Serialize)]
    struct Reference<'a> {
        #[serde(rename = "expiresAt")]
        expires_at: Option<&'a str>,
        password: &'a str,
        provider: &'a str,
        registry: &'a str,
        username: &'a str,
    }

    fn both(body: &CredentialBody<'_>) -> (Bytes, Vec<u8>) {
        let reference = serde_json::to_vec(&Reference {
            expires_at: body.expires_at,
            password: body.password,
            provider: body.provider,
            registry: body.registry,
            username: body.username,
        })
        .unwrap();
        (body.to_bytes(), reference)
    }

    #[test]
    fn the_answer_is_what_serde_json_writes_for_the_same_fields() {
        let strings = [
            "",
            "AWS",
            "oauth2accesstoken",
            "eyJwYXlsb2FkIjoi+/=",
            "quote\"d",
            "back\\slash",
            "tab\there, newline\n, cr\r, bs\u{8}, ff\u{c}",
            "nul\u{0} esc\u{1b} us\u{1f} del\u{7f}",
            "ünïcödé ✓ 𝄞",
            "\"\\\u{0}",
        ];
        for password in strings {
            for username in ["AWS", "a\"b", "\u{1}"] {
                for expires_at in [None, Some("2026-12-04T19:30:00Z"), Some("x\ny")] {
                    let body = CredentialBody {
                        expires_at,
                        password,
                        provider: "static",
                        registry: "123456789012.dkr.ecr.us-east-1.amazonaws.com",
                        username,
                    };
                    let (ours, reference) = both(&body);
                    assert_eq!(
                        ours.as_ref(),
                        reference.as_slice(),
                        "{password:?} {username:?} {expires_at:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_byte_that_needs_escaping_is_counted_and_escaped_as_serde_json_does() {
        // Each byte alone and inside plain text, at every position a vector could split.
        for b in 0u8..0x80 {
            let c = char::from(b);
            let long = format!("{}{c}{}", "a".repeat(31), "b".repeat(33));
            for s in [c.to_string(), long] {
                let reference = serde_json::to_vec(&s).unwrap();
                assert_eq!(quoted_len(&s), reference.len(), "{b:#04x}");
                assert_eq!(plain(&s), reference.len() == s.len() + 2, "{b:#04x}");
                let mut out = Vec::with_capacity(quoted_len(&s));
                let room = out.capacity();
                push_quoted(&mut out, &s);
                assert_eq!(out, reference, "{b:#04x}");
                assert_eq!(out.capacity(), room, "{b:#04x}: the buffer grew");
            }
        }
    }
}
