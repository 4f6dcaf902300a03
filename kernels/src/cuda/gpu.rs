//! A GPU through the CUDA driver (`cudarc`, loaded at run time): its context and stream, device
//! memory and copies, and the generated kernels ([`super::codegen`]) compiled by NVRTC for the
//! GPU's own architecture, once per kernel name (kept in memory), and launched on the stream.
//!
//! `cudarc` panics where a library it needs is missing; [`Gpu::open`] first loads the driver and
//! NVRTC itself ([`crate::dl`]) and answers an error naming what is missing instead.
//!
//! This is the first step of the CUDA kernel library: maps and reductions run on device memory
//! given as [`Args`] (and [`ReduceArgs`]). Device memory is not yet a [`crate::Buffer`] kind and the library does not yet
//! implement [`crate::Kernels`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::codegen::{Args, Kernel};
use super::reduce_gen::{ReduceArgs, ReduceKernels};

// SAFETY: `Args` is `#[repr(C)]` plain data (integers and addresses), laid out as the generated
// source's `NxArgs`, and passed to kernels by value.
unsafe impl DeviceRepr for Args {}
// SAFETY: as `Args`: `#[repr(C)]` integers and an address, laid out as the source's `NxRed`.
unsafe impl DeviceRepr for ReduceArgs {}

/// Threads a block of a map's launch.
const THREADS: u32 = 256;

/// A GPU ready to run generated kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// `compute_XY` of the GPU, what NVRTC compiles for.
    arch: &'static str,
    multiprocessors: u32,
    kernels: Mutex<HashMap<String, CudaFunction>>,
}

/// Loads the first of `names` that loads, or answers why none does.
fn present(what: &str, names: &[&str]) -> Result<(), String> {
    let mut why = Vec::new();
    for n in names {
        match crate::dl::Library::open(n) {
            Ok(_) => return Ok(()),
            Err(e) => why.push(e),
        }
    }
    Err(format!("no {what}: {}", why.join("; ")))
}

fn driver_error(what: &str, e: impl std::fmt::Debug) -> String {
    format!("nx_kernels::cuda::Gpu: {what}: {e:?}")
}

impl Gpu {
    /// The GPU of `ordinal`, with a stream of its own.
    ///
    /// # Errors
    /// A missing driver or NVRTC (named, with where the loader looked), or the driver's error.
    pub fn open(ordinal: usize) -> Result<Gpu, String> {
        present("CUDA driver", &["libcuda.so.1", "libcuda.so"])?;
        present("NVRTC", &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"])?;
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error(&format!("device {ordinal}"), e))?;
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attr = |a| ctx.attribute(a).map_err(|e| driver_error("an attribute", e));
        let (major, minor) = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let multiprocessors = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        // NVRTC takes the architecture as a static string: the ones nx names
        let arch = match (major, minor) {
            (9, 0) => "compute_90",
            (8, 9) => "compute_89",
            (8, 6) => "compute_86",
            (8, 0) => "compute_80",
            (10, 0) => "compute_100",
            (12, 0) => "compute_120",
            _ => "compute_80",
        };
        let stream = ctx.new_stream().map_err(|e| driver_error("a stream", e))?;
        Ok(Gpu { ctx, stream, arch, multiprocessors, kernels: Mutex::default() })
    }

    /// The GPU's name, as the driver gives it.
    ///
    /// # Errors
    /// The driver's error.
    pub fn name(&self) -> Result<String, String> {
        self.ctx.name().map_err(|e| driver_error("the name", e))
    }

    /// The architecture kernels are compiled for (`compute_90`).
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// `host` copied into fresh device memory.
    ///
    /// # Errors
    /// The driver's error (out of memory, a lost context).
    pub fn upload<T: DeviceRepr + Copy>(&self, host: &[T]) -> Result<CudaSlice<T>, String> {
        self.stream.clone_htod(host).map_err(|e| driver_error("a copy to the device", e))
    }

    /// `dev` copied back to the host, after the stream's work.
    ///
    /// # Errors
    /// The driver's error.
    pub fn download<T: DeviceRepr + Copy + Default>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>, String> {
        self.stream.clone_dtoh(dev).map_err(|e| driver_error("a copy from the device", e))
    }

    /// The device address of `dev`'s first element, for [`Args`] (the stream orders its use).
    pub fn address<T>(&self, dev: &CudaSlice<T>) -> *mut u8 {
        let (p, _sync) = dev.device_ptr(&self.stream);
        p as usize as *mut u8
    }

