//! Readers' states through real processes: `sluice read --state-every/--state-file` on a
//! three-replica quorum, and `--resume` after the reader, a worker, the leader or the whole
//! quorum was killed; four readers' states at one step resumed by two; and the states a job
//! refuses (another dataset, a newer format, a job that delivers at most once).

use crate::failover::{spawn, three_replicas, wait_leader, Flags};
use crate::{assert_exactly_once, sluice, workers_with, Reader};
use sluice_tests::process::SluiceProcess;
use sluice_tests::wait_until_blocking;
use std::path::Path;
use std::time::Duration;

/// The epoch every test reads.
const N: i64 = 20_000;
/// Elements between states.
const EVERY: usize = 2_000;

/// Three replicas (silent workers removed after 2 s) and `n_workers` workers: the replicas, their
/// arguments for restarts, the workers and the replicas' client addresses.
struct Quorum {
    nodes: Vec<SluiceProcess>,
    args: Vec<Vec<String>>,
    workers: Vec<SluiceProcess>,
    all: String,
}

fn quorum(data: &Path, n_workers: usize) -> Quorum {
    quorum_with(data, n_workers, &[])
}

/// [`quorum`], the replicas also given `extra`.
fn quorum_with(data: &Path, n_workers: usize, extra: &[&str]) -> Quorum {
    quorum_with_workers(data, n_workers, extra, &[])
}

