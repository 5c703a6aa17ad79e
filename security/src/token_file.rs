//! Bearer tokens: the file a process reads its credentials from, and the table a server checks
//! callers' tokens against.
//!
//! ```text
//! # role   name      token
//! admin    ops       4f7c0e...
//! client   trainers  b21d9a...
//! worker   worker-1  9c33e1...
//! peer     replicas  71aa0f...
//! ```
//!
//! A caller presents the token of the role it acts as (a worker its `worker` line, `sluice read`
//! its `client` line, `sluice admin` its `admin` line). A server accepts every line, each as its
//! role and name. A file may instead hold one bare token (or `SLUICE_AUTH_TOKEN` may): the
//! form a trainer is handed, and, on a server, a cluster run on one shared secret whose holders
//! may do everything.
//!
//! Tokens are compared in constant time, never logged, and must be at least
//! [`MIN_TOKEN_CHARS`] visible ASCII characters, so a guessable or header-breaking token is
//! refused when the file is read rather than at the first call.

use crate::role::{Identity, Role};
use crate::security_error::SecurityError;
use std::fmt;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Shortest token accepted: 16 characters of a random hex or base64 string are ≥ 64 bits.
pub const MIN_TOKEN_CHARS: usize = 16;
/// The environment variable a caller's bare token may come from.
pub const TOKEN_ENV: &str = "SLUICE_AUTH_TOKEN";
/// The name given to the holder of a bare (shared) token on a server.
pub const SHARED_TOKEN_NAME: &str = "shared";

