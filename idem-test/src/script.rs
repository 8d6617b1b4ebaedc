//! A fault scripted on one commit: the `n`-th commit from now loses its
//! acknowledgement, is cut before it happens, or is held. The fault proxy
//! applies it to the `COMMIT`s it forwards, the SQLite backend to the
//! commits its connections make (through SQLite's commit hook).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

/// What a scripted fault does to its commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitFault {
    /// The commit happens, and its acknowledgement never reaches the
    /// caller: the proxy throws the server's reply away and closes the
    /// connection; on SQLite the caller's future is dropped while it
    /// commits.
    LoseAck,
    /// The commit never happens: the proxy closes the connection before the
    /// server has the whole `COMMIT` (the server rolls back); on SQLite the
    /// commit hook turns it into a rollback and the caller's future is
    /// dropped. What a call cancelled after its statements leaves behind.
    Cut,
    /// The commit waits this long, its locks held, then goes on.
    Hold(Duration),
}

/// One armed fault and its count-down.
#[derive(Debug)]
struct Armed {
    /// Commits still to let through before the faulted one, plus one.
    countdown: u64,
    fault: CommitFault,
    fired: Option<oneshot::Sender<()>>,
}

/// The script: at most one armed fault, and the commits seen.
#[derive(Debug, Default)]
pub(crate) struct Script {
    armed: Mutex<Option<Armed>>,
    seen: AtomicU64,
    fired: AtomicU64,
}

impl Script {
    /// Arms `fault` on the `nth` commit from now (1: the next one),
    /// replacing any armed fault. The receiver resolves when it fires.
    pub(crate) fn arm(&self, nth: u64, fault: CommitFault) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        *self.lock() = Some(Armed {
            countdown: nth.max(1),
            fault,
            fired: Some(tx),
        });
        rx
    }

    /// Disarms the armed fault, if it has not fired.
    pub(crate) fn disarm(&self) {
        *self.lock() = None;
    }

    /// A commit is about to happen: the fault to apply to it, if it is the
    /// scripted one.
    pub(crate) fn on_commit(&self) -> Option<CommitFault> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        let mut armed = self.lock();
        let a = armed.as_mut()?;
        a.countdown -= 1;
        if a.countdown > 0 {
            return None;
        }
        let mut a = armed.take()?;
        self.fired.fetch_add(1, Ordering::SeqCst);
        if let Some(tx) = a.fired.take() {
            let _ = tx.send(());
        }
        Some(a.fault)
    }

    /// How many commits were seen.
    #[cfg(any(test, feature = "sqlite"))]
    pub(crate) fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// How many scripted faults fired.
    pub(crate) fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Armed>> {
        // A panic while holding the lock leaves nothing half-written.
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_on_the_nth_commit_only() {
        let s = Script::default();
        let mut rx = s.arm(2, CommitFault::Cut);
        assert_eq!(s.on_commit(), None);
        assert!(rx.try_recv().is_err());
        assert_eq!(s.on_commit(), Some(CommitFault::Cut));
        assert!(rx.try_recv().is_ok());
        assert_eq!(s.on_commit(), None);
        assert_eq!((s.seen(), s.fired()), (3, 1));
    }

    #[test]
    fn disarmed_never_fires() {
        let s = Script::default();
        let _rx = s.arm(1, CommitFault::LoseAck);
        s.disarm();
        assert_eq!(s.on_commit(), None);
        assert_eq!(s.fired(), 0);
    }
}
