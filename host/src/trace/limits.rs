//! What a trace reader may spend on one input: the memory ceiling (`--max-memory`, environment variable
//! `GPUHEAP_MAX_MEMORY`), the size of input it reads, and the work and memory of the schema walk, all
//! derived from the input's size and the ceiling, so that no input of `n` bytes costs more than a fixed
//! multiple of `n` in time and memory, nor more than the ceiling in memory.
//!
//! Why these limits: a pickle's memo lets a small file refer to one list or dict many times, and a list
//! of `k` references to a list of `k` references to one event dict is `k²` events from `4k` bytes (a
//! "memo bomb": a 152 KB file asked for 1.9 GB before the limits, a 760 KB one for more than 8 GiB). The
//! decoder keeps every value once (module `pytorch::pickle`), so the cost appears in what the schema walk
//! makes of it: events, blocks, the dict entries it scans. The walk charges each dict entry and list item
//! it visits and each value it materialises to a `Budget`; past the budget it stops with
//! [`TraceError::Limit`], naming the limit and where the walk was.
//!
//! The limits (real snapshots stay far below them: the tests read every snapshot of `data/` and of the
//! shared collection under them):
//!
//! * input: at most [`max_memory`] / [`INPUT_SHARE`] bytes (the file's bytes, the decoded values and the
//!   events together stay under the ceiling); a pipe is read up to that cap and refused past it;
//! * walk work: [`WORK_PER_BYTE`] items per input byte plus [`WORK_FLOOR`];
//! * walk memory: [`BYTES_PER_BYTE`] bytes per input byte plus [`BYTES_FLOOR`], and never more than the
//!   ceiling.

use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Location, TraceError};

/// The reader's input may take at most this share of the memory ceiling: 1/4.
#[doc(hidden)]
pub const INPUT_SHARE: u64 = 4;
/// Dict entries and list items the schema walk may visit per byte of input.
#[doc(hidden)]
pub const WORK_PER_BYTE: u64 = 8;
/// Dict entries and list items the schema walk may always visit (a small file's walk is never refused).
#[doc(hidden)]
pub const WORK_FLOOR: u64 = 1 << 24;
/// Bytes of events, blocks and frames the schema walk may materialise per byte of input.
#[doc(hidden)]
pub const BYTES_PER_BYTE: u64 = 8;
/// Bytes the schema walk may always materialise.
#[doc(hidden)]
pub const BYTES_FLOOR: u64 = 64 << 20;

/// The ceiling set by [`set_max_memory`]; 0: the default.
static MAX_MEMORY: AtomicU64 = AtomicU64::new(0);

/// Sets the memory ceiling of every later read, bytes (`None`: back to [`default_max_memory`]). The
/// command line sets it from `--max-memory` (or `GPUHEAP_MAX_MEMORY`).
pub fn set_max_memory(bytes: Option<u64>) {
    MAX_MEMORY.store(bytes.unwrap_or(0), Ordering::Relaxed);
}

/// The memory ceiling of a read, bytes: the one set by [`set_max_memory`], else the environment
/// variable `GPUHEAP_MAX_MEMORY` (a byte count such as `8GiB`, read by [`crate::units`]; an unreadable
/// value is ignored here: the command line refuses it with exit code 2), else [`default_max_memory`].
#[doc(hidden)]
pub fn max_memory() -> u64 {
    match MAX_MEMORY.load(Ordering::Relaxed) {
        0 => std::env::var("GPUHEAP_MAX_MEMORY")
            .ok()
            .and_then(|v| crate::units::parse_bytes(&v).ok())
            .filter(|&b| b > 0)
            .unwrap_or_else(default_max_memory),
        b => b,
    }
}

/// The default memory ceiling: half of the machine's physical memory (`sysconf(_SC_PHYS_PAGES)` ×
/// page size), at least 1 GiB; 8 GiB where the machine does not say.
#[doc(hidden)]
pub fn default_max_memory() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads system configuration; it has no pointer arguments.
        let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        if pages > 0 && page > 0 {
            return ((pages as u64).saturating_mul(page as u64) / 2).max(1 << 30);
        }
    }
    8 << 30
}

/// The largest input a read accepts under the ceiling `max_memory`, bytes.
#[doc(hidden)]
pub fn max_input(max_memory: u64) -> u64 {
    max_memory / INPUT_SHARE
}

