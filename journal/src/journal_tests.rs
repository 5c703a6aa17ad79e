//! Journal tests beyond openraft's suite: restart recovery, data-dir format checks, snapshot
//! install and the snapshot race guard.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use anyhow::Context;
use openraft::entry::RaftEntry;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftLogStorageExt;
use openraft::storage::RaftStateMachine;
use openraft::testing::log_id;
use openraft::Entry;
use openraft::EntryPayload;
use openraft::Membership;
use openraft::RaftLogReader;
use openraft::RaftSnapshotBuilder;
use openraft::StorageHelper;
use openraft::Vote;
use tracing::info;

use crate::codec;
use crate::test_support::open_or_create;
use crate::test_support::Cmd;
use crate::test_support::KvState;
use crate::test_support::Resp;
use crate::test_support::ToyConfig;
use crate::JournalError;
use crate::FORMAT_FILE;

fn set(term: u64, index: u64, key: &str, value: &str) -> Entry<ToyConfig> {
    let mut e = Entry::<ToyConfig>::new_blank(log_id(term, 1, index));
    e.payload = EntryPayload::Normal(Cmd::Set {
        key: key.to_string(),
        value: value.to_string(),
    });
    e
}

fn membership(term: u64, index: u64, voters: &[u64]) -> Entry<ToyConfig> {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    Entry::<ToyConfig>::new_membership(log_id(term, 1, index), Membership::new(vec![voters], None))
}

