//! What every controller runs on, so the CocoonHibernation controller, the schedule
//! controller and the next one share one shape: when a failed pass looks again
//! ([`retry`]).

pub mod retry;
