//! Upgrading a version 4 data dir (snapshot in a sled tree) to version 5 (snapshot file), and
//! finishing an upgrade a crash interrupted.

use std::fs;
use std::path::Path;

use openraft::storage::RaftLogStorage;
use openraft::storage::RaftLogStorageExt;
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;
use openraft::Entry;
use openraft::EntryPayload;
use openraft::RaftLogReader;
use openraft::RaftSnapshotBuilder;
use openraft::StorageHelper;

use crate::test_support::open_or_create;
use crate::test_support::Cmd;
use crate::test_support::KvState;
use crate::test_support::ToyConfig;
use crate::FORMAT_FILE;
use crate::SNAPSHOT_FILE;

fn set(index: u64, key: &str, value: &str) -> Entry<ToyConfig> {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Normal(Cmd::Set {
            key: key.to_string(),
            value: value.to_string(),
        }),
    }
}

/// Opens the journal's sled database directly, once the journal just dropped has released it
/// (sled's threads hold its lock for a few milliseconds after the last handle goes).
fn open_sled(dir: &Path) -> anyhow::Result<sled::Db> {
    let mut opened = Err(anyhow::anyhow!("not opened yet"));
    let released = sluice_testwait::wait_until_blocking(
        "sled's lock to be released",
        sluice_testwait::HANG,
        || {
            opened = sled::open(dir.join("db")).map_err(Into::into);
            opened.is_ok()
        },
    );
    opened.map_err(|e| e.context(released.err().map_or(String::new(), |t| t.to_string())))
}

/// Makes a version 5 journal with a snapshot at index 2 and a committed entry 3 after it, then
/// rewrites it the way version 4 stored it: the snapshot in the `snapshot` tree, `FORMAT` and
/// the header saying 4, no `SNAPSHOT` file. Returns the snapshot's id.
async fn make_version_4_dir(dir: &Path) -> anyhow::Result<String> {
    let snapshot_id;
    {
        let journal = open_or_create(dir)?;
        let mut log = journal.log_store::<ToyConfig>();
        let mut sm = journal.state_machine::<ToyConfig, KvState>()?;
        log.blocking_append([set(1, "a", "1"), set(2, "b", "2"), set(3, "a", "3")])
            .await?;
        sm.apply(log.try_get_log_entries(1..3).await?).await?;
        snapshot_id = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await?
            .meta
            .snapshot_id;
        log.save_committed(Some(log_id(1, 1, 3))).await?;
        log.purge(log_id(1, 1, 2)).await?;
    }
    let raw = crate::snapshot_file::SnapshotFile::new(dir)
        .read_raw()?
        .expect("a snapshot");
    fs::remove_file(dir.join(SNAPSHOT_FILE))?;
    let db = open_sled(dir)?;
    let tree = db.open_tree("snapshot")?;
    tree.insert(b"meta", raw.meta)?;
    tree.insert(b"data", raw.data)?;
    tree.insert(b"seq", &raw.seq.to_be_bytes())?;
    db.open_tree("header")?
        .insert(b"format", &4u32.to_be_bytes())?;
    db.flush()?;
    drop(db);
    fs::write(dir.join(FORMAT_FILE), "sluice-journal 4\n")?;
    Ok(snapshot_id)
}

/// Opens `dir` and checks it holds version 5 with the moved snapshot and the log after it.
async fn assert_upgraded(dir: &Path, snapshot_id: &str) -> anyhow::Result<()> {
    let journal = open_or_create(dir)?;
    assert_eq!(
        fs::read_to_string(dir.join(FORMAT_FILE))?,
        "sluice-journal 5\n"
    );
    assert!(dir.join(SNAPSHOT_FILE).is_file());
    let mut log = journal.log_store::<ToyConfig>();
    let mut sm = journal.state_machine::<ToyConfig, KvState>()?;
    let current = sm
        .get_current_snapshot()
        .await?
        .expect("the moved snapshot");
    assert_eq!(current.meta.snapshot_id, snapshot_id);
    StorageHelper::new(&mut log, &mut sm)
        .get_initial_state()
        .await?;
    let handle = sm.handle();
    let applied = handle.read().expect("lock");
    assert_eq!(applied.last_applied, Some(log_id(1, 1, 3)));
    assert_eq!(applied.state.map.get("a").map(String::as_str), Some("3"));
    assert_eq!(applied.state.map.get("b").map(String::as_str), Some("2"));
    drop(applied);
    drop((log, sm, journal));
    let db = open_sled(dir)?;
    assert!(
        !db.tree_names().iter().any(|n| n.as_ref() == b"snapshot"),
        "the version 4 tree is gone"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_dir_is_upgraded_with_its_snapshot_and_log() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node");
    let snapshot_id = make_version_4_dir(&dir).await?;
    assert_upgraded(&dir, &snapshot_id).await?;
    // A second open of the upgraded dir changes nothing.
    assert_upgraded(&dir, &snapshot_id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_interrupted_after_the_header_is_finished() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node");
    let snapshot_id = make_version_4_dir(&dir).await?;
    {
        // The crash: the file and the header were written, `FORMAT` still says 4.
        let raw = {
            let db = open_sled(&dir)?;
            let tree = db.open_tree("snapshot")?;
            let raw = crate::snapshot_file::RawSnapshot {
                seq: 1,
                meta: tree.get(b"meta")?.expect("meta").to_vec(),
                data: tree.get(b"data")?.expect("data").to_vec(),
            };
            db.open_tree("header")?
                .insert(b"format", &5u32.to_be_bytes())?;
            db.flush()?;
            raw
        };
        crate::snapshot_file::SnapshotFile::new(&dir).write_raw(&raw)?;
    }
    assert_upgraded(&dir, &snapshot_id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_dir_without_a_snapshot_is_upgraded() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node");
    drop(open_or_create(&dir)?);
    {
        let db = open_sled(&dir)?;
        db.open_tree("header")?
            .insert(b"format", &4u32.to_be_bytes())?;
        db.flush()?;
    }
    fs::write(dir.join(FORMAT_FILE), "sluice-journal 4\n")?;
    drop(open_or_create(&dir)?);
    assert_eq!(
        fs::read_to_string(dir.join(FORMAT_FILE))?,
        "sluice-journal 5\n"
    );
    assert!(!dir.join(SNAPSHOT_FILE).exists());
    Ok(())
}