fn kv(pairs: &[(&str, &str)]) -> KvState {
    KvState {
        map: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// Every file and dir under `root` with its content, to prove a refused dir was not touched.
pub(crate) fn tree_listing(root: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
        for entry in fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("under root")
                .display()
                .to_string();
            if path.is_dir() {
                out.insert(rel, None);
                walk(root, &path, out);
            } else {
                out.insert(rel, Some(fs::read(&path).expect("read file")));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recovers_log_vote_committed_snapshot_and_state() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node-1");

    let snapshot_meta;
    {
        info!("--- first life: vote, log, apply, snapshot, purge, more log");
        let journal = open_or_create(&dir).context("open journal")?;
        let mut log = journal.log_store::<ToyConfig>();
        let mut sm = journal.state_machine::<ToyConfig, KvState>()?;

        log.save_vote(&Vote::new_committed(2, 1)).await?;
        log.blocking_append([
            membership(1, 1, &[1]),
            set(1, 2, "a", "1"),
            set(1, 3, "b", "2"),
            set(2, 4, "a", "3"),
        ])
        .await?;
        let responses = sm.apply(log.try_get_log_entries(1..5).await?).await?;
        assert_eq!(
            responses,
            vec![
                Resp(None),
                Resp(None),
                Resp(None),
                Resp(Some("1".to_string()))
            ]
        );
        log.save_committed(Some(log_id(2, 1, 4))).await?;

        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await?;
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(2, 1, 4)));
        snapshot_meta = snapshot.meta;
        log.purge(log_id(1, 1, 2)).await?;

        log.blocking_append([
            set(2, 5, "c", "4"),
            set(2, 6, "b", "5"),
            set(2, 7, "d", "uncommitted"),
        ])
        .await?;
        sm.apply(log.try_get_log_entries(5..7).await?).await?;
        log.save_committed(Some(log_id(2, 1, 6))).await?;
        let live = sm.handle().read().expect("lock").state.clone();
        assert_eq!(live, kv(&[("a", "3"), ("b", "5"), ("c", "4")]));
    }

    info!("--- second life: everything durable is back");
    let journal = open_or_create(&dir).context("reopen journal")?;
    let mut log = journal.log_store::<ToyConfig>();
    let mut sm = journal.state_machine::<ToyConfig, KvState>()?;

    assert_eq!(log.read_vote().await?, Some(Vote::new_committed(2, 1)));
    assert_eq!(log.read_committed().await?, Some(log_id(2, 1, 6)));
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 2)));
    assert_eq!(state.last_log_id, Some(log_id(2, 1, 7)));
    let indexes: Vec<u64> = log
        .try_get_log_entries(0..)
        .await?
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(indexes, vec![3, 4, 5, 6, 7]);

    let current = sm
        .get_current_snapshot()
        .await?
        .context("snapshot persisted")?;
    assert_eq!(current.meta, snapshot_meta);
    let (applied, mem) = sm.applied_state().await?;
    assert_eq!(
        applied,
        Some(log_id(2, 1, 4)),
        "state comes back at the snapshot"
    );
    assert_eq!(mem.log_id(), &Some(log_id(1, 1, 1)));
    assert_eq!(
        sm.handle().read().expect("lock").state,
        kv(&[("a", "3"), ("b", "2")])
    );

    info!("--- openraft's startup re-applies (snapshot, committed]");
    StorageHelper::new(&mut log, &mut sm)
        .get_initial_state()
        .await?;
    let handle = sm.handle();
    let applied_state = handle.read().expect("lock");
    assert_eq!(applied_state.last_applied, Some(log_id(2, 1, 6)));
    assert_eq!(
        applied_state.state,
        kv(&[("a", "3"), ("b", "5"), ("c", "4")])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_snapshot_replaces_state_and_survives_restart() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let leader = open_or_create(&tmp.path().join("leader"))?;
    let mut leader_sm = leader.state_machine::<ToyConfig, KvState>()?;
    leader_sm
        .apply([
            membership(1, 1, &[1, 2]),
            set(1, 2, "x", "1"),
            set(1, 3, "y", "2"),
        ])
        .await?;
    let snapshot = leader_sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await?;

    let follower_dir = tmp.path().join("follower");
    {
        let follower = open_or_create(&follower_dir)?;
        let mut sm = follower.state_machine::<ToyConfig, KvState>()?;
        sm.apply([set(1, 1, "stale", "z")]).await?;
        let mut buf = sm.begin_receiving_snapshot().await?;
        buf.get_mut().extend_from_slice(snapshot.snapshot.get_ref());
        sm.install_snapshot(&snapshot.meta, buf).await?;
        let applied = sm.handle().read().expect("lock").clone();
        assert_eq!(applied.last_applied, Some(log_id(1, 1, 3)));
        assert_eq!(applied.state, kv(&[("x", "1"), ("y", "2")]));
    }
    let follower = open_or_create(&follower_dir)?;
    let mut sm = follower.state_machine::<ToyConfig, KvState>()?;
    assert_eq!(
        sm.get_current_snapshot().await?.context("snapshot")?.meta,
        snapshot.meta
    );
    assert_eq!(
        sm.handle().read().expect("lock").state,
        kv(&[("x", "1"), ("y", "2")])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_rejects_data_that_does_not_match_meta() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let journal = open_or_create(&tmp.path().join("j"))?;
    let mut sm = journal.state_machine::<ToyConfig, KvState>()?;
    sm.apply([set(1, 1, "k", "v")]).await?;
    let snapshot = sm.get_snapshot_builder().await.build_snapshot().await?;

    let mut meta = snapshot.meta.clone();
    meta.last_log_id = Some(log_id(9, 1, 9));
    let buf = Box::new(snapshot.snapshot.as_ref().clone());
    assert!(sm.install_snapshot(&meta, buf).await.is_err());

    let garbage = Box::new(std::io::Cursor::new(vec![codec::CODEC_VERSION, 1, 2]));
    assert!(sm.install_snapshot(&snapshot.meta, garbage).await.is_err());
    assert_eq!(
        sm.get_current_snapshot().await?.context("snapshot")?.meta,
        snapshot.meta
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_ids_stay_unique_across_restarts() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("j");
    let first = {
        let journal = open_or_create(&dir)?;
        let mut sm = journal.state_machine::<ToyConfig, KvState>()?;
        sm.apply([set(1, 1, "k", "1")]).await?;
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await?
            .meta
            .snapshot_id
    };
    let journal = open_or_create(&dir)?;
    let mut sm = journal.state_machine::<ToyConfig, KvState>()?;
    let second = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await?
        .meta
        .snapshot_id;
    assert_ne!(first, second);
    Ok(())
}

#[test]
fn fresh_missing_dir_is_initialised_and_reopens() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("a").join("b");
    drop(open_or_create(&dir)?);
    assert_eq!(
        fs::read_to_string(dir.join(FORMAT_FILE))?,
        "sluice-journal 5\n"
    );
    assert!(dir.join("db").is_dir());
    let names: BTreeSet<String> = fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    assert_eq!(
        names,
        BTreeSet::from(["FORMAT", "IDENTITY", "db"].map(String::from))
    );
    drop(open_or_create(&dir)?);
    Ok(())
}

#[test]
fn fresh_empty_dir_is_initialised() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let journal = open_or_create(tmp.path())?;
    assert_eq!(journal.dir(), tmp.path());
    assert!(tmp.path().join(FORMAT_FILE).is_file());
    Ok(())
}