/// The error for an input larger than [`max_input`].
pub(crate) fn too_large(path: &Path, at_least: u64, max_memory: u64) -> TraceError {
    TraceError::Limit {
        path: path.to_path_buf(),
        at: Location::Byte(usize::try_from(max_input(max_memory)).unwrap_or(usize::MAX)),
        limit: format!(
            "input size: at least {} B, more than {} B, a quarter of the memory ceiling of {} B (--max-memory)",
            at_least,
            max_input(max_memory),
            max_memory
        ),
    }
}

/// What one schema walk may still spend: items visited and bytes materialised, from the input's size
/// and the ceiling ([module docs](self)).
#[derive(Debug)]
pub(crate) struct Budget {
    work_left: Cell<u64>,
    bytes_left: Cell<u64>,
    work_limit: u64,
    bytes_limit: u64,
    max_memory: u64,
}

/// Which of a [`Budget`]'s limits was passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exceeded {
    Work,
    Bytes,
}

impl Budget {
    /// The budget of a walk over an input of `input_len` bytes under the ceiling `max_memory`.
    pub(crate) fn for_input(input_len: usize, max_memory: u64) -> Budget {
        let n = input_len as u64;
        let work_limit = n.saturating_mul(WORK_PER_BYTE).saturating_add(WORK_FLOOR);
        let bytes_limit = n.saturating_mul(BYTES_PER_BYTE).saturating_add(BYTES_FLOOR).min(max_memory);
        Budget {
            work_left: Cell::new(work_limit),
            bytes_left: Cell::new(bytes_limit),
            work_limit,
            bytes_limit,
            max_memory,
        }
    }

    /// Charges `items` visited dict entries or list items.
    #[inline]
    pub(crate) fn visit(&self, items: usize) -> Result<(), Exceeded> {
        let left = self.work_left.get();
        match left.checked_sub(items as u64) {
            Some(l) => {
                self.work_left.set(l);
                Ok(())
            }
            None => Err(Exceeded::Work),
        }
    }

    /// Charges `bytes` materialised.
    #[inline]
    pub(crate) fn materialise(&self, bytes: usize) -> Result<(), Exceeded> {
        let left = self.bytes_left.get();
        match left.checked_sub(bytes as u64) {
            Some(l) => {
                self.bytes_left.set(l);
                Ok(())
            }
            None => Err(Exceeded::Bytes),
        }
    }

    /// The error for `e` at `at` in the file `path`.
    pub(crate) fn error(&self, e: Exceeded, path: &Path, at: Location) -> TraceError {
        let limit = match e {
            Exceeded::Work => format!(
                "reading work: more than {} dict entries and list items visited ({WORK_PER_BYTE} per byte of \
                 input + {WORK_FLOOR}); the pickle refers to the same values over and over (a memo bomb?)",
                self.work_limit
            ),
            Exceeded::Bytes => format!(
                "memory: more than {} B of events, blocks and frames ({BYTES_PER_BYTE} per byte of input + \
                 {BYTES_FLOOR}, at most the ceiling of {} B, --max-memory); the pickle refers to the same values \
                 over and over (a memo bomb?)",
                self.bytes_limit, self.max_memory
            ),
        };
        TraceError::Limit { path: path.to_path_buf(), at, limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_grow_with_the_input_and_stop_at_the_ceiling() {
        let b = Budget::for_input(1000, 1 << 40);
        assert_eq!(b.work_limit, 8000 + WORK_FLOOR);
        assert_eq!(b.bytes_limit, 8000 + BYTES_FLOOR);
        assert_eq!(Budget::for_input(1 << 30, 1 << 30).bytes_limit, 1 << 30, "the ceiling caps memory");
        b.visit(usize::try_from(b.work_limit).unwrap()).unwrap();
        assert_eq!(b.visit(1), Err(Exceeded::Work));
        let e = b.error(Exceeded::Work, Path::new("f.pickle"), Location::Event { device: 0, index: 3, field: None });
        let msg = e.to_string();
        assert!(msg.contains("f.pickle") && msg.contains("device 0, event 3") && msg.contains("memo bomb"), "{msg}");
        assert_eq!(max_input(1 << 32), 1 << 30);
        assert!(default_max_memory() >= 1 << 30);
    }
}
