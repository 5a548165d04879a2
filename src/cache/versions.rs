//! S4, no going back in time: the newest resourceVersion the cache took for each object,
//! so that an older copy (a list from an apiserver lagging behind the one watched before,
//! a stale event) is neither taken as a change nor allowed to replace the newer copy.
//!
//! resourceVersions of one resource type come from one etcd revision counter, so they
//! compare as integers in practice, across uids too (a CR recreated under a name has a
//! newer one than any copy of the old CR). The API calls them opaque: a version that is
//! not an integer cannot be compared and is taken as it comes, as before this guard.
//!
//! How far this goes. kube's reflector store cannot be told to refuse a copy, so the
//! driver applies each event to the store itself (no `.reflect`) and, for an older copy,
//! skips a watch event, or gives a list the store's own copy instead. So no pass and no
//! admission review reads a CR or a pod older than the cache held; the trigger decisions,
//! the CR versions, the podRef index and the pod views do not go back either. The store
//! can still lag the newest version the cache *saw* in one case: a list cut short showed
//! a newer copy that never reached the store, and the retry shows an older one. That key
//! is marked behind, and the copy that catches it up counts as a change, so a pass reads
//! it (meanwhile the index keeps the newer copy's podRef and VM). A stale delete (older
//! than the copy held) is ignored.
//!
//! What it cannot see: an object a lagging list leaves out (created after the list's
//! revision) or brings back (deleted since; a delete forgets the key). Those need the
//! list itself not to lag, which `consistent` sees to for streamed lists; paged lists are
//! consistent reads already.

use super::index::Key;
use std::cmp::Ordering;
use std::collections::HashMap;

/// How an event's copy of an object compares with the newest copy the cache took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// New, or newer than the copy taken: take it; it is a change.
    Changed,
    /// The version already taken: take it; not a change.
    Unchanged,
    /// Not older than the version taken, for a key whose store holds an older copy: take
    /// it; a change, whatever else it shows, since the store only now catches up.
    CaughtUp,
    /// Older than the copy taken: keep that one; not a change.
    Older,
}

/// Which copy a list that showed an older one should give the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The store's own copy: at least as new as the event's.
    Store,
    /// The event's copy: the store has none, or an even older one.
    Event,
}

/// `a` against `b`, or `None` when either is not an integer.
pub fn compare(a: &str, b: &str) -> Option<Ordering> {
    Some(a.parse::<u64>().ok()?.cmp(&b.parse::<u64>().ok()?))
}

#[derive(Debug)]
struct Taken {
    version: Version,
    store_behind: bool,
}

/// A resourceVersion as taken: etcd's are integers, kept without an allocation (issue 38,
/// memory); anything else as its text.
#[derive(Debug)]
enum Version {
    Number(u64),
    Text(Box<str>),
}

impl Version {
    fn of(version: &str) -> Self {
        match version.parse() {
            Ok(n) => Version::Number(n),
            Err(_) => Version::Text(version.into()),
        }
    }

    /// `version` against this one, as [`compare`]: `None` unless both are integers.
    fn compared(&self, version: &str) -> Option<Ordering> {
        match self {
            Version::Number(n) => Some(version.parse::<u64>().ok()?.cmp(n)),
            Version::Text(_) => None,
        }
    }

    fn is(&self, version: &str) -> bool {
        match self {
            Version::Number(_) => self.compared(version) == Some(Ordering::Equal),
            Version::Text(t) => **t == *version,
        }
    }
}

/// Per object (namespace, name): the newest version taken.
#[derive(Debug, Default)]
pub struct Versions {
    taken: HashMap<Key, Taken>,
}

impl Versions {
    /// Judges an applied copy of `key` at `version`, and records it unless it is older.
    pub fn observe(&mut self, key: &Key, version: &str) -> Seen {
        let Some(taken) = self.taken.get_mut(key) else {
            self.taken.insert(
                key.clone(),
                Taken {
                    version: Version::of(version),
                    store_behind: false,
                },
            );
            return Seen::Changed;
        };
        let same = match taken.version.compared(version) {
            Some(Ordering::Less) => return Seen::Older,
            Some(order) => order == Ordering::Equal,
            None => taken.version.is(version),
        };
        let seen = match (taken.store_behind, same) {
            (true, _) => Seen::CaughtUp,
            (false, true) => Seen::Unchanged,
            (false, false) => Seen::Changed,
        };
        taken.version = Version::of(version);
        taken.store_behind = false;
        seen
    }

    /// For a list that showed `key` at an older `version` ([`Seen::Older`]): the newer of
    /// the event's copy and the store's (at `store`); records whether that leaves the
    /// store behind the version taken.
    pub fn pick_for_list(&mut self, key: &Key, version: &str, store: Option<&str>) -> Pick {
        let (pick, listed) = match store {
            Some(s) if compare(s, version) != Some(Ordering::Less) => (Pick::Store, s),
            _ => (Pick::Event, version),
        };
        if let Some(taken) = self.taken.get_mut(key) {
            taken.store_behind = !taken.version.is(listed);
        }
        pick
    }

