//! Caller side: what a client, worker, replica or CLI command presents to the servers it calls.
//!
//! One [`ClientSecurity`] per process role: the CA that servers' certificates are verified
//! against (TLS is on exactly when a CA is given), an optional client certificate (mutual TLS),
//! and an optional bearer token. The same settings make gRPC channels ([`ClientSecurity::endpoint`]
//! and the [`TokenInterceptor`] every stub goes through) and raw fetch connections
//! ([`ClientSecurity::connect_raw`]), so the two transports can never disagree.

use crate::connect_failure::Refusals;
use crate::grpc_connector::GrpcConnector;
use crate::role::{Role, ServerRole};
use crate::security_error::SecurityError;
use crate::tls::{ClientTls, KeyPairFiles, RAW_ALPN};
use crate::token_file::{Token, TokenFile};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::BufReader;
use tokio::net::TcpStream;
use tokio_util::either::Either;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

/// Environment variables a caller reads when no flag is given (the Python package and tools
/// that keep tf.data's API use these).
pub const TLS_CA_ENV: &str = "SLUICE_TLS_CA";
pub const TLS_CERT_ENV: &str = "SLUICE_TLS_CERT";
pub const TLS_KEY_ENV: &str = "SLUICE_TLS_KEY";
pub const TOKEN_FILE_ENV: &str = "SLUICE_AUTH_TOKEN_FILE";

/// The ALPN protocol of gRPC.
const H2_ALPN: &[u8] = b"h2";

/// Bytes read from the socket at once under a raw stream's TLS. rustls asks for 4 KiB at a time;
/// at gigabytes a second, a system call per 4 KiB costs more than the decryption.
const RAW_TLS_READ_BUFFER: usize = 256 << 10;

/// The flags of a caller: `--tls-ca`, `--tls-cert`, `--tls-key`, `--auth-token-file`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientSecurityFiles {
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
}

impl ClientSecurityFiles {
    /// Fills what was not given from `SLUICE_TLS_CA`, `SLUICE_TLS_CERT`, `SLUICE_TLS_KEY` and
    /// `SLUICE_AUTH_TOKEN_FILE` (`SLUICE_AUTH_TOKEN` is read when the token is loaded).
    pub fn or_env(mut self) -> ClientSecurityFiles {
        let env = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        self.tls_ca = self.tls_ca.or_else(|| env(TLS_CA_ENV));
        self.tls_cert = self.tls_cert.or_else(|| env(TLS_CERT_ENV));
        self.tls_key = self.tls_key.or_else(|| env(TLS_KEY_ENV));
        self.token_file = self.token_file.or_else(|| env(TOKEN_FILE_ENV));
        self
    }
}

/// What a caller presents. `Default` is plain TCP without a token.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    tls: Option<Arc<ClientTls>>,
    raw_tls: Option<tokio_rustls::TlsConnector>,
    /// gRPC over TLS to a dispatcher and to a worker: each checks the server's role.
    dispatcher_tls: Option<tokio_rustls::TlsConnector>,
    worker_tls: Option<tokio_rustls::TlsConnector>,
    token: Option<Token>,
    /// Why connections to a server fail, when no retry can cure it (shared by clones).
    refusals: Arc<Refusals>,
}

impl ClientSecurity {
    pub fn new(
        tls: Option<ClientTls>,
        token: Option<Token>,
    ) -> Result<ClientSecurity, SecurityError> {
        let connector = |server: ServerRole, alpn: &[u8]| {
            tls.as_ref()
                .map(|tls| {
                    tls.rustls_config(server, alpn)
                        .map(|c| tokio_rustls::TlsConnector::from(Arc::new(c)))
                })
                .transpose()
        };
        Ok(ClientSecurity {
            raw_tls: connector(ServerRole::Worker, RAW_ALPN)?,
            dispatcher_tls: connector(ServerRole::Dispatcher, H2_ALPN)?,
            worker_tls: connector(ServerRole::Worker, H2_ALPN)?,
            tls: tls.map(Arc::new),
            token,
            refusals: Arc::default(),
        })
    }

