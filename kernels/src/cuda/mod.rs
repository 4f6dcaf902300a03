//! The CUDA kernel library's parts that need no GPU: the CUDA C each kernel is generated as
//! ([`codegen`]). The generated source is tested on every machine — compiled by the host's C++
//! compiler with the CUDA built-ins defined by a few lines and run against the host library, and
//! compiled by NVRTC for `sm_80` and `sm_90` where NVRTC is installed (PyPI's
//! `nvidia-cuda-nvrtc-cu12` on a machine without CUDA) — so a kernel's logic and its syntax are
//! checked before it meets a GPU.

pub mod codegen;
pub mod reduce_gen;

#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
pub use gpu::Gpu;