    /// A delete of `key` at `version`: true (and forgotten) unless it is older than the
    /// version taken, which means it is a stale delete of a copy the cache moved past.
    pub fn delete(&mut self, key: &Key, version: &str) -> bool {
        let stale = self
            .taken
            .get(key)
            .is_some_and(|t| t.version.compared(version) == Some(Ordering::Less));
        if !stale {
            self.taken.remove(key);
        }
        !stale
    }

    /// The object left the cache (a relist no longer lists it).
    pub fn forget(&mut self, key: &Key) {
        self.taken.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("ns", "a")
    }

    /// SPEC S4: no going back in time, per object.
    #[rstest::rstest]
    #[case::s4_first_copy_is_a_change(None, "7", Seen::Changed)]
    #[case::s4_newer_is_a_change(Some("7"), "9", Seen::Changed)]
    #[case::s4_newer_by_digits_not_by_text(Some("9"), "10", Seen::Changed)]
    #[case::s4_same_is_not_a_change(Some("7"), "7", Seen::Unchanged)]
    #[case::s4_older_is_refused(Some("10"), "9", Seen::Older)]
    #[case::s4_not_an_integer_is_taken_when_it_differs(Some("7"), "x1", Seen::Changed)]
    #[case::s4_not_an_integer_is_unchanged_when_equal(Some("x1"), "x1", Seen::Unchanged)]
    #[case::s4_an_integer_after_text_is_a_change(Some("x1"), "7", Seen::Changed)]
    #[case::s4_empty_cannot_be_compared(Some("7"), "", Seen::Changed)]
    fn s4_versions_never_go_back(
        #[case] taken: Option<&str>,
        #[case] event: &str,
        #[case] want: Seen,
    ) {
        let mut v = Versions::default();
        if let Some(t) = taken {
            v.observe(&key(), t);
        }
        assert_eq!(v.observe(&key(), event), want);
        // An older copy leaves the version taken as it was.
        if want == Seen::Older {
            assert_eq!(
                v.observe(&key(), taken.unwrap_or_default()),
                Seen::Unchanged
            );
        }
    }

    /// SPEC S4: a list showing an older copy gets the newer of the store's and the event's,
    /// and a store left behind the version taken catches up on the next copy that is not
    /// older, which counts as a change.
    #[rstest::rstest]
    #[case::s4_store_holds_the_version_taken(Some("10"), Pick::Store, "10", Seen::Unchanged)]
    #[case::s4_store_older_than_taken_is_behind(Some("8"), Pick::Store, "10", Seen::CaughtUp)]
    #[case::s4_store_older_than_the_event(Some("5"), Pick::Event, "10", Seen::CaughtUp)]
    #[case::s4_store_without_a_copy(None, Pick::Event, "10", Seen::CaughtUp)]
    #[case::s4_behind_until_not_older(Some("8"), Pick::Store, "9", Seen::Older)]
    #[case::s4_behind_caught_up_by_a_newer(Some("8"), Pick::Store, "11", Seen::CaughtUp)]
    fn s4_a_list_going_back_keeps_the_newest_copy(
        #[case] store: Option<&str>,
        #[case] want_pick: Pick,
        #[case] next: &str,
        #[case] want_next: Seen,
    ) {
        let mut v = Versions::default();
        v.observe(&key(), "10");
        assert_eq!(v.observe(&key(), "6"), Seen::Older);
        assert_eq!(v.pick_for_list(&key(), "6", store), want_pick);
        assert_eq!(v.observe(&key(), next), want_next);
    }

    /// SPEC S4: a delete older than the copy taken (of an object since recreated under the
    /// name) is stale; any other delete forgets the key.
    #[rstest::rstest]
    #[case::s4_delete_at_a_newer_version(Some("7"), "9", true)]
    #[case::s4_delete_at_the_same_version(Some("7"), "7", true)]
    #[case::s4_stale_delete(Some("9"), "7", false)]
    #[case::s4_delete_of_an_unknown_key(None, "7", true)]
    #[case::s4_delete_that_cannot_be_compared(Some("9"), "x", true)]
    fn s4_a_stale_delete_is_ignored(
        #[case] taken: Option<&str>,
        #[case] delete: &str,
        #[case] want: bool,
    ) {
        let mut v = Versions::default();
        if let Some(t) = taken {
            v.observe(&key(), t);
        }
        assert_eq!(v.delete(&key(), delete), want);
        let after = v.observe(&key(), taken.unwrap_or("1"));
        assert_eq!(after == Seen::Changed, want, "forgotten only when taken");
    }
}