/// A secret that never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(text: &str, source: &str) -> Result<Token, SecurityError> {
        if text.chars().count() < MIN_TOKEN_CHARS {
            return Err(SecurityError::Tokens(format!(
                "{source}: a token must be at least {MIN_TOKEN_CHARS} characters"
            )));
        }
        if !text.chars().all(|c| c.is_ascii_graphic()) {
            return Err(SecurityError::Tokens(format!(
                "{source}: a token may only hold visible ASCII characters"
            )));
        }
        Ok(Token(text.to_string()))
    }

    /// The secret itself, for an `authorization` header or a raw stream handshake.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time equality with a presented token.
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }

    /// A new random token (hex, 256 bits), as `sluice certs` writes them.
    pub fn random() -> Token {
        let bytes: [u8; 32] = rand::random();
        Token(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// One line of a token file.
#[derive(Clone, Debug)]
pub struct TokenEntry {
    pub identity: Identity,
    pub token: Token,
}

/// The tokens of one file (or of `SLUICE_AUTH_TOKEN`).
#[derive(Clone, Debug)]
pub enum TokenFile {
    /// One token for everything.
    Shared(Token),
    /// Tokens with roles and names.
    Entries(Vec<TokenEntry>),
}

impl TokenFile {
    /// Reads a token file.
    pub fn load(path: &Path) -> Result<TokenFile, SecurityError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            SecurityError::Tokens(format!("cannot read token file {}: {e}", path.display()))
        })?;
        TokenFile::parse(&text, &path.display().to_string())
    }

    /// The file at `path` if given, else `SLUICE_AUTH_TOKEN` if set, else none.
    pub fn from_flag_or_env(path: Option<&Path>) -> Result<Option<TokenFile>, SecurityError> {
        if let Some(path) = path {
            return TokenFile::load(path).map(Some);
        }
        match std::env::var(TOKEN_ENV) {
            Ok(text) if !text.trim().is_empty() => {
                Token::new(text.trim(), TOKEN_ENV).map(|t| Some(TokenFile::Shared(t)))
            }
            _ => Ok(None),
        }
    }

    /// Parses a token file's text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<TokenFile, SecurityError> {
        let mut bare = Vec::new();
        let mut entries: Vec<TokenEntry> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{source} line {}", n + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [token] => bare.push(Token::new(token, &at)?),
                [role, name, token] => {
                    let role: Role = role
                        .parse()
                        .map_err(|e| SecurityError::Tokens(format!("{at}: {e}")))?;
                    let token = Token::new(token, &at)?;
                    if entries.iter().any(|e| e.token == token) {
                        return Err(SecurityError::Tokens(format!(
                            "{at}: this token is already listed: each token names one caller"
                        )));
                    }
                    entries.push(TokenEntry {
                        identity: Identity::new(role, *name),
                        token,
                    });
                }
                _ => {
                    return Err(SecurityError::Tokens(format!(
                        "{at}: expected `ROLE NAME TOKEN` or a single token, got {} fields",
                        fields.len()
                    )))
                }
            }
        }
        match (bare.len(), entries.is_empty()) {
            (0, true) => Err(SecurityError::Tokens(format!(
                "{source}: no token in the file"
            ))),
            (0, false) => Ok(TokenFile::Entries(entries)),
            (1, true) => Ok(TokenFile::Shared(bare.remove(0))),
            _ => Err(SecurityError::Tokens(format!(
                "{source}: a file holds either one bare token or `ROLE NAME TOKEN` lines, not both \
                 or several bare tokens"
            ))),
        }
    }

    /// The token a caller acting as `role` presents: the shared token, or the first line of that
    /// role (an admin line serves a client or worker that has no line of its own).
    pub fn token_for(&self, role: Role) -> Option<&Token> {
        match self {
            TokenFile::Shared(token) => Some(token),
            TokenFile::Entries(entries) => entries
                .iter()
                .find(|e| e.identity.role == role)
                .or_else(|| {
                    (role != Role::Peer)
                        .then(|| entries.iter().find(|e| e.identity.role == Role::Admin))
                        .flatten()
                })
                .map(|e| &e.token),
        }
    }

    /// Who presented `token`, if anyone listed here.
    pub fn identify(&self, presented: &[u8]) -> Option<Identity> {
        match self {
            TokenFile::Shared(token) => token
                .matches(presented)
                .then(|| Identity::shared(SHARED_TOKEN_NAME)),
            TokenFile::Entries(entries) => {
                // Every entry is compared, so the time taken does not say which one matched.
                let mut found = None;
                for entry in entries {
                    if entry.token.matches(presented) && found.is_none() {
                        found = Some(entry.identity.clone());
                    }
                }
                found
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbb";

    #[test]
    fn parse_table() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (A, Ok("shared")),
            ("# c\n\n  aaaaaaaaaaaaaaaa  \n", Ok("shared")),
            ("client trainers aaaaaaaaaaaaaaaa", Ok("entries 1")),
            (
                "admin ops aaaaaaaaaaaaaaaa\nworker w1 bbbbbbbbbbbbbbbb",
                Ok("entries 2"),
            ),
            ("", Err("f: no token in the file")),
            ("short", Err("f line 1: a token must be at least 16 characters")),
            (
                "root x aaaaaaaaaaaaaaaa",
                Err("f line 1: unknown role 'root': expected one of peer, worker, client, admin"),
            ),
            (
                "client a aaaaaaaaaaaaaaaa\nworker b aaaaaaaaaaaaaaaa",
                Err("f line 2: this token is already listed: each token names one caller"),
            ),
            (
                "client a",
                Err("f line 1: expected `ROLE NAME TOKEN` or a single token, got 2 fields"),
            ),
            (
                "aaaaaaaaaaaaaaaa\nclient a bbbbbbbbbbbbbbbb",
                Err("f: a file holds either one bare token or `ROLE NAME TOKEN` lines, not both or several bare tokens"),
            ),
            (
                "aaaaaaaa\u{e9}aaaaaaaaaa",
                Err("f line 1: a token may only hold visible ASCII characters"),
            ),
        ];
        for (text, want) in cases {
            let got = TokenFile::parse(text, "f").map(|f| match f {
                TokenFile::Shared(_) => "shared".to_string(),
                TokenFile::Entries(e) => format!("entries {}", e.len()),
            });
            let got = got.map_err(|e| e.to_string());
            assert_eq!(
                got,
                want.map(str::to_string).map_err(str::to_string),
                "{text:?}"
            );
        }
    }

    #[test]
    fn identify_and_present() {
        let file = TokenFile::parse(&format!("admin ops {A}\nworker w1 {B}"), "f").unwrap();
        assert_eq!(
            file.identify(A.as_bytes()),
            Some(Identity::new(Role::Admin, "ops"))
        );
        assert_eq!(
            file.identify(B.as_bytes()),
            Some(Identity::new(Role::Worker, "w1"))
        );
        assert_eq!(file.identify(b"cccccccccccccccc"), None);
        assert_eq!(file.identify(b""), None);
        assert_eq!(file.token_for(Role::Worker).map(Token::expose), Some(B));
        // A client with no line of its own presents the admin token; a peer never does.
        assert_eq!(file.token_for(Role::Client).map(Token::expose), Some(A));
        assert_eq!(file.token_for(Role::Peer), None);

        let shared = TokenFile::parse(A, "f").unwrap();
        assert_eq!(
            shared.identify(A.as_bytes()),
            Some(Identity::shared("shared"))
        );
        assert_eq!(shared.token_for(Role::Peer).map(Token::expose), Some(A));
    }

    #[test]
    fn a_token_never_shows_in_debug_output() {
        let file = TokenFile::parse(&format!("admin ops {A}"), "f").unwrap();
        assert!(!format!("{file:?}").contains(A));
    }
}
