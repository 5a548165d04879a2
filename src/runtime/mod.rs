//! What every controller runs on, so the CocoonHibernation controller, the schedule
//! controller and the next one share one shape: whether a pass may write ([`gate`]),
//! how a finalizer is added and removed ([`finalizers`]), how events are published ([`events`]), when a failed pass looks again
//! ([`retry`]), what wakes a pass ([`trigger`]), and where a pass waits ([`limits`]).

pub mod events;
pub mod finalizers;
pub mod gate;
pub mod limits;
pub mod retry;
pub mod trigger;
pub mod wiring;
