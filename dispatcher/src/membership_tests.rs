use super::*;

fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
    ids.iter().copied().collect()
}

#[test]
fn peer_addresses_table() {
    // (address, the refusal's distinctive words, or None if accepted)
    let cases: &[(&str, Option<&str>)] = &[
        ("127.0.0.1:6051", None),
        ("dispatcher-3.example:5060", None),
        ("dispatcher-3.sluice.svc.cluster.local:5060", None),
        ("localhost:1", None),
        ("[::1]:6051", None),
        ("[fe80::1]:65535", None),
        ("", Some("is empty")),
        ("\0junk", Some("holds the control character '\\0'")),
        ("host\n:6051", Some("holds the control character '\\n'")),
        ("host :6051", Some("holds a space")),
        ("127.0.0.1", Some("has no port")),
        ("127.0.0.1:0", Some("has port 0")),
        ("127.0.0.1:65536", Some("has port \"65536\"")),
        ("127.0.0.1:http", Some("has port \"http\"")),
        (":6051", Some("has host \"\"")),
        ("http://host:6051", Some("has host \"http://host\"")),
        ("host/path:6051", Some("has host \"host/path\"")),
        ("a..b:6051", Some("has host \"a..b\"")),
        ("[::g]:6051", Some("has host [::g], not an IPv6 address")),
        ("::1:6051", Some("has host \"::1\"")),
    ];
    for (addr, want) in cases {
        let got = check_peer_addr(addr);
        match (want, got) {
            (None, Ok(())) => {}
            (Some(words), Err(DispatcherError::InvalidArgument(message))) => {
                assert!(message.contains(words), "{addr:?}: {message}");
                assert!(
                    message.contains("expected host:port"),
                    "{addr:?}: {message}"
                );
            }
            (want, got) => panic!("{addr:?}: wanted {want:?}, got {got:?}"),
        }
    }
    let long = format!("{}:1", "a.".repeat(200));
    assert!(check_peer_addr(&long).is_err());
}

#[test]
fn node_id_zero_is_refused() {
    assert!(check_node_id(1).is_ok());
    let err = check_node_id(0).unwrap_err().to_string();
    assert_eq!(err, "node id 0 is not valid: replica ids start at 1");
}

#[test]
fn additions_table() {
    let members = Members {
        voters: set(&[1, 2, 3]),
        learners: set(&[4]),
        peer_addrs: BTreeMap::from([
            (1, "h1:1".to_string()),
            (2, "h2:1".to_string()),
            (3, "h3:1".to_string()),
            (4, "h4:1".to_string()),
        ]),
    };
    let cases: &[(NodeId, &str, Option<&str>)] = &[
        (5, "h5:1", None),
        (
            2,
            "h5:1",
            Some("node 2 is already a voter (voters {1, 2, 3})"),
        ),
        (4, "h5:1", Some("node 4 is already a learner")),
        (5, "h3:1", Some("peer address h3:1 is already node 3's")),
    ];
    for (id, addr, want) in cases {
        let got = members.refuse_addition(*id, addr);
        match (want, &got) {
            (None, None) => {}
            (Some(words), Some(message)) => assert!(message.contains(words), "{message}"),
            _ => panic!("node {id} at {addr}: wanted {want:?}, got {got:?}"),
        }
    }
}

/// (removed, voters, live voters, the refusal's words or None)
type Removal = (
    NodeId,
    &'static [NodeId],
    &'static [NodeId],
    Option<&'static str>,
);

#[test]
fn removals_table() {
    let cases: &[Removal] = &[
        // A dead voter of three: two live remain of two.
        (3, &[1, 2, 3], &[1, 2], None),
        // A live voter while another is dead: {1, 3} with 3 dead is no majority.
        (
            2,
            &[1, 2, 3],
            &[1, 2],
            Some("would leave voters {1, 3}, of which only {1} answer the leader"),
        ),
        (2, &[1, 2, 3], &[1, 2, 3], None),
        (1, &[1, 2], &[1, 2], None),
        (1, &[1], &[1], Some("node 1 is the last voter")),
        // Four voters, two dead: removing a dead one leaves {1, 2, 3} with 2 live, but the
        // old config {1, 2, 3, 4} has only two live of four.
        (
            4,
            &[1, 2, 3, 4],
            &[1, 2],
            Some("of voters {1, 2, 3, 4} only {1, 2} answer the leader"),
        ),
        // Four voters, one dead (the unreachable one an add-node made a voter): removing it.
        (4, &[1, 2, 3, 4], &[1, 2, 3], None),
        (
            3,
            &[1, 2, 3, 4, 5],
            &[1, 2, 3],
            Some("of which only {1, 2} answer"),
        ),
        (5, &[1, 2, 3, 4, 5], &[1, 2, 3], None),
    ];
    for (node, voters, live, want) in cases {
        let got = removal_refusal(*node, &set(voters), &set(live));
        match (want, &got) {
            (None, None) => {}
            (Some(words), Some(message)) => assert!(message.contains(words), "{message}"),
            _ => {
                panic!("remove {node} of {voters:?} (live {live:?}): wanted {want:?}, got {got:?}")
            }
        }
    }
}

#[test]
fn catch_up_table() {
    // (matched, leader's last, the learner's own entry, caught up)
    let cases: &[(Option<u64>, Option<u64>, u64, bool)] = &[
        (None, Some(10), 10, false),
        (Some(9), Some(10), 10, false),
        (Some(10), Some(10), 10, true),
        (Some(10), Some(10 + CATCH_UP_LAG), 10, true),
        (Some(10), Some(11 + CATCH_UP_LAG), 10, false),
        (Some(500), Some(500), 10, true),
        (Some(0), None, 0, true),
    ];
    for (matched, last, added, want) in cases {
        assert_eq!(
            caught_up(*matched, *last, *added),
            *want,
            "matched {matched:?}, last {last:?}, added {added}"
        );
    }
}
