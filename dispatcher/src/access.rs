//! Who may call what on the dispatcher: the role each RPC is open to, and the ownership rule
//! that keeps a worker to its own tasks.
//!
//! Roles come from `sluice_security` (authenticated by the interceptor in front of the
//! service). Ownership: a worker registers under the name it authenticated as; afterwards its
//! address, its tasks and their splits may be acted on only by a caller of that name (or an
//! admin, or, on a cluster without per-caller identities, anyone: every caller there has the
//! same name). The check reads the applied state on the leader; a task's worker never changes,
//! and a task id is never reused, so nothing can slip in between the check and the write.

use crate::error::DispatcherError;
use crate::state::{DispatcherState, Rejection};
use sluice_security::cert_identity::names_host;
use sluice_security::{ConnInfo, Identity, Role};
use sluice_types::TaskId;

/// Trainers' RPCs: datasets, jobs, iterations, client heartbeats.
pub(crate) const CLIENT: &[Role] = &[Role::Client];
/// Workers' RPCs: heartbeats, task updates, split leases.
pub(crate) const WORKER: &[Role] = &[Role::Worker];
/// Reads either may make: a dataset's definition, the cluster status.
pub(crate) const READER: &[Role] = &[Role::Client, Role::Worker];
/// Membership changes.
pub(crate) const ADMIN: &[Role] = &[Role::Admin];

/// The owner name a worker registers under.
pub(crate) fn owner_of(caller: &Identity) -> String {
    caller.name.clone()
}

fn acts_for(caller: &Identity, owner: &str) -> bool {
    caller.every_role || caller.role == Role::Admin || caller.name == owner
}

fn denied(caller: &Identity, what: String) -> DispatcherError {
    tracing::warn!(%caller, "refused: {what}");
    DispatcherError::Rejected(Rejection::PermissionDenied(format!(
        "{caller} may not act for {what}"
    )))
}

/// `caller` may act for the worker at `address`: an address never registered is anyone's; one
/// registered, or whose worker was removed, is its owner's (see `DispatcherState::address_owner`).
pub(crate) fn check_worker(
    state: &DispatcherState,
    caller: &Identity,
    address: &str,
) -> Result<(), DispatcherError> {
    match state.address_owner(address) {
        Some(owner) if !acts_for(caller, owner) => Err(denied(
            caller,
            format!("worker {address}, registered by '{owner}'"),
        )),
        _ => Ok(()),
    }
}

/// The hosts a worker's verified certificate names, when the connection presented one of the
/// worker role that names any: the addresses that worker may register at are known.
pub(crate) fn worker_cert_hosts(conn: Option<&ConnInfo>) -> Option<Vec<String>> {
    let conn = conn?;
    let worker = conn
        .cert_identity
        .as_ref()
        .is_some_and(|identity| identity.role == Role::Worker);
    (worker && !conn.cert_hosts.is_empty()).then(|| conn.cert_hosts.clone())
}

/// A worker whose certificate names the hosts it serves at (`hosts`) may register only at an
/// address on one of them: the one readers will verify its certificate against. Checked
/// before anything is recorded, so an address outside them is never registered.
pub(crate) fn check_named_address(
    caller: &Identity,
    address: &str,
    hosts: Option<&[String]>,
) -> Result<(), DispatcherError> {
    let Some(hosts) = hosts else {
        return Ok(());
    };
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    if names_host(hosts, host) {
        return Ok(());
    }
    Err(denied(
        caller,
        format!(
            "worker {address}: its certificate names the hosts {}, not {host}",
            hosts.join(", ")
        ),
    ))
}

/// `caller` may act for the worker holding task `id` (an unknown task is left to the state
/// machine's own answer).
pub(crate) fn check_task(
    state: &DispatcherState,
    caller: &Identity,
    id: TaskId,
) -> Result<(), DispatcherError> {
    match state.task(id) {
        Some(task) => {
            let owner = state.worker(&task.worker).map(|w| w.owner.as_str());
            match owner {
                Some(owner) if !acts_for(caller, owner) => Err(denied(
                    caller,
                    format!(
                        "task {id} of worker {}, registered by '{owner}'",
                        task.worker
                    ),
                )),
                _ => Ok(()),
            }
        }
        None => Ok(()),
    }
}

/// `caller` may report `tasks` finished for the worker at `address`: it acts for that worker,
/// and every task is that worker's.
pub(crate) fn check_finish(
    state: &DispatcherState,
    caller: &Identity,
    address: &str,
    tasks: &[TaskId],
) -> Result<(), DispatcherError> {
    check_worker(state, caller, address)?;
    for id in tasks {
        check_task(state, caller, *id)?;
        if let Some(task) = state.task(*id) {
            if task.worker != address {
                return Err(denied(
                    caller,
                    format!(
                        "task {id}: it belongs to worker {}, not {address}",
                        task.worker
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
