//! Journal creation only when asked, and the identity check: a missing or empty data dir is
//! refused unless the caller asks for a new journal; a journal of another cluster or node is
//! refused always, naming its `IDENTITY` file and both identities; a journal from before
//! identity files adopts the caller's if it holds Raft state.

use std::fs;
use std::path::Path;

use openraft::storage::RaftLogStorage;
use openraft::Vote;
use tracing::info;

use crate::journal_tests::tree_listing;
use crate::test_support::open_or_create;
use crate::test_support::test_identity;
use crate::test_support::ToyConfig;
use crate::IfMissing;
use crate::Journal;
use crate::JournalError;
use crate::JournalIdentity;
use crate::IDENTITY_FILE;

fn identity(cluster_id: &str, node_id: u64) -> JournalIdentity {
    JournalIdentity::new(cluster_id, node_id).expect("a valid identity")
}

/// Opens `dir` as `who` with `if_missing`, expecting a refusal.
fn refused(dir: &Path, who: &JournalIdentity, if_missing: IfMissing) -> JournalError {
    let err = Journal::open(dir, who, if_missing).expect_err("open must refuse");
    assert!(!err.is_retryable(), "{err}");
    err
}

#[test]
fn a_missing_or_empty_dir_is_refused_unless_a_new_journal_is_asked_for() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let missing = tmp.path().join("lost");
    let err = refused(&missing, &test_identity(), IfMissing::Refuse);
    assert!(matches!(err, JournalError::NoJournal { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "data dir {} holds no journal: it does not exist",
            missing.display()
        )
    );
    assert!(!missing.exists(), "a refused open created the dir");

    let empty = tmp.path().join("empty");
    fs::create_dir(&empty)?;
    let err = refused(&empty, &test_identity(), IfMissing::Refuse);
    assert_eq!(
        err.to_string(),
        format!("data dir {} holds no journal: it is empty", empty.display())
    );
    assert_eq!(fs::read_dir(&empty)?.count(), 0, "a refused open wrote");

    let who = identity("prod", 3);
    let journal = Journal::open(&empty, &who, IfMissing::Create)?;
    assert_eq!(journal.identity(), &who);
    assert_eq!(
        fs::read_to_string(empty.join(IDENTITY_FILE))?,
        "sluice-identity 1\ncluster prod\nnode 3\n"
    );
    Ok(())
}

#[test]
fn a_journal_reopens_as_its_own_identity_and_refuses_any_other() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node-2");
    drop(Journal::open(
        &dir,
        &identity("prod", 2),
        IfMissing::Create,
    )?);
    // The normal restart, and a restart that (harmlessly) asks for a new journal again.
    drop(Journal::open(
        &dir,
        &identity("prod", 2),
        IfMissing::Refuse,
    )?);
    drop(Journal::open(
        &dir,
        &identity("prod", 2),
        IfMissing::Create,
    )?);

    let before = tree_listing(&dir);
    let file = dir.join(IDENTITY_FILE);
    for (who, if_missing) in [
        (identity("prod", 3), IfMissing::Refuse),
        (identity("prod", 3), IfMissing::Create),
        (identity("staging", 2), IfMissing::Refuse),
        (identity("staging", 2), IfMissing::Create),
    ] {
        let err = refused(&dir, &who, if_missing);
        assert!(
            matches!(err, JournalError::IdentityMismatch { .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "data dir {} belongs to cluster 'prod' node 2 (recorded in {}), not to {who}",
                dir.display(),
                file.display()
            )
        );
    }
    assert_eq!(tree_listing(&dir), before, "a refused dir was modified");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_from_before_identities_with_raft_state_adopts_the_callers() -> anyhow::Result<()>
{
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node-1");
    {
        info!("--- a journal with a vote, as an older build left it: no IDENTITY");
        let journal = open_or_create(&dir)?;
        journal
            .log_store::<ToyConfig>()
            .save_vote(&Vote::new_committed(4, 1))
            .await?;
        fs::remove_file(dir.join(IDENTITY_FILE))?;
    }

    info!("--- a plain restart adopts the given identity and keeps the vote");
    let who = identity("prod", 1);
    let journal = Journal::open(&dir, &who, IfMissing::Refuse)?;
    assert_eq!(journal.identity(), &who);
    assert_eq!(
        journal.log_store::<ToyConfig>().read_vote().await?,
        Some(Vote::new_committed(4, 1))
    );
    drop(journal);
    assert_eq!(
        fs::read_to_string(dir.join(IDENTITY_FILE))?,
        "sluice-identity 1\ncluster prod\nnode 1\n"
    );

    info!("--- from then on it is that replica's journal");
    let err = refused(&dir, &identity("prod", 2), IfMissing::Refuse);
    assert!(
        matches!(err, JournalError::IdentityMismatch { .. }),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_journal_from_before_identities_without_raft_state_counts_as_empty() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node-1");
    drop(open_or_create(&dir)?);
    fs::remove_file(dir.join(IDENTITY_FILE))?;

    let err = refused(&dir, &test_identity(), IfMissing::Refuse);
    assert!(matches!(err, JournalError::NoJournal { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("holds a journal without IDENTITY and without Raft state"),
        "{err}"
    );
    assert!(!dir.join(IDENTITY_FILE).exists());

    let who = identity("prod", 1);
    drop(Journal::open(&dir, &who, IfMissing::Create)?);
    drop(Journal::open(&dir, &who, IfMissing::Refuse)?);
    Ok(())
}

#[test]
fn a_malformed_identity_file_is_refused_by_name_untouched() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("node-1");
    drop(open_or_create(&dir)?);
    let file = dir.join(IDENTITY_FILE);
    fs::write(&file, "sluice-identity 1\ncluster test\nnode one\n")?;
    let before = tree_listing(&dir);
    let err = refused(&dir, &test_identity(), IfMissing::Create);
    assert!(matches!(err, JournalError::Format { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "data dir {} is not a sluice journal: {} has \"node one\" where \"node ID\" belongs",
            dir.display(),
            file.display()
        )
    );
    assert_eq!(tree_listing(&dir), before, "a refused dir was modified");
    Ok(())
}
