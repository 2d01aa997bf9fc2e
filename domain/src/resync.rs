//! The resync plan: after a reconnect or a restart, the side that is the source of truth for
//! a set of resources compares its spec checksums with the replica's and works out what to
//! send and what the replica must delete. Deletions made while apart are therefore applied
//! (the replica's extra copies are deleted) rather than resurrected.
//!
//! Where the source of truth also owns the status (an autonomous agent's Applications), it
//! reports status checksums beside the spec checksums, and an object whose status differs
//! is sent as well: a status change the replica missed (made while the agent was down, or
//! lost with a restart) would otherwise never be sent again, since the specs agree.

use std::collections::BTreeMap;

use argocd_agent_proto::eventstream::{ResourceChecksum, ResyncState};

/// Name -> spec checksum of one side's resources of one kind.
pub type Checksums = BTreeMap<String, String>;

/// hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Checksum of the sorted key list (what upstream compares to detect missing objects).
pub fn key_list_checksum(checksums: &Checksums) -> String {
    let mut joined = String::new();
    for k in checksums.keys() {
        joined.push_str(k);
        joined.push('\n');
    }
    sha256_hex(joined.as_bytes())
}

/// Capability of periodic resync: the agent sends `resync` events while connected (its
/// `--resync-interval`), the principal answers each with a resync round, at most one per
/// its `--resync-min-interval` (upstream's PR #1037 names the two flags).
pub const PERIODIC_CAPABILITY: &str = "resync.periodic.v1";

/// Kind under which a managed agent lists, in its hello, the spoke-authored Applications
/// (app-of-apps children) it publishes: kept apart from `Application` so that a principal
/// never takes them for managed copies (and an earlier principal ignores them).
pub const CHILD_APPLICATION_KIND: &str = "Application/child";

/// Builds the wire form of one side's state.
pub fn to_state(kind: &str, checksums: &Checksums) -> ResyncState {
    ResyncState {
        key_list_checksum: key_list_checksum(checksums),
        resources: checksums
            .iter()
            .map(|(name, sum)| ResourceChecksum {
                kind: kind.to_owned(),
                name: name.clone(),
                spec_checksum: sum.clone(),
                version: String::new(),
                source_uid: String::new(),
                status_checksum: String::new(),
            })
            .collect(),
    }
}

/// Reads the peer's state for one kind, ignoring malformed entries.
pub fn from_state(kind: &str, state: &ResyncState) -> Checksums {
    state
        .resources
        .iter()
        .filter(|r| r.kind == kind && !r.name.is_empty())
        .map(|r| (r.name.clone(), r.spec_checksum.clone()))
        .collect()
}

/// Reads the status checksums the peer reports for one kind. Entries without one (a peer
/// of an earlier version, or a kind whose status it does not own) are skipped: their status
/// takes no part in the comparison.
pub fn status_checksums_from_state(kind: &str, state: &ResyncState) -> Checksums {
    state
        .resources
        .iter()
        .filter(|r| r.kind == kind && !r.name.is_empty() && !r.status_checksum.is_empty())
        .map(|r| (r.name.clone(), r.status_checksum.clone()))
        .collect()
}

/// Name -> UID of the source object a replica's copy was made from.
pub type SourceUids = BTreeMap<String, String>;

/// Reads the source UIDs the peer reports for one kind (entries without one are skipped).
pub fn source_uids_from_state(kind: &str, state: &ResyncState) -> SourceUids {
    state
        .resources
        .iter()
        .filter(|r| r.kind == kind && !r.name.is_empty() && !r.source_uid.is_empty())
        .map(|r| (r.name.clone(), r.source_uid.clone()))
        .collect()
}

/// Copies made from another source object than the current one of the same name (deleted
/// and recreated while apart): the source resends these even when the specs are equal.
pub fn stale_copies(source: &SourceUids, replica: &SourceUids) -> Vec<String> {
    replica
        .iter()
        .filter(|(name, uid)| source.get(*name).is_some_and(|s| s != *uid))
        .map(|(name, _)| name.clone())
        .collect()
}

/// What differs between the source of truth and its replica.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResyncPlan {
    /// Missing at the replica or different there: the source sends these.
    pub send: Vec<String>,
    /// Present at the replica only: the replica deletes these.
    pub delete: Vec<String>,
}

