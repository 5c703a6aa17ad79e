//! Server side: who a caller is (`Authenticator`), and whether it may make a call (`authorize`).
//!
//! Authentication happens once per request, in a tonic interceptor in front of every service: a
//! bearer token (`authorization: Bearer ...`) is looked up in the server's token file; without
//! one, a verified client certificate's identity counts. A caller with neither, or with a token
//! the server does not know, is `Unauthenticated` before any handler runs. Authorization is the
//! first line of each handler (`authorize(&request, "AddNode", &[Role::Admin])`): the handler
//! knows the RPC, the interceptor does not. Every refusal is logged with the caller's address;
//! nothing is applied.

use crate::incoming::ConnInfo;
use crate::role::{Identity, Role};
use crate::token_file::TokenFile;
use std::sync::Arc;
use tonic::service::Interceptor;
use tonic::{Request, Status};
use tracing::warn;

/// The metadata key a token travels in.
pub const AUTHORIZATION: &str = "authorization";

/// Checks callers' credentials. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tokens: Option<TokenFile>,
    /// Whether verified client certificates authenticate (the server has a CA).
    certs: bool,
}

/// Why a caller was not authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    UnknownToken,
    Malformed,
}

impl AuthFailure {
    pub fn message(&self) -> &'static str {
        match self {
            AuthFailure::Missing => {
                "no credentials: this server needs a token (--auth-token-file or \
                 SLUICE_AUTH_TOKEN) or a client certificate"
            }
            AuthFailure::UnknownToken => "the token presented is not valid on this server",
            AuthFailure::Malformed => "the authorization header must be `Bearer <token>`",
        }
    }
}

impl Authenticator {
    /// No authentication: every caller is [`Identity::anonymous`].
    pub fn open() -> Authenticator {
        Authenticator::new(None, false)
    }

    pub fn new(tokens: Option<TokenFile>, certs: bool) -> Authenticator {
        Authenticator {
            inner: Arc::new(Inner { tokens, certs }),
        }
    }

    /// Whether this server checks credentials at all.
    pub fn is_enabled(&self) -> bool {
        self.inner.tokens.is_some() || self.inner.certs
    }

    /// Who presented `token` (the secret itself, without `Bearer `) on a connection.
    pub fn authenticate(
        &self,
        token: Option<&[u8]>,
        conn: Option<&ConnInfo>,
    ) -> Result<Identity, AuthFailure> {
        if !self.is_enabled() {
            return Ok(Identity::anonymous());
        }
        if let Some(token) = token {
            return self
                .inner
                .tokens
                .as_ref()
                .and_then(|tokens| tokens.identify(token))
                .ok_or(AuthFailure::UnknownToken);
        }
        if self.inner.certs {
            if let Some(identity) = conn.and_then(|c| c.cert_identity.clone()) {
                return Ok(identity);
            }
        }
        Err(AuthFailure::Missing)
    }

    /// Authenticates a gRPC request from its metadata and connection; logs a refusal.
    pub fn authenticate_request<T>(&self, request: &Request<T>) -> Result<Identity, Status> {
        let conn = request.extensions().get::<ConnInfo>();
        let token = match request.metadata().get(AUTHORIZATION) {
            None => Ok(None),
            Some(value) => value
                .as_bytes()
                .strip_prefix(b"Bearer ")
                .map(Some)
                .ok_or(AuthFailure::Malformed),
        };
        match token.and_then(|token| self.authenticate(token, conn)) {
            Ok(identity) => Ok(identity),
            Err(failure) => {
                let remote = conn.and_then(|c| c.remote);
                warn!(
                    ?remote,
                    reason = failure.message(),
                    "refused an unauthenticated call"
                );
                Err(Status::unauthenticated(failure.message()))
            }
        }
    }

    /// The interceptor that authenticates every request of a service and leaves the caller's
    /// [`Identity`] in its extensions for [`authorize`].
    pub fn interceptor(&self) -> AuthInterceptor {
        AuthInterceptor(self.clone())
    }
}

/// See [`Authenticator::interceptor`].
#[derive(Clone, Debug)]
pub struct AuthInterceptor(Authenticator);

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let identity = self.0.authenticate_request(&request)?;
        request.extensions_mut().insert(identity);
        Ok(request)
    }
}