fn assert_refused(dir: &Path, names: &Path, says: &str) -> JournalError {
    let before = if dir.is_dir() {
        tree_listing(dir)
    } else {
        BTreeMap::new()
    };
    let err = open_or_create(dir).expect_err("open must refuse");
    let msg = err.to_string();
    assert!(matches!(err, JournalError::Format { .. }), "{msg}");
    assert!(!err.is_retryable(), "{msg}");
    assert!(
        msg.contains(&names.display().to_string()),
        "{msg} does not name {}",
        names.display()
    );
    assert!(msg.contains(says), "{msg} does not say {says:?}");
    if dir.is_dir() {
        assert_eq!(tree_listing(dir), before, "refused dir was modified");
    }
    err
}

#[test]
fn dir_with_other_files_and_no_format_is_refused_untouched() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    fs::write(tmp.path().join("notes.txt"), "hello")?;
    fs::create_dir(tmp.path().join("db"))?;
    fs::write(tmp.path().join("db").join("blob"), [0u8, 1, 2])?;
    let err = assert_refused(tmp.path(), &tmp.path().join(FORMAT_FILE), "is missing");
    assert_eq!(
        err.to_string(),
        format!(
            "data dir {} is not a sluice journal: {}/FORMAT is missing",
            tmp.path().display(),
            tmp.path().display()
        )
    );
    Ok(())
}

#[test]
fn format_file_with_other_content_is_refused_untouched() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    drop(open_or_create(tmp.path())?);
    // Another version's header (the next one, which this build cannot read).
    fs::write(
        tmp.path().join(FORMAT_FILE),
        format!("sluice-journal {}\n", crate::FORMAT_VERSION + 1),
    )?;
    assert_refused(tmp.path(), &tmp.path().join(FORMAT_FILE), "expected");
    // A version before the one this build upgrades (an older build's journal, encoded
    // differently).
    fs::write(
        tmp.path().join(FORMAT_FILE),
        format!("sluice-journal {}\n", crate::FORMAT_VERSION - 2),
    )?;
    assert_refused(tmp.path(), &tmp.path().join(FORMAT_FILE), "expected");
    fs::write(tmp.path().join(FORMAT_FILE), "")?;
    assert_refused(tmp.path(), &tmp.path().join(FORMAT_FILE), "expected");
    Ok(())
}

#[test]
fn path_that_is_a_file_is_refused_untouched() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let file = tmp.path().join("data");
    fs::write(&file, "not a dir")?;
    assert_refused(&file, &file, "is not a directory");
    assert_eq!(fs::read_to_string(&file)?, "not a dir");
    Ok(())
}

#[test]
fn valid_format_but_missing_db_is_refused_untouched() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    fs::write(tmp.path().join(FORMAT_FILE), crate::format_file_content())?;
    assert_refused(tmp.path(), &tmp.path().join("db"), "is missing");
    Ok(())
}

