//! The library behind the `nx` command: the rendezvous store server, the rank supervisor of
//! `nx run` and the per-rank wrapper it starts ranks through under mpirun.

pub mod child;
pub mod rank;
pub mod run;
pub mod store;