/// The caller of `request` if it may call `rpc`, open to `allowed`; else `PermissionDenied`
/// (logged). A request that did not pass an [`AuthInterceptor`] is refused.
pub fn authorize<T>(request: &Request<T>, rpc: &str, allowed: &[Role]) -> Result<Identity, Status> {
    let Some(identity) = request.extensions().get::<Identity>() else {
        return Err(Status::unauthenticated(format!(
            "{rpc}: the caller was not authenticated"
        )));
    };
    if identity.may(allowed) {
        return Ok(identity.clone());
    }
    let remote = request
        .extensions()
        .get::<ConnInfo>()
        .and_then(|c| c.remote);
    warn!(?remote, caller = %identity, rpc, "refused a call the caller's role does not allow");
    let roles: Vec<&str> = allowed.iter().map(|r| r.as_str()).collect();
    Err(Status::permission_denied(format!(
        "{identity} may not call {rpc}: it needs the {} role",
        roles.join(" or ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name, the server's authenticator, the request, and the identity (or code) expected.
    type AuthCase = (
        &'static str,
        Authenticator,
        Request<()>,
        Result<Identity, tonic::Code>,
    );
    /// A request, the roles an RPC is open to, and the refusal expected.
    type AuthzCase = (Request<()>, &'static [Role], Result<(), &'static str>);

    const ADMIN: &str = "admin-token-000000";
    const CLIENT: &str = "client-token-00000";

    fn tokens() -> TokenFile {
        TokenFile::parse(&format!("admin ops {ADMIN}\nclient trainers {CLIENT}"), "t").unwrap()
    }

    fn request(token: Option<&str>, cert: Option<Identity>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, token.parse().unwrap());
        }
        request.extensions_mut().insert(ConnInfo {
            cert_identity: cert,
            ..ConnInfo::default()
        });
        request
    }

    #[test]
    fn authentication_table() {
        let worker_cert = Identity::new(Role::Worker, "w1");
        let bearer = |t: &str| format!("Bearer {t}");
        let cases: Vec<AuthCase> = vec![
            (
                "open server",
                Authenticator::open(),
                request(None, None),
                Ok(Identity::anonymous()),
            ),
            (
                "good token",
                Authenticator::new(Some(tokens()), false),
                request(Some(&bearer(CLIENT)), None),
                Ok(Identity::new(Role::Client, "trainers")),
            ),
            (
                "wrong token",
                Authenticator::new(Some(tokens()), true),
                request(
                    Some(&bearer("not-a-token-00000")),
                    Some(worker_cert.clone()),
                ),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                "no Bearer prefix",
                Authenticator::new(Some(tokens()), false),
                request(Some(CLIENT), None),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                "nothing presented",
                Authenticator::new(Some(tokens()), true),
                request(None, None),
                Err(tonic::Code::Unauthenticated),
            ),
            (
                "certificate",
                Authenticator::new(Some(tokens()), true),
                request(None, Some(worker_cert.clone())),
                Ok(worker_cert.clone()),
            ),
            (
                "certificate on a server without a CA",
                Authenticator::new(Some(tokens()), false),
                request(None, Some(worker_cert.clone())),
                Err(tonic::Code::Unauthenticated),
            ),
        ];
        for (name, auth, request, want) in cases {
            let got = auth.authenticate_request(&request).map_err(|s| s.code());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn authorization_table() {
        let with = |identity: Identity| {
            let mut r = Request::new(());
            r.extensions_mut().insert(identity);
            r
        };
        let cases: Vec<AuthzCase> = vec![
            (
                with(Identity::new(Role::Client, "c")),
                &[Role::Client],
                Ok(()),
            ),
            (
                with(Identity::new(Role::Client, "c")),
                &[Role::Admin],
                Err("client 'c' may not call Rpc: it needs the admin role"),
            ),
            (
                with(Identity::new(Role::Worker, "w")),
                &[Role::Client, Role::Admin],
                Err("worker 'w' may not call Rpc: it needs the client or admin role"),
            ),
            (
                with(Identity::new(Role::Admin, "a")),
                &[Role::Worker],
                Ok(()),
            ),
            (
                with(Identity::new(Role::Admin, "a")),
                &[Role::Peer],
                Err("admin 'a' may not call Rpc: it needs the peer role"),
            ),
            (with(Identity::shared("shared")), &[Role::Peer], Ok(())),
            (
                Request::new(()),
                &[Role::Client],
                Err("Rpc: the caller was not authenticated"),
            ),
        ];
        for (request, allowed, want) in cases {
            let got = authorize(&request, "Rpc", allowed).map(|_| ());
            let got = got.as_ref().map_err(|s| s.message());
            assert_eq!(got, want.as_ref().map_err(|s| *s), "{allowed:?}");
        }
    }
}