/// [`quorum_with`], the workers also given `worker_extra`.
fn quorum_with_workers(
    data: &Path,
    n_workers: usize,
    extra: &[&str],
    worker_extra: &[&str],
) -> Quorum {
    let mut flags = Flags::plain();
    flags.dispatcher.extend(
        ["--worker-timeout", "2s"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string()),
    );
    let (nodes, args) = three_replicas(data, &flags);
    let all = nodes
        .iter()
        .map(|n| n.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let workers = workers_with(&all, n_workers, worker_extra);
    Quorum {
        nodes,
        args,
        workers,
        all,
    }
}

/// `sluice read` arguments for job `job` of `range(N)` (distributed_epoch, few elements in
/// flight), then `extra`.
fn read_args(all: &str, dataset: &str, job: &str, extra: &[&str]) -> Vec<String> {
    [
        "--dispatcher",
        all,
        "--dataset",
        dataset,
        "--mode",
        "distributed_epoch",
        "--job-name",
        job,
        "--max-outstanding-requests",
        "8",
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

fn start(args: &[String]) -> Reader {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Reader::start(&args)
}

/// `sluice read <args>` to its end: its lines; fails if the reader did.
fn read_all(args: &[String]) -> Vec<String> {
    let (ok, lines) = start(args).finish(Vec::new(), Duration::from_secs(120));
    assert!(ok, "sluice read {args:?} failed");
    lines
}

/// Waits for `n` lines of `reader` into `got`.
fn read_lines(reader: &Reader, got: &mut Vec<String>, n: usize) {
    while got.len() < n {
        let line = reader
            .lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("after {} lines: {e}", got.len()));
        got.push(line);
    }
}

/// The state a reader wrote.
fn state_in(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no state in {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON: {text:?}: {e}"))
}

fn step_of(state: &serde_json::Value) -> usize {
    state["step"].as_u64().expect("a state has a step") as usize
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Starts a reader of job `job` of `range(N)` taking a state every [`EVERY`] elements (at 4,000
/// elements a second, so it is killed mid-epoch), SIGKILLs it once it read past its second
/// state, and returns the lines it read before the state it left, and that state file.
fn reader_killed_past_its_state(all: &str, job: &str, dir: &Path) -> (Vec<String>, String) {
    reader_of_killed_past_its_state(all, &format!("range({N})"), job, dir)
}

/// [`reader_killed_past_its_state`] reading `dataset`.
fn reader_of_killed_past_its_state(
    all: &str,
    dataset: &str,
    job: &str,
    dir: &Path,
) -> (Vec<String>, String) {
    let state_file = dir.join(format!("{job}.json"));
    let every = EVERY.to_string();
    let args = read_args(
        all,
        dataset,
        job,
        &[
            "--state-every",
            &every,
            "--state-file",
            path_str(&state_file),
            "--rate",
            "4000",
        ],
    );
    let mut reader = start(&args);
    let mut got = Vec::new();
    read_lines(&reader, &mut got, 2 * EVERY + EVERY / 2);
    reader.kill();
    let (ok, got) = reader.finish(got, Duration::from_secs(30));
    assert!(!ok, "the killed reader succeeded");
    let state = state_in(&state_file);
    let step = step_of(&state);
    assert!(
        step >= 2 * EVERY && step.is_multiple_of(EVERY) && step <= got.len(),
        "a state at step {step} from a reader that printed {} lines: {state}",
        got.len()
    );
    // Read past it: what it read after the state arrives again after the restore.
    assert!(got.len() > step, "the reader was killed at its state");
    (got[..step].to_vec(), path_str(&state_file).to_string())
}

#[test]
fn a_reader_killed_past_its_state_resumes_the_epoch_exactly_once() {
    let data = tempfile::tempdir().expect("temp dir");
    let q = quorum(data.path(), 2);
    let (mut got, state) = reader_killed_past_its_state(&q.all, "killed", data.path());
    let range = format!("range({N})");
    got.extend(read_all(&read_args(
        &q.all,
        &range,
        "killed",
        &["--resume", &state],
    )));
    assert_exactly_once(&got, N);
}

#[test]
fn a_reader_of_text_files_killed_past_its_state_resumes_the_epoch_exactly_once() {
    let data = tempfile::tempdir().expect("temp dir");
    let files = data.path().join("files");
    std::fs::create_dir(&files).expect("a data dir");
    // Numbered lines across files: file `f` holds `f * PER_FILE .. (f + 1) * PER_FILE`.
    const PER_FILE: i64 = 1_000;
    for f in 0..N / PER_FILE {
        let text: String = (f * PER_FILE..(f + 1) * PER_FILE)
            .map(|i| format!("{i}\n"))
            .collect();
        std::fs::write(files.join(format!("part-{f:03}.txt")), text).expect("write a data file");
    }
    let root = path_str(&files);
    let q = quorum_with_workers(
        data.path(),
        2,
        &["--data-root", root],
        &["--data-root", root],
    );
    let dataset = format!("files(\"{root}/*.txt\").lines()");
    let (mut got, state) = reader_of_killed_past_its_state(&q.all, &dataset, "files", data.path());
    got.extend(read_all(&read_args(
        &q.all,
        &dataset,
        "files",
        &["--resume", &state],
    )));
    // Lines print as JSON strings.
    let numbers: Vec<String> = got
        .iter()
        .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
            Ok(serde_json::Value::String(s)) => s,
            _ => panic!("not a line of text: {l:?}"),
        })
        .collect();
    assert_exactly_once(&numbers, N);
}

#[test]
fn a_worker_killed_while_a_restored_reader_reads_loses_and_repeats_nothing() {
    let data = tempfile::tempdir().expect("temp dir");
    let mut q = quorum(data.path(), 3);
    let (mut got, state) = reader_killed_past_its_state(&q.all, "worker-killed", data.path());
    let range = format!("range({N})");
    let reader = start(&read_args(
        &q.all,
        &range,
        "worker-killed",
        &["--resume", &state, "--rate", "4000"],
    ));
    let mut resumed = Vec::new();
    read_lines(&reader, &mut resumed, EVERY);
    q.workers[0].kill();
    let (ok, resumed) = reader.finish(resumed, Duration::from_secs(120));
    assert!(ok, "the restored reader failed");
    got.extend(resumed);
    assert_exactly_once(&got, N);
    assert_eq!(q.workers[1].exit_status(), None);
}

#[test]
fn two_readers_resume_from_two_of_four_states_at_one_step_and_read_the_rest_once() {
    let data = tempfile::tempdir().expect("temp dir");
    let q = quorum(data.path(), 2);
    let range = format!("range({N})");
    let every = EVERY.to_string();
    let files: Vec<String> = (0..4)
        .map(|i| path_str(&data.path().join(format!("rank-{i}.json"))).to_string())
        .collect();
    // Each reader takes EVERY elements and its state there, and stops: four states at one step,
    // as ranks training in lockstep take them.
    let readers: Vec<Reader> = files
        .iter()
        .map(|file| {
            start(&read_args(
                &q.all,
                &range,
                "four",
                &[
                    "--state-every",
                    &every,
                    "--state-file",
                    file,
                    "--take",
                    &every,
                ],
            ))
        })
        .collect();
    let mut got = Vec::new();
    for reader in readers {
        let (ok, lines) = reader.finish(Vec::new(), Duration::from_secs(120));
        assert!(ok, "a reader taking its state failed");
        assert_eq!(lines.len(), EVERY);
        got.extend(lines);
    }
    let states: Vec<serde_json::Value> = files.iter().map(|f| state_in(Path::new(f))).collect();
    for state in &states {
        assert_eq!(step_of(state), EVERY, "{state}");
        assert_eq!(state["epoch"], states[0]["epoch"], "{state}");
    }
    let mut names: Vec<&str> = states
        .iter()
        .map(|s| s["reader"].as_str().expect("a reader name"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 4, "four readers, four names: {names:?}");
    // Two ranks restored from two of the states read what none of the four had taken, once.
    let resumed: Vec<Reader> = [&files[0], &files[2]]
        .into_iter()
        .map(|file| {
            start(&read_args(
                &q.all,
                &range,
                "four",
                &["--resume", file, "--rate", "4000"],
            ))
        })
        .collect();
    let mut per_reader = Vec::new();
    for reader in resumed {
        let (ok, lines) = reader.finish(Vec::new(), Duration::from_secs(120));
        assert!(ok, "a resumed reader failed");
        per_reader.push(lines.len());
        got.extend(lines);
    }
    eprintln!("the resumed readers read {per_reader:?}");
    assert_exactly_once(&got, N);
    // A third rank restoring late, after the restored epoch ended, joins it: it gets the end,
    // not the epoch again.
    let late = read_all(&read_args(&q.all, &range, "four", &["--resume", &files[3]]));
    assert_eq!(
        late,
        Vec::<String>::new(),
        "a late rank read the epoch again"
    );
}

/// A reader of job `job` that takes its state at `2 * EVERY` and stops: its lines and the state
/// file.
fn reader_stopping_at_its_state(all: &str, job: &str, dir: &Path) -> (Vec<String>, String) {
    let state_file = dir.join(format!("{job}.json"));
    let every = EVERY.to_string();
    let take = (2 * EVERY).to_string();
    let range = format!("range({N})");
    let got = read_all(&read_args(
        all,
        &range,
        job,
        &[
            "--state-every",
            &every,
            "--state-file",
            path_str(&state_file),
            "--take",
            &take,
        ],
    ));
    assert_eq!(step_of(&state_in(&state_file)), got.len());
    (got, path_str(&state_file).to_string())
}

#[test]
fn a_state_taken_before_the_leader_was_killed_resumes_under_the_next_leader() {
    let data = tempfile::tempdir().expect("temp dir");
    let mut q = quorum(data.path(), 2);
    let (mut got, state) = reader_stopping_at_its_state(&q.all, "leader-killed", data.path());
    let flags = Flags::plain();
    let leader = wait_leader(&q.all, &flags);
    q.nodes[leader as usize - 1].kill();
    let next = wait_leader(&q.all, &flags);
    assert_ne!(next, leader);
    let range = format!("range({N})");
    got.extend(read_all(&read_args(
        &q.all,
        &range,
        "leader-killed",
        &["--resume", &state],
    )));
    assert_exactly_once(&got, N);
}

#[test]
fn a_state_taken_before_the_whole_quorum_restarted_resumes_from_the_data_dirs() {
    let data = tempfile::tempdir().expect("temp dir");
    let mut q = quorum(data.path(), 2);
    let (mut got, state) = reader_stopping_at_its_state(&q.all, "restarted", data.path());
    for node in &mut q.nodes {
        node.kill();
    }
    for (node, args) in q.nodes.iter_mut().zip(&q.args) {
        *node = spawn(args);
    }
    wait_leader(&q.all, &Flags::plain());
    let range = format!("range({N})");
    got.extend(read_all(&read_args(
        &q.all,
        &range,
        "restarted",
        &["--resume", &state],
    )));
    assert_exactly_once(&got, N);
}

/// `sluice read <args>` expected to fail: its stdout and stderr.
fn read_failing_with_output(args: &[String]) -> (String, String) {
    let mut all = vec!["read"];
    all.extend(args.iter().map(String::as_str));
    let (ok, out, err) = sluice(&all);
    assert!(!ok, "sluice read {args:?} succeeded: {out}");
    (out, err)
}

/// `sluice read <args>` expected to fail: its stderr.
fn read_failing(args: &[String]) -> String {
    read_failing_with_output(args).1
}

/// Whether the quorum at `all` keeps a job named `name` (`None`: no status).
fn job_kept(all: &str, name: &str) -> Option<bool> {
    let (ok, out, _) = sluice(&["status", "--dispatcher", all]);
    let status: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
    let jobs = status["jobs"].as_array()?;
    Some(jobs.iter().any(|j| j["name"] == name))
}

#[test]
fn a_state_of_another_dataset_a_newer_format_or_an_at_most_once_job_is_refused() {
    let data = tempfile::tempdir().expect("temp dir");
    // A finished job is forgotten a second after its last reader left; its states outlive it.
    let q = quorum_with(data.path(), 1, &["--job-gc-timeout", "1s"]);
    let (_, state_path) = reader_stopping_at_its_state(&q.all, "refusing", data.path());
    let state = state_in(Path::new(&state_path));
    let other = format!("range({})", N + 1);

    // The same job name on another dataset while the job is there: the job refuses it.
    let err = read_failing(&read_args(
        &q.all,
        &other,
        "refusing",
        &["--resume", &state_path],
    ));
    assert!(
        err.contains("existing job with different parameters"),
        "{err}"
    );

    // A state of a job read to its end, and forgotten since: a new job of that name on another
    // dataset is refused the state, naming the definition the state was taken on and the job's.
    let every = EVERY.to_string();
    let range = format!("range({N})");
    let finished_path = data.path().join("finished.json");
    let read = read_all(&read_args(
        &q.all,
        &range,
        "finished",
        &[
            "--state-every",
            &every,
            "--state-file",
            path_str(&finished_path),
        ],
    ));
    assert_exactly_once(&read, N);
    let finished = state_in(&finished_path);
    let definition = finished["dataset"].as_str().expect("a definition key");
    assert_eq!(finished["dataset"], state["dataset"]);
    wait_until_blocking(
        "the finished job forgotten",
        Duration::from_secs(60),
        || job_kept(&q.all, "finished") == Some(false),
    )
    .unwrap();
    let err = read_failing(&read_args(
        &q.all,
        &other,
        "finished",
        &["--resume", path_str(&finished_path)],
    ));
    assert!(err.contains(definition), "{err}");
    let others: Vec<&str> = err
        .split(|c: char| !c.is_ascii_hexdigit())
        .filter(|w| w.len() >= 16 && *w != definition)
        .collect();
    assert!(
        !others.is_empty(),
        "the error names only the state's definition: {err}"
    );

    // A newer format than this build writes.
    let mut newer = state.clone();
    newer["format"] = 2.into();
    let newer_path = data.path().join("newer.json");
    std::fs::write(&newer_path, newer.to_string()).expect("write a state");
    let err = read_failing(&read_args(
        &q.all,
        &range,
        "refusing",
        &["--resume", path_str(&newer_path)],
    ));
    assert!(err.contains("format 2, newer"), "{err}");

    // A job that delivers at most once, or no named job, takes no state: refused before any
    // element is read.
    let amo = data.path().join("amo.json");
    let (out, err) = read_failing_with_output(&read_args(
        &q.all,
        &range,
        "at-most-once",
        &[
            "--delivery",
            "at-most-once",
            "--state-every",
            &every,
            "--state-file",
            path_str(&amo),
        ],
    ));
    assert!(err.contains("--delivery at-most-once"), "{err}");
    assert_eq!(out, "", "elements were read before the refusal");
    assert!(!amo.exists());
    let (out, err) = read_failing_with_output(
        &[
            "--dispatcher",
            &q.all,
            "--dataset",
            &range,
            "--mode",
            "distributed_epoch",
            "--state-every",
            &every,
            "--state-file",
            path_str(&amo),
        ]
        .map(str::to_string),
    );
    assert!(err.contains("need a named job (--job-name)"), "{err}");
    assert_eq!(out, "", "elements were read before the refusal");
}
