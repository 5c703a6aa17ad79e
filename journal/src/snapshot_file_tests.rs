//! The snapshot file: a round trip, and every damaged file refused by name.

use std::fs;

use openraft::testing::log_id;
use openraft::SnapshotMeta;
use openraft::StoredMembership;

use super::*;
use crate::test_support::ToyConfig;

fn stored(index: u64, data: &[u8]) -> StoredSnapshot<ToyConfig> {
    StoredSnapshot {
        meta: SnapshotMeta {
            last_log_id: Some(log_id(2, 1, index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("2-{index}-7"),
        },
        data: data.to_vec(),
        seq: 7,
    }
}

#[test]
fn a_written_snapshot_reads_back_and_replaces_the_previous_one() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let file = SnapshotFile::new(tmp.path());
    assert!(file.read::<ToyConfig>()?.is_none());
    assert!(!file.exists()?);

    file.write(stored(10, b"first"))?;
    file.write(stored(20, b"second state"))?;
    let back = file.read::<ToyConfig>()?.expect("a snapshot");
    assert_eq!(back.meta, stored(20, b"").meta);
    assert_eq!(back.data, b"second state");
    assert_eq!(back.seq, 7);
    let names: Vec<_> = fs::read_dir(tmp.path())?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    assert_eq!(names, vec![SNAPSHOT_FILE], "no temp file stays behind");
    Ok(())
}

#[test]
fn a_stale_temp_file_from_a_crash_is_ignored_and_replaced() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let file = SnapshotFile::new(tmp.path());
    file.write(stored(10, b"durable"))?;
    fs::write(tmp.path().join("SNAPSHOT.tmp"), b"half a snapshot")?;
    assert_eq!(
        file.read::<ToyConfig>()?.expect("a snapshot").data,
        b"durable"
    );
    file.write(stored(11, b"next"))?;
    assert_eq!(file.read::<ToyConfig>()?.expect("a snapshot").data, b"next");
    assert!(!tmp.path().join("SNAPSHOT.tmp").exists());
    Ok(())
}

#[test]
fn a_damaged_file_is_refused_naming_it_and_what_is_wrong() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let file = SnapshotFile::new(tmp.path());
    file.write(stored(10, b"some state bytes"))?;
    let good = fs::read(file.path())?;

    let mut flipped = good.clone();
    flipped[30] ^= 0x40;
    let mut wrong_magic = good[..good.len() - 4].to_vec();
    wrong_magic[0] = b'X';
    let crc = crc32fast::hash(&wrong_magic);
    wrong_magic.extend_from_slice(&crc.to_le_bytes());
    let mut long_claim = good[..8 + 8].to_vec();
    long_claim.extend_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32fast::hash(&long_claim);
    long_claim.extend_from_slice(&crc.to_le_bytes());

    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("empty", vec![], "too short"),
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "checksum mismatch",
        ),
        ("a flipped bit", flipped, "checksum mismatch"),
        ("another file", wrong_magic, "not a sluice snapshot"),
        (
            "a meta length past the end",
            long_claim,
            "ends inside the meta",
        ),
    ];
    for (case, bytes, says) in cases {
        fs::write(file.path(), &bytes)?;
        let err = file.read::<ToyConfig>().err().expect(case).to_string();
        assert!(
            err.contains(&file.path().display().to_string()),
            "{case}: {err}"
        );
        assert!(err.contains(says), "{case}: {err} does not say {says:?}");
    }
    Ok(())
}
