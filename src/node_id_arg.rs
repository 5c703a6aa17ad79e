//! `sluice dispatcher --id`: a replica's id, given as a number or taken from the host name.
//!
//! A Kubernetes StatefulSet names its pods `NAME-0`, `NAME-1`, ... and sets each pod's host name
//! to its pod name, while every pod runs the same arguments from one template and a minimal image
//! has no shell to compute anything. `--id from-hostname` turns the ordinal into the id: the
//! trailing `-N` of the host name's first label, plus one (ids start at 1, ordinals at 0). A host
//! name without such a suffix is refused, naming it: a replica must never guess its identity.

use std::str::FromStr;

/// The `--id` argument before it is resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeIdArg {
    /// `--id N`.
    Fixed(u64),
    /// `--id from-hostname`: the host name's trailing ordinal plus one.
    FromHostname,
}

/// The spelling of [`NodeIdArg::FromHostname`] on the command line.
pub const FROM_HOSTNAME: &str = "from-hostname";

impl FromStr for NodeIdArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == FROM_HOSTNAME {
            return Ok(NodeIdArg::FromHostname);
        }
        text.parse::<u64>()
            .map(NodeIdArg::Fixed)
            .map_err(|_| format!("{text}: expected a node id (1, 2, ...) or `{FROM_HOSTNAME}`"))
    }
}

impl NodeIdArg {
    /// The id, reading this machine's host name for `from-hostname`.
    pub fn resolve(self) -> anyhow::Result<u64> {
        match self {
            NodeIdArg::Fixed(id) => Ok(id),
            NodeIdArg::FromHostname => {
                let hostname = hostname()?;
                id_from_hostname(&hostname).map_err(anyhow::Error::msg)
            }
        }
    }
}

/// The id a host name stands for: its first label's trailing `-N`, plus one.
pub fn id_from_hostname(hostname: &str) -> Result<u64, String> {
    let label = hostname.split('.').next().unwrap_or_default();
    let ordinal = label
        .rsplit_once('-')
        .map(|(_, ordinal)| ordinal)
        .filter(|ordinal| !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            format!(
                "--id {FROM_HOSTNAME}: host name {hostname:?} does not end in `-N` (a \
                 StatefulSet ordinal); pass --id N instead"
            )
        })?;
    ordinal
        .parse::<u64>()
        .ok()
        .and_then(|ordinal| ordinal.checked_add(1))
        .ok_or_else(|| {
            format!("--id {FROM_HOSTNAME}: ordinal {ordinal} of {hostname:?} is too large")
        })
}

/// This machine's host name (`gethostname(2)`).
fn hostname() -> anyhow::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for writes of its length; gethostname writes at most that
    // many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(anyhow::Error::new(std::io::Error::last_os_error())
            .context(format!("--id {FROM_HOSTNAME}: read the host name")));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec())
        .map_err(|_| anyhow::anyhow!("--id {FROM_HOSTNAME}: the host name is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statefulset_ordinal_becomes_the_id_plus_one() {
        let cases = [
            ("sluice-dispatcher-0", Ok(1)),
            ("sluice-dispatcher-2", Ok(3)),
            ("sluice-dispatcher-12", Ok(13)),
            ("sluice-dispatcher-1.sluice-dispatcher-peers.ns.svc", Ok(2)),
            ("dispatcher", Err("does not end in `-N`")),
            ("dispatcher-", Err("does not end in `-N`")),
            ("dispatcher-2a", Err("does not end in `-N`")),
            ("dispatcher-+2", Err("does not end in `-N`")),
            ("", Err("does not end in `-N`")),
            ("d-18446744073709551615", Err("is too large")),
            ("d-99999999999999999999", Err("is too large")),
        ];
        for (hostname, want) in cases {
            match (id_from_hostname(hostname), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{hostname}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{hostname}: {got}"),
                (got, want) => panic!("{hostname}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_id_argument_is_a_number_or_from_hostname() {
        let cases = [
            ("1", Ok(NodeIdArg::Fixed(1))),
            ("42", Ok(NodeIdArg::Fixed(42))),
            ("from-hostname", Ok(NodeIdArg::FromHostname)),
            ("0", Ok(NodeIdArg::Fixed(0))),
            (
                "-1",
                Err("-1: expected a node id (1, 2, ...) or `from-hostname`"),
            ),
            (
                "hostname",
                Err("hostname: expected a node id (1, 2, ...) or `from-hostname`"),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                text.parse::<NodeIdArg>(),
                want.map_err(String::from),
                "{text}"
            );
        }
    }

    #[test]
    fn this_machines_host_name_is_readable() {
        assert!(!hostname().expect("host name").is_empty());
    }
}
