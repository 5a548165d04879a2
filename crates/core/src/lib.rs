//! cocoon-core: every decision of cocoon-hibernation as a pure, synchronous function of
//! its inputs: the CocoonHibernation reconcile rules ([`plan`]), the schedule's calendar
//! and plan ([`schedule`]), the elector's rules ([`leader`]) and admission ([`admission`]).
//! No I/O: no tokio, no kube client; the operator fetches the inputs and carries out the
//! result.
#![forbid(unsafe_code)]

pub mod admission;
pub mod leader;
pub mod plan;
pub mod schedule;
