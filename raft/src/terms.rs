//! Which Raft terms a node accepts. Pure rules, no I/O.
//!
//! openraft adopts any higher term it hears and persists it, and adds 1 to
//! its term when it campaigns; a message carrying `u64::MAX` made a leader
//! adopt it and then panic at its next election, on every restart, and the
//! term spread to the next node. So:
//!
//! - no term at or above [`TERM_CEILING`] (2^62) is ever accepted or loaded:
//!   a node campaigning every 150 ms would need 2·10^10 years to get there;
//! - a message more than [`MAX_TERM_JUMP`] (2^32) terms ahead of this node is
//!   refused: a partitioned node campaigning every 150 ms gains under 7
//!   terms a second, so it would take about 20 years to be that far ahead.
//!
//! A moderate jump (a peer that really was partitioned, or a forged vote
//! within the jump) still makes a leader step down as Raft requires; keeping
//! strangers off the Raft port is the job of authentication, not of this rule.

/// No accepted or persisted term reaches this.
pub const TERM_CEILING: u64 = 1 << 62;

/// The most terms a message may be ahead of this node.
pub const MAX_TERM_JUMP: u64 = 1 << 32;

/// Whether a message from a peer at term `theirs` may reach openraft, here
/// at term `ours`.
pub fn check_incoming(ours: u64, theirs: u64) -> Result<(), String> {
    if theirs >= TERM_CEILING {
        return Err(format!(
            "term {theirs} is beyond any reachable term (2^62); refused"
        ));
    }
    if theirs > ours.saturating_add(MAX_TERM_JUMP) {
        return Err(format!(
            "term {theirs} is more than 2^32 terms ahead of this node's {ours}; refused"
        ));
    }
    Ok(())
}

/// Whether a term read back from disk can be used.
pub fn check_persisted(term: u64) -> Result<(), String> {
    if term >= TERM_CEILING {
        return Err(format!(
            "the persisted vote has term {term}, beyond any reachable term (2^62): \
             the data directory is corrupt or was given a forged term; \
             restore this master from its peers (remove it, wipe its data dir, add it again)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_terms_and_jumps_are_accepted() {
        assert!(check_incoming(0, 0).is_ok());
        assert!(check_incoming(5, 4).is_ok());
        assert!(check_incoming(5, 1005).is_ok());
        assert!(check_incoming(5, 5 + MAX_TERM_JUMP).is_ok());
        assert!(check_persisted(0).is_ok());
        assert!(check_persisted(TERM_CEILING - 1).is_ok());
    }

    #[test]
    fn absurd_terms_are_refused_whatever_ours_is() {
        for ours in [0, 7, TERM_CEILING - 1, u64::MAX] {
            assert!(check_incoming(ours, u64::MAX).is_err(), "{ours}");
            assert!(check_incoming(ours, TERM_CEILING).is_err(), "{ours}");
        }
        assert!(check_incoming(5, 6 + MAX_TERM_JUMP).is_err());
        assert!(check_persisted(u64::MAX).is_err());
        assert!(check_persisted(TERM_CEILING).is_err());
    }
}
