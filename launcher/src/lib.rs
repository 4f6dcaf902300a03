//! The library behind the `nx` command: the rendezvous store server and the rank supervisor of
//! `nx run`.

pub mod run;
pub mod store;
