//! Galera's claims (MariaDB Galera Cluster): a transaction does not see
//! row locks held on other nodes. A claim's `FOR UPDATE SKIP LOCKED` skips
//! only the rows locked on its own node, and a handler's state check
//! (`FOR UPDATE`) waits only for its own node's transactions; conflicting
//! writes from two nodes are caught at commit by certification (first
//! committer wins; the second's commit is refused with a deadlock error,
//! which the relay retries as any refused commit).
//!
//! A small model of one outbox row and its entity, one relay per node.
//! Each transaction reads the committed rows when it runs (the node
//! applied every earlier commit: `wsrep_sync_wait`), writes locally, and
//! commits through certification: refused if a row it wrote was committed
//! by another node since it read it. The relay's steps as in the main
//! model: the claim (attempts + 1, the owner), the handler's transaction
//! (the fenced success update, the state check, the effect and the
//! transition), the lease running out at any time.

use stateright::{Model, Property};

/// A deliberate fault: commits not certified (last writer wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GaleraMutation {
    /// No certification: a node's commit applies its writes over another
    /// node's, as if the rows had been locked.
    NoCertification,
}

/// The bound of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaleraConfig {
    /// Nodes, each running one relay.
    pub nodes: usize,
    /// The most claims of the row.
    pub max_claims: u8,
    /// The deliberate fault, if any.
    pub mutation: Option<GaleraMutation>,
}

impl GaleraConfig {
    /// `nodes` nodes, at most 3 claims.
    pub fn new(nodes: usize) -> Self {
        GaleraConfig {
            nodes,
            max_claims: 3,
            mutation: None,
        }
    }
}

/// The committed rows, with a version each (bumped by every commit that
/// writes it: certification compares them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rows {
    /// The outbox row: `success`.
    pub success: bool,
    /// Its lease owner (a node), while leased.
    pub owner: Option<u8>,
    /// Its `attempts`.
    pub attempts: u8,
    /// Its lease is running.
    pub lease: bool,
    /// The outbox row's version.
    pub outbox_version: u8,
    /// The entity's state: done.
    pub done: bool,
    /// The effects committed.
    pub effects: u8,
    /// The entity's version.
    pub entity_version: u8,
}

/// A node's relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// Between rounds.
    Idle,
    /// A claim read the row at this version; its commit is next.
    Claiming {
        /// The version read.
        read: u8,
        /// The attempts it writes.
        attempt: u8,
    },
    /// Holding the lease of `attempt`: its handler's transaction is next.
    Holding(u8),
    /// The handler's transaction read and wrote locally; its commit next.
    Handling {
        /// The attempt.
        attempt: u8,
        /// The outbox row's version read.
        outbox: u8,
        /// The entity's version read.
        entity: u8,
        /// The fenced update matched and the guard found the action not
        /// done: the effect is written.
        effect: bool,
        /// The fenced update matched.
        held: bool,
    },
}

/// The state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GaleraState {
    /// The committed rows.
    pub rows: Rows,
    /// The nodes' relays.
    pub nodes: Vec<Node>,
    /// Claims committed.
    pub claims: u8,
    /// A commit was refused by certification.
    pub conflicted: bool,
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GaleraAction {
    /// The lease runs out.
    Expire,
    /// Node `n`'s relay's next step.
    Step(u8),
}

/// Every committed claim's attempt is counted (no lost update).
pub const CLAIMS_COUNTED: &str = "every committed claim increments attempts";
/// The effect is committed at most once.
pub const AT_MOST_ONCE: &str = "the effect is committed at most once across nodes";
/// Reachable: a commit refused by certification.
pub const CERTIFICATION_CONFLICT: &str = "a commit is refused by certification";

impl Model for GaleraConfig {
    type State = GaleraState;
    type Action = GaleraAction;

    fn init_states(&self) -> Vec<GaleraState> {
        vec![GaleraState {
            rows: Rows::default(),
            nodes: vec![Node::Idle; self.nodes],
            claims: 0,
            conflicted: false,
        }]
    }

    fn actions(&self, s: &GaleraState, actions: &mut Vec<GaleraAction>) {
        if s.rows.lease {
            actions.push(GaleraAction::Expire);
        }
        for n in 0..s.nodes.len() {
            actions.push(GaleraAction::Step(n as u8));
        }
    }

    fn next_state(&self, last: &GaleraState, action: GaleraAction) -> Option<GaleraState> {
        let mut s = last.clone();
        let certify = self.mutation != Some(GaleraMutation::NoCertification);
        let n = match action {
            GaleraAction::Expire => {
                s.rows.lease = false;
                return Some(s);
            }
            GaleraAction::Step(n) => n as usize,
        };
        let me = n as u8;
        let r = &mut s.rows;
        s.nodes[n] = match s.nodes[n] {
            Node::Idle => {
                // `FOR UPDATE SKIP LOCKED` sees no lock of another node.
                if r.success || r.lease || r.attempts >= self.max_claims {
                    return None;
                }
                Node::Claiming {
                    read: r.outbox_version,
                    attempt: r.attempts + 1,
                }
            }
            Node::Claiming { read, attempt } => {
                if certify && r.outbox_version != read {
                    s.conflicted = true;
                    Node::Idle
                } else {
                    r.attempts = attempt;
                    r.owner = Some(me);
                    r.lease = true;
                    r.outbox_version += 1;
                    s.claims += 1;
                    Node::Holding(attempt)
                }
            }
            Node::Holding(attempt) => {
                let held = !r.success && r.owner == Some(me) && r.attempts == attempt;
                Node::Handling {
                    attempt,
                    outbox: r.outbox_version,
                    entity: r.entity_version,
                    effect: held && !r.done,
                    held,
                }
            }
            Node::Handling {
                outbox,
                entity,
                effect,
                held,
                ..
            } => {
                if !held {
                    // The fence refused: rolled back, left to the holder.
                    return Some(GaleraState {
                        nodes: {
                            let mut nodes = s.nodes.clone();
                            nodes[n] = Node::Idle;
                            nodes
                        },
                        ..s
                    });
                }
                if certify && (r.outbox_version != outbox || r.entity_version != entity) {
                    // Refused: the relay's bookkeeping retries (the
                    // message stays pending under this lease).
                    s.conflicted = true;
                } else {
                    r.success = true;
                    r.owner = None;
                    r.lease = false;
                    r.outbox_version += 1;
                    if effect {
                        r.done = true;
                        r.effects += 1;
                    }
                    r.entity_version += 1;
                }
                Node::Idle
            }
        };
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(CLAIMS_COUNTED, |_, s: &GaleraState| {
                s.rows.attempts == s.claims
            }),
            Property::always(AT_MOST_ONCE, |_, s: &GaleraState| s.rows.effects <= 1),
            Property::sometimes(CERTIFICATION_CONFLICT, |_, s: &GaleraState| s.conflicted),
        ]
    }
}
