//! Libraries loaded at run time (`dlopen`): the CUDA driver and its libraries (NVRTC, cuBLAS,
//! NCCL) are found on the machine that runs, never linked, so nx builds and runs without them.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

unsafe extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
    fn dlclose(handle: *mut c_void) -> c_int;
}

/// The last `dlerror`, in words.
fn last_error() -> String {
    // SAFETY: `dlerror` answers null or a NUL-terminated message it owns until the next call.
    let p = unsafe { dlerror() };
    if p.is_null() {
        "no reason given".to_string()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A loaded library, closed when dropped.
///
/// ```
/// let m = nx_kernels::dl::Library::open("libm.so.6")?;
/// // SAFETY: `cos` is `double cos(double)`.
/// let cos: unsafe extern "C" fn(f64) -> f64 = unsafe { m.get("cos")? };
/// assert_eq!(unsafe { cos(0.0) }, 1.0);
/// // SAFETY: the symbol is never called; its lookup fails.
/// let missing = unsafe { m.get::<unsafe extern "C" fn()>("no_such_symbol") };
/// assert!(missing.unwrap_err().contains("no_such_symbol"));
/// # Ok::<(), String>(())
/// ```
pub struct Library {
    handle: *mut c_void,
    path: String,
}

impl Library {
    /// The library at `path` (a name alone: where the dynamic loader looks).
    ///
    /// # Errors
    /// Why it does not load, in words, naming it.
    pub fn open(path: &str) -> Result<Library, String> {
        let c = CString::new(path).map_err(|_| format!("{path:?} holds a NUL byte"))?;
        // SAFETY: a NUL-terminated path; loading runs the library's initialisers, as any use does.
        let handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("{path} does not load: {}", last_error()));
        }
        Ok(Library { handle, path: path.to_string() })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The address of `name`, as a function of type `F`.
    ///
    /// # Errors
    /// A library without the symbol, naming both; a type `F` that is not pointer-sized.
    ///
    /// # Safety
    /// `F` is the symbol's true type: a function pointer type of the C ABI.
    pub unsafe fn get<F: Copy>(&self, name: &str) -> Result<F, String> {
        if std::mem::size_of::<F>() != std::mem::size_of::<*mut c_void>() {
            return Err(format!("{name}: a function pointer type is pointer-sized"));
        }
        let c = CString::new(name).map_err(|_| format!("{name:?} holds a NUL byte"))?;
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("{} has no {name}", self.path));
        }
        // SAFETY: the caller's contract: `F` is a function pointer of the symbol's type, of the
        // size checked above.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: a handle `dlopen` answered, closed once; what was read from it is not kept.
        unsafe { dlclose(self.handle) };
    }
}
