//! Who a caller is: a [`Role`] (what it may do) and a name (which one of that role it is).
//!
//! Roles are fixed and few, as in Kubernetes' node authorizer: replicas speak Raft (`peer`),
//! workers run tasks (`worker`), trainers read (`client`), operators change the quorum (`admin`).
//! `admin` may do everything a client or worker may; `peer` is kept to the Raft listener, so a
//! replica's credential does not let anyone register datasets or act as a worker.

use std::fmt;
use std::str::FromStr;

/// What a caller may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Another replica of the dispatcher quorum: Raft RPCs on the peer listener only.
    Peer,
    /// A worker: registers itself, reports and leases splits for its own tasks.
    Worker,
    /// A trainer's client: registers datasets, reads elements, reads status.
    Client,
    /// An operator: everything a client or worker may, and adding or removing replicas.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Peer, Role::Worker, Role::Client, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Peer => "peer",
            Role::Worker => "worker",
            Role::Client => "client",
            Role::Admin => "admin",
        }
    }

    /// Whether a caller of this role may call an RPC open to `allowed`. Admin passes every check
    /// but the peer one: Raft is for replicas alone.
    pub fn may(self, allowed: &[Role]) -> bool {
        allowed.contains(&self)
            || (self == Role::Admin && !allowed.iter().all(|r| *r == Role::Peer))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == text)
            .ok_or_else(|| {
                format!("unknown role '{text}': expected one of peer, worker, client, admin")
            })
    }
}

/// What a caller expects at the other end of a connection, checked against the server's
/// certificate before any credential is sent: a dispatcher replica presents a certificate of the
/// `peer` role (`sluice certs`' `dispatcher.pem`), a worker one of the `worker` role. A worker's
/// certificate at a dispatcher's address would otherwise receive the readers' client tokens and
/// `sluice admin`'s admin token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerRole {
    /// A dispatcher replica: its client API or its Raft peer listener.
    Dispatcher,
    /// A worker's port (gRPC and the raw fetch stream).
    Worker,
}

impl ServerRole {
    /// The role the server's certificate must carry (its organization, O).
    pub fn cert_role(self) -> Role {
        match self {
            ServerRole::Dispatcher => Role::Peer,
            ServerRole::Worker => Role::Worker,
        }
    }
}

impl fmt::Display for ServerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerRole::Dispatcher => "dispatcher",
            ServerRole::Worker => "worker",
        })
    }
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub role: Role,
    /// The token's name or the certificate's common name. Two workers with the same name are
    /// the same worker to the dispatcher's ownership checks.
    pub name: String,
    /// Holds every role: the caller of a server without authentication, or the holder of a
    /// cluster's one shared token.
    pub every_role: bool,
}

impl Identity {
    pub fn new(role: Role, name: impl Into<String>) -> Identity {
        Identity {
            role,
            name: name.into(),
            every_role: false,
        }
    }

    /// Every caller of a server that runs without authentication (loopback or `--insecure`).
    pub fn anonymous() -> Identity {
        Identity {
            role: Role::Admin,
            name: String::new(),
            every_role: true,
        }
    }

    /// The holder of a cluster's single shared token: every role, one name.
    pub fn shared(name: impl Into<String>) -> Identity {
        Identity {
            role: Role::Admin,
            name: name.into(),
            every_role: true,
        }
    }

    /// Whether this caller may call an RPC open to `allowed`.
    pub fn may(&self, allowed: &[Role]) -> bool {
        self.every_role || self.role.may(allowed)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.every_role && self.name.is_empty() {
            f.write_str("anonymous")
        } else if self.every_role {
            write!(f, "shared-token holder '{}'", self.name)
        } else if self.name.is_empty() {
            write!(f, "{}", self.role)
        } else {
            write!(f, "{} '{}'", self.role, self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_may_table() {
        use Role::*;
        let cases: &[(Role, &[Role], bool)] = &[
            (Client, &[Client], true),
            (Client, &[Worker], false),
            (Client, &[Admin], false),
            (Worker, &[Worker], true),
            (Worker, &[Client], false),
            (Admin, &[Client], true),
            (Admin, &[Worker], true),
            (Admin, &[Admin], true),
            (Admin, &[Peer], false),
            (Peer, &[Peer], true),
            (Peer, &[Client], false),
            (Peer, &[Client, Worker, Peer], true),
        ];
        for (role, allowed, want) in cases {
            assert_eq!(role.may(allowed), *want, "{role} may {allowed:?}");
        }
    }

    #[test]
    fn role_parse_table() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert_eq!(
            "root".parse::<Role>(),
            Err("unknown role 'root': expected one of peer, worker, client, admin".into())
        );
    }
}
