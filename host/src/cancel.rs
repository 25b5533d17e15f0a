//! Cancellation of a running command: a flag its caller sets from another thread ([`Cancel::cancel`])
//! and the work polls where it loops anyway: the replay engine every 16,384 events
//! (`replay::engine`), and the settings search before every replay of a row
//! ([`crate::explain::tune`]). A cancelled command returns [`ReplayError::Cancelled`], an
//! [`crate::Error`] of kind [`crate::ErrorKind::Cancelled`]; its partial results are dropped.
//!
//! The Python package sets the flag on Ctrl-C (`python/src/lib.rs`: the call runs without the GIL and
//! the calling thread checks for a pending signal meanwhile), so that `KeyboardInterrupt` is raised
//! within a fraction of a second. The command line needs none: its signal handler ends the process
//! (`cli/src/output.rs` removes the temporary files first).
//!
//! Why our own: the token is one `Arc<AtomicBool>`; crates such as `tokio-util`'s `CancellationToken`
//! bring an async runtime the library does not use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::replay::ReplayError;

/// A cancellation flag shared by a command and its caller; clones share the flag. The default is a
/// flag nobody sets.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A new flag, not set.
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Asks the command to stop: it returns [`ReplayError::Cancelled`] at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// `true` once [`Cancel::cancel`] was called on this flag or a clone.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err(ReplayError::Cancelled)` once cancelled: a loop's `cancel.check()?`.
    pub(crate) fn check(&self) -> Result<(), ReplayError> {
        if self.is_cancelled() {
            Err(ReplayError::Cancelled)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone shares the flag; a new flag is not set.
    #[test]
    fn clones_share_the_flag() {
        let a = Cancel::new();
        let b = a.clone();
        assert!(!b.is_cancelled() && b.check().is_ok());
        a.cancel();
        assert!(b.is_cancelled());
        assert!(matches!(b.check(), Err(ReplayError::Cancelled)));
        assert!(!Cancel::default().is_cancelled());
    }
}
