//! The state's internal consistency, checked by the tests after every step: references point at
//! stored entities, and every count and index agrees with what it counts.

use super::DispatcherState;
use std::collections::BTreeMap;

impl DispatcherState {
    /// The first broken invariant, if any.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (id, task) in &self.tasks {
            let iteration = self
                .iterations
                .get(&task.iteration_id)
                .ok_or(format!("task {id} names a missing iteration"))?;
            let listed = iteration.tasks.contains(id)
                || iteration.pending_tasks.iter().any(|p| p.task_id == *id)
                || task.dropped;
            if !listed {
                return Err(format!("task {id} is not in its iteration"));
            }
            let indexed = self
                .worker_tasks
                .get(&task.worker)
                .is_some_and(|t| t.contains(id));
            if indexed == task.finished {
                return Err(format!("task {id}: worker index disagrees with finished"));
            }
        }
        for (worker, tasks) in &self.worker_tasks {
            if tasks.is_empty() || tasks.iter().any(|t| !self.tasks.contains_key(t)) {
                return Err(format!("worker {worker}: index holds missing or no tasks"));
            }
        }
        let mut iterations_per_job: BTreeMap<_, u64> = BTreeMap::new();
        for (id, iteration) in &self.iterations {
            if !self.jobs.contains_key(&iteration.job_id) {
                return Err(format!("iteration {id} names a missing job"));
            }
            *iterations_per_job.entry(iteration.job_id).or_default() += 1;
            if iteration.tasks.iter().any(|t| !self.tasks.contains_key(t)) {
                return Err(format!("iteration {id} lists a missing task"));
            }
            let clients = self.clients.values().filter(|c| *c == id).count() as u64;
            if clients != iteration.num_clients {
                return Err(format!(
                    "iteration {id}: {clients} clients, counted {}",
                    iteration.num_clients
                ));
            }
        }
        let mut jobs_per_dataset: BTreeMap<_, u64> = BTreeMap::new();
        for (id, job) in &self.jobs {
            if !self.datasets.contains_key(&job.dataset_id) {
                return Err(format!("job {id} names a missing dataset"));
            }
            *jobs_per_dataset.entry(job.dataset_id.clone()).or_default() += 1;
            let counted = iterations_per_job.get(id).copied().unwrap_or(0);
            if counted != job.iterations {
                return Err(format!(
                    "job {id}: {counted} iterations, counted {}",
                    job.iterations
                ));
            }
            if self.job_names.get(&job.name) != Some(id) {
                return Err(format!("job {id}: its name does not lead to it"));
            }
        }
        let mut datasets_per_definition: BTreeMap<_, u64> = BTreeMap::new();
        for (id, dataset) in &self.datasets {
            *datasets_per_definition
                .entry(dataset.definition)
                .or_default() += 1;
            let counted = jobs_per_dataset.get(id).copied().unwrap_or(0);
            if counted != dataset.jobs {
                return Err(format!(
                    "dataset {id}: {counted} jobs, counted {}",
                    dataset.jobs
                ));
            }
        }
        let staging = self
            .definitions
            .values()
            .filter(|d| d.datasets == 0)
            .count();
        if staging > 1 {
            return Err(format!("{staging} definitions are being staged at once"));
        }
        if datasets_per_definition.len() + staging != self.definitions.len() {
            return Err("a definition no dataset uses is stored".into());
        }
        for (key, definition) in &self.definitions {
            let counted = datasets_per_definition.get(key).copied().unwrap_or(0);
            if counted != definition.datasets {
                return Err("a definition's dataset count is wrong".into());
            }
        }
        if self.job_names.len() != self.jobs.len() {
            return Err("a job name leads to a missing job".into());
        }
        for ((name, _), id) in &self.iteration_keys {
            let job = self
                .iterations
                .get(id)
                .and_then(|it| self.jobs.get(&it.job_id));
            if job.map(|j| &j.name) != Some(name) {
                return Err(format!(
                    "iteration key ({name}, _) leads to a wrong iteration"
                ));
            }
        }
        Ok(())
    }
}
