//! Who may use the REST API. On loopback, anyone on this machine, as
//! before; on any other address only a client that presents the token
//! (`--http-token-file`, `rest.auth.token-file`), and a server there
//! without one is refused at start. The token travels as `Authorization:
//! Bearer TOKEN` (the `tidemark` clients; Flink's own command line with
//! `FLINK_REST_CLIENT_HEADERS`) or as the password of HTTP Basic, which a
//! browser asks for, so that the page works too. The check runs before any
//! handler, so a refused request reads and creates nothing.

use crate::job::HttpTokenError;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// The secret every request to an exposed REST API must present.
#[derive(Clone)]
pub struct HttpToken(Arc<str>);

impl std::fmt::Debug for HttpToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpToken(…)")
    }
}

impl HttpToken {
    /// `secret` as a token; surrounding white space is dropped.
    pub fn new(secret: &str) -> Result<HttpToken, HttpTokenError> {
        let secret = secret.trim();
        if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(HttpTokenError::Malformed(
                "is empty or has other characters".into(),
            ));
        }
        Ok(HttpToken(secret.into()))
    }

    /// The token in `path`: its one line.
    pub fn read(path: &Path) -> Result<HttpToken, HttpTokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| HttpTokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        HttpToken::new(&text).map_err(|_| {
            HttpTokenError::Malformed(format!(
                "in {} is empty or has other characters",
                path.display()
            ))
        })
    }

    /// The token in `path`, if a path is given.
    pub fn read_optional(path: Option<&Path>) -> Result<Option<HttpToken>, HttpTokenError> {
        path.map(HttpToken::read).transpose()
    }

    /// The `Authorization` header value the clients send.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether an `Authorization` header presents this token, as a bearer
    /// token or as a Basic password (any user name).
    pub(crate) fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization.and_then(|v| std::str::from_utf8(v).ok()) else {
            return false;
        };
        let (scheme, credentials) = value.trim().split_once(' ').unwrap_or((value, ""));
        let presented = if scheme.eq_ignore_ascii_case("bearer") {
            credentials.trim().as_bytes().to_vec()
        } else if scheme.eq_ignore_ascii_case("basic") {
            use base64::Engine;
            let Ok(pair) = base64::engine::general_purpose::STANDARD.decode(credentials.trim())
            else {
                return false;
            };
            match pair.iter().position(|&b| b == b':') {
                Some(colon) => pair[colon + 1..].to_vec(),
                None => return false,
            }
        } else {
            return false;
        };
        same(&presented, self.0.as_bytes())
    }
}

/// Compares in time that depends on the lengths only, so that a client
/// cannot learn the token byte by byte from how long a refusal takes.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// Refuses to serve on `addr` beyond loopback unless `authenticated` (by
/// a token) and `encrypted` (TLS, or a network the operator trusts), so
/// that the token does not travel in the clear.
pub fn check_exposure(
    addr: SocketAddr,
    authenticated: bool,
    encrypted: bool,
) -> Result<(), HttpTokenError> {
    match (addr.ip().is_loopback(), authenticated, encrypted) {
        (true, _, _) | (false, true, true) => Ok(()),
        (false, false, _) => Err(HttpTokenError::Unauthenticated(addr)),
        (false, true, false) => Err(HttpTokenError::Plaintext(addr)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn basic(user_and_password: &str) -> Vec<u8> {
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_and_password);
        format!("Basic {encoded}").into_bytes()
    }

    #[test]
    fn the_token_is_admitted_as_bearer_or_basic_password_and_nothing_else() {
        let token = HttpToken::new(" s3cret-Token\n").unwrap();
        assert!(token.admits(Some(b"Bearer s3cret-Token")));
        assert!(token.admits(Some(b"bearer  s3cret-Token ")));
        assert!(token.admits(Some(&basic("anyone:s3cret-Token"))));
        assert!(token.admits(Some(&basic(":s3cret-Token"))));
        for refused in [
            &b""[..],
            b"Bearer",
            b"Bearer s3cret-Toke",
            b"Bearer s3cret-Tokenn",
            b"Bearer S3CRET-TOKEN",
            b"s3cret-Token",
            b"Token s3cret-Token",
            &basic("s3cret-Token:"),
            &basic("s3cret-Token"),
            b"Basic !!!",
            &[0xff, 0xfe],
        ] {
            assert!(
                !token.admits(Some(refused)),
                "{:?}",
                String::from_utf8_lossy(refused)
            );
        }
        assert!(!token.admits(None));
    }

    #[test]
    fn a_token_that_cannot_travel_in_a_header_is_refused() {
        for bad in ["", "  \n", "two words", "tab\there", "naïve"] {
            assert!(HttpToken::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            format!("{:?}", HttpToken::new("x").unwrap()),
            "HttpToken(…)"
        );
    }

    #[test]
    fn only_loopback_may_go_without_a_token_or_in_the_clear() {
        for loopback in ["127.0.0.1:8081", "127.0.0.2:0", "[::1]:8081"] {
            let addr = loopback.parse().unwrap();
            assert!(check_exposure(addr, false, false).is_ok(), "{loopback}");
        }
        for exposed in ["0.0.0.0:8081", "[::]:8081", "192.0.2.7:8081"] {
            let addr = exposed.parse().unwrap();
            for encrypted in [false, true] {
                let refusal = check_exposure(addr, false, encrypted)
                    .unwrap_err()
                    .to_string();
                assert!(refusal.contains("--http-token-file"), "{refusal}");
            }
            let clear = check_exposure(addr, true, false).unwrap_err().to_string();
            assert!(
                clear.contains("--http-tls-cert") && clear.contains("--insecure"),
                "{clear}"
            );
            assert!(check_exposure(addr, true, true).is_ok(), "{exposed}");
        }
    }
}
