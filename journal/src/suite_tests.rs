//! openraft's storage conformance suite on the sled journal, one temp dir per test.

use openraft::testing::StoreBuilder;
use openraft::testing::Suite;
use openraft::StorageError;
use tempfile::TempDir;

use crate::test_support::KvState;
use crate::test_support::ToyConfig;
use crate::LogStore;
use crate::StateMachineStore;

struct SledBuilder;

impl StoreBuilder<ToyConfig, LogStore<ToyConfig>, StateMachineStore<ToyConfig, KvState>, TempDir>
    for SledBuilder
{
    async fn build(
        &self,
    ) -> Result<
        (
            TempDir,
            LogStore<ToyConfig>,
            StateMachineStore<ToyConfig, KvState>,
        ),
        StorageError<u64>,
    > {
        let dir = tempfile::tempdir().map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Store,
                openraft::ErrorVerb::Write,
                e,
            )
        })?;
        let journal =
            crate::test_support::open_or_create(&dir.path().join("journal")).map_err(|e| {
                e.into_storage(openraft::ErrorSubject::Store, openraft::ErrorVerb::Read)
            })?;
        let sm = journal.state_machine::<ToyConfig, KvState>().map_err(|e| {
            e.into_storage(
                openraft::ErrorSubject::StateMachine,
                openraft::ErrorVerb::Read,
            )
        })?;
        Ok((dir, journal.log_store(), sm))
    }
}

#[test]
fn openraft_storage_suite() -> anyhow::Result<()> {
    Suite::test_all(SledBuilder)?;
    Ok(())
}