impl ResyncPlan {
    /// Whether nothing needs sending or deleting.
    pub fn is_empty(&self) -> bool {
        self.send.is_empty() && self.delete.is_empty()
    }

    /// Also sends the objects the replica holds with another status than the source
    /// reported (`source`: status checksums the source reported; `replica`: the replica's
    /// status checksums). Objects the source reported no status checksum for, and those
    /// the replica lacks (already sent), are left as they are. `send` stays sorted.
    pub fn send_stale_statuses(&mut self, source: &Checksums, replica: &Checksums) {
        let mut added = false;
        for (name, sum) in source {
            if replica.get(name).is_some_and(|r| r != sum) && !self.send.iter().any(|n| n == name) {
                self.send.push(name.clone());
                added = true;
            }
        }
        if added {
            self.send.sort();
        }
    }
}

/// Compares the source's checksums with the replica's.
pub fn plan(source: &Checksums, replica: &Checksums) -> ResyncPlan {
    let mut p = ResyncPlan::default();
    for (name, sum) in source {
        if replica.get(name) != Some(sum) {
            p.send.push(name.clone());
        }
    }
    for name in replica.keys() {
        if !source.contains_key(name) {
            p.delete.push(name.clone());
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_of_a_recreated_source_are_stale() {
        let source: SourceUids = [("a", "uid-1"), ("b", "uid-9")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let replica: SourceUids = [("a", "uid-1"), ("b", "uid-2"), ("c", "uid-3")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(stale_copies(&source, &replica), vec!["b".to_owned()]);
    }

    fn c(items: &[(&str, &str)]) -> Checksums {
        items
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn equal_sides_need_nothing() {
        let a = c(&[("x", "1"), ("y", "2")]);
        assert!(plan(&a, &a.clone()).is_empty());
    }

    #[test]
    fn changed_and_missing_are_sent_and_extra_are_deleted() {
        let src = c(&[("changed", "2"), ("missing", "1"), ("same", "1")]);
        let rep = c(&[("changed", "1"), ("extra", "1"), ("same", "1")]);
        let p = plan(&src, &rep);
        assert_eq!(p.send, vec!["changed", "missing"]);
        assert_eq!(p.delete, vec!["extra"]);
    }

    /// Specs equal, statuses not: the source sends the object again (a status change the
    /// replica missed, e.g. made while the agent was down, is never lost for good).
    #[test]
    fn a_stale_status_is_sent_even_when_the_specs_agree() {
        let specs = c(&[("a", "1"), ("b", "1"), ("c", "1")]);
        let mut p = plan(&specs, &c(&[("a", "1"), ("b", "1"), ("c", "0")]));
        assert_eq!(p.send, vec!["c"]);
        // "a": newer status at the source; "b": the same; "c": already sent; "d": the
        // replica lacks it (sent by the spec plan when the source has it).
        let source = c(&[("a", "s2"), ("b", "s1"), ("c", "s9"), ("d", "s1")]);
        let replica = c(&[("a", "s1"), ("b", "s1"), ("c", "s1")]);
        p.send_stale_statuses(&source, &replica);
        assert_eq!(p.send, vec!["a", "c"]);
        // A source that reports no status checksums (an earlier version) adds nothing.
        let mut q = plan(&specs, &specs);
        q.send_stale_statuses(&Checksums::new(), &replica);
        assert!(q.is_empty());
    }

    #[test]
    fn status_checksums_are_read_only_where_reported() {
        let mut st = to_state("Application", &c(&[("a", "1"), ("b", "2")]));
        st.resources[0].status_checksum = "s-a".into();
        assert_eq!(
            status_checksums_from_state("Application", &st),
            c(&[("a", "s-a")])
        );
        assert!(status_checksums_from_state("AppProject", &st).is_empty());
    }

    #[test]
    fn state_round_trips_and_key_list_checksum_is_order_independent() {
        let a = c(&[("b", "2"), ("a", "1")]);
        let st = to_state("Application", &a);
        assert_eq!(from_state("Application", &st), a);
        assert!(from_state("AppProject", &st).is_empty());
        assert_eq!(
            st.key_list_checksum,
            key_list_checksum(&c(&[("a", "x"), ("b", "y")]))
        );
    }
}