    /// Loads a caller's files, presenting the token of `role` from the token file (or
    /// `SLUICE_AUTH_TOKEN`).
    pub fn load(files: &ClientSecurityFiles, role: Role) -> Result<ClientSecurity, SecurityError> {
        let identity = match (&files.tls_cert, &files.tls_key) {
            (Some(cert), Some(key)) => Some(KeyPairFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            _ => {
                return Err(SecurityError::Tls(
                    "--tls-cert and --tls-key go together".into(),
                ))
            }
        };
        let tls = match (&files.tls_ca, identity) {
            (Some(ca), identity) => Some(ClientTls::load(ca, identity.as_ref())?),
            (None, Some(_)) => {
                return Err(SecurityError::Tls(
                    "a client certificate needs --tls-ca, to verify the server's".into(),
                ))
            }
            (None, None) => None,
        };
        let tokens = TokenFile::from_flag_or_env(files.token_file.as_deref())?;
        let token = match tokens {
            None => None,
            Some(tokens) => Some(tokens.token_for(role).cloned().ok_or_else(|| {
                SecurityError::Tokens(format!(
                    "{}: no token for the {role} role",
                    files
                        .token_file
                        .as_deref()
                        .map_or(String::new(), |p| p.display().to_string())
                ))
            })?),
        };
        ClientSecurity::new(tls, token)
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub fn token(&self) -> Option<&Token> {
        self.token.as_ref()
    }

    /// A gRPC endpoint for `addr` (`host:port`), to be connected by
    /// [`ClientSecurity::connect_lazy`] or [`ClientSecurity::connect`], which do the TLS.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, SecurityError> {
        Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| SecurityError::Tls(format!("invalid address '{addr}': {e}")))
    }

    /// The connector of channels to a server of role `server`: TLS when TLS is on, the server's
    /// certificate verified against the CA and required to carry that role before anything is
    /// sent; a connection that cannot succeed as configured is recorded in
    /// [`ClientSecurity::refusal`].
    fn connector(&self, server: ServerRole) -> GrpcConnector {
        GrpcConnector {
            tls: match server {
                ServerRole::Dispatcher => self.dispatcher_tls.clone(),
                ServerRole::Worker => self.worker_tls.clone(),
            },
            refusals: self.refusals.clone(),
        }
    }

    /// A channel over `endpoint` (made by [`ClientSecurity::endpoint`]) to a server of role
    /// `server`, connected on first use.
    pub fn connect_lazy(&self, endpoint: &Endpoint, server: ServerRole) -> Channel {
        endpoint.connect_with_connector_lazy(self.connector(server))
    }

    /// A channel over `endpoint` to a server of role `server`, connected now.
    pub async fn connect(
        &self,
        endpoint: &Endpoint,
        server: ServerRole,
    ) -> Result<Channel, tonic::transport::Error> {
        endpoint
            .connect_with_connector(self.connector(server))
            .await
    }

    /// Why this caller's connections to `addr` fail, if they do for a reason no retry cures:
    /// TLS on one side only, a certificate refused either way, a server of the wrong role.
    /// A call that failed on `addr` asks, since a connection's own failure does not reach it.
    pub fn refusal(&self, addr: &str) -> Option<String> {
        self.refusals.of(addr)
    }

    /// Adds this caller's token to every request of a stub.
    pub fn interceptor(&self) -> TokenInterceptor {
        TokenInterceptor(self.token.as_ref().map(|t| {
            format!("Bearer {}", t.expose())
                .parse()
                .expect("a token is visible ASCII, checked when it was read")
        }))
    }

    /// A channel with this caller's token on every request.
    pub fn authed(&self, channel: Channel) -> AuthChannel {
        InterceptedService::new(channel, self.interceptor())
    }

    /// Opens a raw fetch connection to the worker at `addr` (`host:port`), in TLS when TLS is
    /// on (the worker's certificate must carry the worker role).
    pub async fn connect_raw(&self, addr: &str) -> io::Result<RawStream> {
        let socket = TcpStream::connect(addr).await?;
        socket.set_nodelay(true)?;
        let Some(connector) = &self.raw_tls else {
            return Ok(Either::Left(socket));
        };
        let host = addr
            .rsplit_once(':')
            .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
            .unwrap_or(addr);
        let name = rustls_pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("server name '{host}': {e}"),
            )
        })?;
        let socket = BufReader::with_capacity(RAW_TLS_READ_BUFFER, socket);
        let stream = connector.connect(name, socket).await?;
        Ok(Either::Right(Box::new(stream)))
    }
}

impl std::fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("tls", &self.tls.is_some())
            .field("token", &self.token)
            .finish()
    }
}

/// A gRPC channel whose requests carry the caller's token.
pub type AuthChannel = InterceptedService<Channel, TokenInterceptor>;

/// Puts `authorization: Bearer <token>` on every request, when the caller has a token.
#[derive(Clone, Debug)]
pub struct TokenInterceptor(Option<MetadataValue<Ascii>>);

impl Interceptor for TokenInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert(crate::authenticator::AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

/// A caller's raw fetch connection, in TLS or not. A TLS stream reads the socket through a
/// buffer of its own (see `RAW_TLS_READ_BUFFER`).
pub type RawStream = Either<TcpStream, Box<tokio_rustls::client::TlsStream<BufReader<TcpStream>>>>;
