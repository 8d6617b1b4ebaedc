//! The faults a test drives on a [`Patroni`] cluster: the leader killed,
//! frozen and woken, a member restarted, and the wait for the new leader.

use super::Patroni;
use super::node::Part;
use super::rest;
use std::time::{Duration, Instant};

impl Patroni {
    pub(super) fn leader_or_panic(&self, leader: Option<usize>) -> usize {
        leader.unwrap_or_else(|| panic!("no leader\n{}", self.log_tails()))
    }

    /// Kills the leader's Patroni and PostgreSQL with SIGKILL, all at once
    /// (a machine crash: no demotion, no shutdown). It stays dead until
    /// [`restart`](Patroni::restart)ed. Returns the member.
    ///
    /// # Panics
    ///
    /// When there is no leader.
    pub async fn kill9_leader(&self) -> usize {
        let i = self.leader_or_panic(self.leader().await);
        self.nodes[i].kill9();
        *self.fault.lock().expect("fault") = Some((i, Instant::now()));
        i
    }

    /// Freezes the leader: SIGSTOP to its Patroni and every PostgreSQL
    /// process (a machine that stops answering, a long pause), so that
    /// its lock expires and another member takes over while it still
    /// believes it leads. Returns the member; [`sigcont`](Patroni::sigcont)
    /// wakes it.
    ///
    /// # Panics
    ///
    /// When there is no leader.
    pub async fn sigstop_leader(&self) -> usize {
        let i = self.leader_or_panic(self.leader().await);
        self.nodes[i].signal("STOP", Part::Both);
        *self.fault.lock().expect("fault") = Some((i, Instant::now()));
        i
    }

    /// Wakes member `i`'s PostgreSQL only (SIGCONT), its Patroni still
    /// frozen: an old primary that runs again before its manager can
    /// demote it.
    ///
    /// # Panics
    ///
    /// When there is no member `i`.
    pub fn sigcont_postgres(&self, i: usize) {
        self.nodes[i].signal("CONT", Part::Postgres);
    }

    /// Wakes member `i` (SIGCONT to its Patroni and PostgreSQL).
    ///
    /// # Panics
    ///
    /// When there is no member `i`.
    pub fn sigcont(&self, i: usize) {
        self.nodes[i].signal("CONT", Part::Both);
    }

    /// Starts member `i`'s Patroni again after
    /// [`kill9_leader`](Patroni::kill9_leader): it rejoins as a standby of
    /// the new leader (`pg_rewind`, or a new base backup if that fails).
    ///
    /// # Panics
    ///
    /// When there is no member `i`.
    pub fn restart(&self, i: usize) {
        self.nodes[i].spawn();
    }

    /// Waits until a member other than the one last killed or frozen is
    /// the leader (`GET /primary` answers 200), and returns the time since
    /// the fault.
    ///
    /// # Panics
    ///
    /// Without a fault before, or when no new leader is there 60 s after
    /// it.
    pub async fn wait_for_new_leader(&self) -> Duration {
        let (old, at) = self
            .fault
            .lock()
            .expect("fault")
            .expect("kill9_leader or sigstop_leader first");
        loop {
            for (i, n) in self.nodes.iter().enumerate() {
                if i != old && rest::is(n.rest_port, "/primary").await {
                    return at.elapsed();
                }
            }
            assert!(
                at.elapsed() < Duration::from_secs(60),
                "no new leader 60 s after the fault\n{}",
                self.log_tails()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
