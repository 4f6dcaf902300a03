//! nx collectives: communicators (sim, MPI, NCCL) and the executor of placement plans. Not built yet.