#[test]
fn sled_db_without_header_is_refused() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    fs::write(tmp.path().join(FORMAT_FILE), crate::format_file_content())?;
    {
        let db = sled::open(tmp.path().join("db"))?;
        db.insert(b"foreign", b"data")?;
        db.flush()?;
    }
    let err = open_or_create(tmp.path()).expect_err("refused");
    assert!(matches!(err, JournalError::Format { .. }), "{err}");
    assert!(err.to_string().contains("has no format header"), "{err}");
    Ok(())
}

#[test]
fn sled_db_with_other_header_version_is_refused() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    drop(open_or_create(tmp.path())?);
    {
        let db = sled::open(tmp.path().join("db"))?;
        db.open_tree("header")?
            .insert(b"format", &7u32.to_be_bytes())?;
        db.flush()?;
    }
    let err = open_or_create(tmp.path()).expect_err("refused");
    assert!(err.to_string().contains("has format version 7"), "{err}");
    Ok(())
}

#[test]
fn second_open_while_in_use_is_a_retryable_error() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let _first = open_or_create(tmp.path())?;
    let err = open_or_create(tmp.path()).expect_err("sled lock held");
    assert!(err.is_retryable(), "{err:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_to_a_follower_is_cut_at_max_append_bytes() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let journal = open_or_create(&tmp.path().join("node-1")).context("open journal")?;
    let mut log = journal.log_store::<ToyConfig>();
    // Entries of a third of the bound each, then one of twice the bound.
    let third = "x".repeat(crate::MAX_APPEND_BYTES / 3);
    let double = "y".repeat(crate::MAX_APPEND_BYTES * 2);
    log.blocking_append([
        set(1, 1, "a", &third),
        set(1, 2, "b", &third),
        set(1, 3, "c", &third),
        set(1, 4, "d", &double),
        set(1, 5, "e", "small"),
    ])
    .await?;
    let indexes = |entries: Vec<Entry<ToyConfig>>| -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    };
    // Three thirds and their encoding overhead pass the bound: two go.
    assert_eq!(
        indexes(log.limited_get_log_entries(1, 6).await?),
        vec![1, 2]
    );
    assert_eq!(indexes(log.limited_get_log_entries(3, 6).await?), vec![3]);
    // An entry over the bound goes alone, never held back.
    assert_eq!(indexes(log.limited_get_log_entries(4, 6).await?), vec![4]);
    assert_eq!(indexes(log.limited_get_log_entries(5, 6).await?), vec![5]);
    assert!(log.limited_get_log_entries(5, 5).await?.is_empty());
    // Reads that are not for an append are not cut.
    assert_eq!(
        indexes(log.try_get_log_entries(1..6).await?),
        vec![1, 2, 3, 4, 5]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_and_truncate_across_many_removal_batches_leave_a_log_without_holes(
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let journal = open_or_create(&tmp.path().join("node-1")).context("open journal")?;
    let mut log = journal.log_store::<ToyConfig>();
    // Several of the purge's removal batches (1,024 entries each), and a part of one.
    let n = 5_000;
    log.blocking_append((1..=n).map(|i| set(1, i, "k", "v")))
        .await?;
    log.purge(log_id(1, 1, 3_100)).await?;
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 3_100)));
    assert_eq!(state.last_log_id, Some(log_id(1, 1, n)));
    let left = log.try_get_log_entries(0..=n).await?;
    assert_eq!(left.first().map(|e| e.log_id.index), Some(3_101));
    assert_eq!(
        left.len(),
        (n - 3_100) as usize,
        "every entry above the purge, no hole"
    );

    log.truncate(log_id(1, 1, 3_500)).await?;
    let left = log.try_get_log_entries(0..=n).await?;
    assert_eq!(
        left.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        (3_101..3_500).collect::<Vec<_>>()
    );
    // A purge of what is already gone, and of more, removes only what is there.
    log.purge(log_id(1, 1, 3_200)).await?;
    let left = log.try_get_log_entries(0..=n).await?;
    assert_eq!(left.first().map(|e| e.log_id.index), Some(3_201));
    assert_eq!(left.len(), 299);
    Ok(())
}
