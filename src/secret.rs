//! Values that must never reach a log: tokens, keys, passwords. [`Secret`] prints as `***` in
//! `Debug` (and has no `Display`), so a configuration printed whole, a panic message or a
//! `?config` field shows that a secret is set, never what it is. [`redact_url`] does the same
//! for a URL's password.

use std::fmt;
use std::str::FromStr;

/// A secret string: readable only through [`Secret::expose`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

/// A URL with any password replaced by `***` (text that is not a URL is returned as is).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

/// A URL that may carry a password (a JobDB's, a server's): `Debug` and `Display` show it
/// without the password; [`SecretUrl::expose`] gives the whole text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        SecretUrl(url.into())
    }

    /// The URL with its password, to connect with.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl FromStr for SecretUrl {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(SecretUrl(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let token = Secret::new("hunter2");
        assert_eq!(format!("{token:?}"), "Secret(***)");
        assert_eq!(token.expose(), "hunter2");
        let url = SecretUrl::new("mysql://app:hunter2@db:3306/jobdb_1");
        assert!(!format!("{url:?} {url}").contains("hunter2"));
        assert_eq!(url.to_string(), "mysql://app:***@db:3306/jobdb_1");
        assert_eq!(redact_url("sqlite:///data/j1"), "sqlite:///data/j1");
    }
}
