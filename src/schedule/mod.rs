//! CocoonHibernationSchedule (K1–K8): flips the CocoonHibernations of the pods it selects
//! on a weekly calendar. Pure calendar in [`calendar`], the API in [`spec`].

pub mod calendar;
pub mod plan;
pub mod spec;

pub use spec::{CocoonHibernationSchedule, CocoonHibernationScheduleSpec};
