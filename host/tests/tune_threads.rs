//! `gpuheap tune` runs its settings in parallel (rayon): the report is the same on one thread as on
//! several, row by row (ranks, figures, notes and replay counts), on shipped snapshots with and without a
//! recorded OOM.

mod common;

use gpuheap::explain::tune::{tune_page, TuneReport};
use gpuheap::trace::read_trace;

use common::workspace;

/// The search of `file` (under `data/`) in a pool of `threads` threads.
fn tune_on(file: &str, threads: usize) -> TuneReport {
    let path = workspace().join("data").join(file);
    let trace = read_trace(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
    let page = pool.install(|| tune_page(&trace, None, None, &|| {})).unwrap_or_else(|e| panic!("{file}: {e}"));
    page.tune
}

#[test]
fn tune_is_the_same_on_one_and_on_two_threads() {
    for file in ["decomfl_opt_zo_federated_memory.pickle", "equivariant-posteriors_oom_snapshot_new.pickle"] {
        let one = tune_on(file, 1);
        let two = tune_on(file, 2);
        assert!(one.rows.len() > 10, "{file}: {} rows", one.rows.len());
        assert!(one.replays > one.rows.len() * 2, "{file}: {} replays", one.replays);
        assert_eq!(one, two, "{file}: the report on 1 thread differs from the one on 2");
    }
}