    /// Fresh zeroed device memory of `bytes` (a reduction's scratch).
    ///
    /// # Errors
    /// The driver's error (out of memory).
    pub fn zeros(&self, bytes: usize) -> Result<CudaSlice<u8>, String> {
        self.stream.alloc_zeros(bytes.max(1)).map_err(|e| driver_error("device memory", e))
    }

    /// The kernel's function: compiled by NVRTC (without contraction, as the generated code
    /// requires) and loaded the first time its name is asked.
    fn function(&self, k: &Kernel) -> Result<CudaFunction, String> {
        Ok(self.functions(&[&k.name], || k.source())?.remove(0))
    }

    /// The functions `names` of the module whose source `source` gives: the module compiled
    /// once and its functions loaded the first time the first name is asked.
    fn functions(&self, names: &[&str], source: impl FnOnce() -> String) -> Result<Vec<CudaFunction>, String> {
        let mut cache = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fs) = names.iter().map(|n| cache.get(*n).cloned()).collect::<Option<Vec<_>>>() {
            return Ok(fs);
        }
        let first = names.first().copied().unwrap_or("");
        let opts = cudarc::nvrtc::CompileOptions {
            fmad: Some(false),
            arch: Some(self.arch),
            options: vec!["--std=c++17".into()],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source(), opts)
            .map_err(|e| format!("nx_kernels::cuda::Gpu: NVRTC on {first}: {e:?}"))?;
        let module = self.ctx.load_module(ptx).map_err(|e| driver_error(&format!("loading {first}"), e))?;
        let mut fs = Vec::with_capacity(names.len());
        for name in names {
            let f = module.load_function(name).map_err(|e| driver_error(&format!("{name} in its module"), e))?;
            cache.insert(name.to_string(), f.clone());
            fs.push(f);
        }
        Ok(fs)
    }

    /// Blocks of `THREADS` for `n` independent items, at most 32 a multiprocessor (the kernels
    /// loop over the rest).
    fn blocks(&self, n: i64) -> u32 {
        let n = u64::try_from(n.max(0)).unwrap_or(0);
        n.div_ceil(u64::from(THREADS)).clamp(1, u64::from(self.multiprocessors) * 32) as u32
    }

    /// Launches the map `k` over `args` (device addresses of memory this GPU holds) on the
    /// stream, and waits for it.
    ///
    /// # Errors
    /// NVRTC's or the driver's error, naming the kernel.
    ///
    /// # Safety
    /// `args` addresses live device memory of this GPU over the loop it describes, the
    /// destinations C-contiguous, disjoint from the loads and from each other.
    pub unsafe fn map(&self, k: &Kernel, args: &Args) -> Result<(), String> {
        let f = self.function(k)?;
        let cfg =
            LaunchConfig { grid_dim: (self.blocks(args.n), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&f);
        b.arg(args);
        // SAFETY: the caller's contract; the kernel takes one `NxArgs` by value.
        unsafe { b.launch(cfg) }.map_err(|e| driver_error(&format!("launching {}", k.name), e))?;
        self.stream.synchronize().map_err(|e| driver_error(&format!("running {}", k.name), e))
    }

    /// Launches the reduction `k` over `args` and `red` on the stream: every chunk's partial into
    /// `red.scratch`, then each output's partials combined and stored; waits for both.
    ///
    /// # Errors
    /// NVRTC's or the driver's error, naming the kernel.
    ///
    /// # Safety
    /// As [`Gpu::map`], over the loop in the host's order ([`ReduceArgs`]); `red.scratch`
    /// addresses device memory of `outputs · chunks · reductions ·`
    /// [`super::reduce_gen::PART_BYTES`] bytes that nothing else uses meanwhile.
    pub unsafe fn reduce(&self, k: &ReduceKernels, args: &Args, red: &ReduceArgs) -> Result<(), String> {
        let fs = self.functions(&[&k.chunks.name, &k.finish.name], || k.source())?;
        let (chunks, finish) = (&fs[0], &fs[1]);
        for (f, n, name) in
            [(chunks, red.outputs.saturating_mul(red.chunks), &k.chunks.name), (finish, red.outputs, &k.finish.name)]
        {
            let cfg =
                LaunchConfig { grid_dim: (self.blocks(n), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.stream.launch_builder(f);
            b.arg(args);
            b.arg(red);
            // SAFETY: the caller's contract; the kernels take `NxArgs` and `NxRed` by value, and
            // the stream runs the finish after the chunks.
            unsafe { b.launch(cfg) }.map_err(|e| driver_error(&format!("launching {name}"), e))?;
        }
        self.stream.synchronize().map_err(|e| driver_error(&format!("running {}", k.chunks.name), e))
    }
}
