//! Security for every Sluice listener and caller: TLS (rustls), bearer tokens and client
//! certificates mapped to roles, and the rule that keeps an unprotected server on loopback.
//!
//! - Servers: [`ServerSecurity`] (from `--tls-cert`, `--tls-key`, `--tls-ca`,
//!   `--auth-token-file`, `--insecure`) gives each listener its rustls configuration and
//!   [`incoming`] connections, and its services an [`Authenticator`] whose interceptor leaves
//!   the caller's [`Identity`] in each request for [`authorize`].
//! - Callers: [`ClientSecurity`] makes gRPC endpoints and raw fetch connections with the same
//!   CA, client certificate and token, and checks that a server's certificate carries the role
//!   of the server it calls ([`ServerRole`]) before sending anything; [`permanent_failure`]
//!   tells a connection that cannot succeed as configured from one that may pass.
//! - Readers' admissions: the dispatcher signs an [`Admission`] to an iteration with the
//!   cluster's [`FetchKey`], and a worker serves a task only to a reader presenting one.
//! - `sluice certs`: [`certs::generate`].

pub mod authenticator;
pub mod cert_identity;
pub mod certs;
pub mod client_security;
pub mod connect_failure;
pub mod fetch_admission;
pub mod grpc_connector;
pub mod incoming;
pub mod role;
pub mod security_error;
pub mod server_role_verifier;
pub mod server_security;
pub mod tls;
pub mod token_file;

pub use authenticator::{authorize, AuthFailure, AuthInterceptor, Authenticator};
pub use client_security::{
    AuthChannel, ClientSecurity, ClientSecurityFiles, RawStream, TokenInterceptor,
};
pub use connect_failure::{permanent_failure, Misconfigured, Refusals};
pub use fetch_admission::{Admission, AdmissionRefusal, FetchKey};
pub use incoming::{incoming, ConnInfo, SecureStream};
pub use role::{Identity, Role, ServerRole};
pub use security_error::SecurityError;
pub use server_security::{ServerSecurity, ServerSecurityFiles};
pub use tls::{ClientCerts, ClientTls, KeyPairFiles, ServerTlsFiles, RAW_ALPN};
pub use token_file::{Token, TokenFile};
