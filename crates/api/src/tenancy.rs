//! S12 Tenants learn nothing of each other: how a condition, an event or an admission
//! message names a CocoonHibernation, as seen from the namespace that reads it.

/// What a message says in place of a CR or pod of another namespace: never its
/// namespace or name.
pub const ANOTHER_NAMESPACE: &str = "a CR in another namespace";

/// `CocoonHibernation <ns>/<name>` for a CR of the reader's own namespace, else
/// [`ANOTHER_NAMESPACE`].
pub fn name_cr(reader_ns: &str, ns: &str, name: &str) -> String {
    if reader_ns == ns {
        format!("CocoonHibernation {ns}/{name}")
    } else {
        ANOTHER_NAMESPACE.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// S12: a CR of the reader's namespace is named; one of another namespace is not,
    /// even when only the namespace differs.
    #[rstest::rstest]
    #[case::s12_same_namespace("team-a", "team-a", "db-0", Some("CocoonHibernation team-a/db-0"))]
    #[case::s12_other_namespace("team-a", "team-b", "db-0", None)]
    #[case::s12_same_name_other_namespace("team-a", "team-ab", "team-a", None)]
    fn s12_name_cr(
        #[case] reader: &str,
        #[case] ns: &str,
        #[case] name: &str,
        #[case] want: Option<&str>,
    ) {
        let got = name_cr(reader, ns, name);
        match want {
            Some(want) => assert_eq!(got, want),
            None => {
                assert_eq!(got, ANOTHER_NAMESPACE);
                assert!(!got.contains(ns) && !got.contains(name), "{got}");
            }
        }
    }
}
