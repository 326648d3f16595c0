//! Opening vendor libraries at run time.
//!
//! Libraries are opened by their runtime sonames with `RTLD_NOW` (every
//! symbol resolved up front, so a broken install fails at load, not in the
//! middle of a transfer) and `RTLD_LOCAL`, and the handles live for the rest
//! of the process: the tables that hold them sit in statics, which are never
//! dropped.

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// A loaded library and the name it was found under.
pub struct Loaded {
    /// The library, open for the rest of the process.
    pub lib: Library,
    /// The soname it was opened under.
    pub name: &'static str,
}

/// Opens the first of `names` that loads. The error names every soname
/// tried and the loader's reason for the first (preferred) one.
pub fn open_first(names: &[&'static str]) -> Result<Loaded, String> {
    let mut first_failure = None;
    for &name in names {
        // SAFETY: loading runs the library's initializers. The names are the
        // vendors' own runtime libraries (libibverbs, libamdhip64), whose
        // initializers are safe to run at any time on any thread.
        match unsafe { Library::open(Some(name), RTLD_NOW | RTLD_LOCAL) } {
            Ok(lib) => return Ok(Loaded { lib, name }),
            Err(e) => {
                first_failure.get_or_insert(e.to_string());
            }
        }
    }
    Err(format!(
        "none of {} could be loaded ({})",
        names.join(", "),
        first_failure.unwrap_or_else(|| "no names given".into())
    ))
}

/// Looks up `symbol` (NUL-terminated) as a value of type `T`.
///
/// # Safety
///
/// `T` must be the exact C type of the symbol (for a function, a function
/// pointer with its C prototype), and the value must not be used after
/// `lib` is unloaded (ours never are).
pub unsafe fn symbol<T: Copy>(loaded: &Loaded, symbol: &'static [u8]) -> Result<T, String> {
    // SAFETY: the caller guarantees that `T` is the symbol's type.
    match unsafe { loaded.lib.get::<T>(symbol) } {
        Ok(sym) => Ok(*sym),
        Err(_) => Err(format!(
            "{}: symbol {} not found",
            loaded.name,
            String::from_utf8_lossy(symbol.strip_suffix(b"\0").unwrap_or(symbol))
        )),
    }
}

/// Stub libraries for the loaders' tests.
#[cfg(test)]
pub(crate) mod stub {
    use std::path::PathBuf;
    use std::process::Command;

    /// A scratch directory for stub libraries, removed on drop.
    pub(crate) struct StubDir(PathBuf);

    impl StubDir {
        pub(crate) fn new(test: &str) -> StubDir {
            let dir =
                std::env::temp_dir().join(format!("hipobj-stub-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("creating the stub directory");
            StubDir(dir)
        }

        /// A shared library exporting `symbols` as empty functions (never
        /// called), built with `cc`; a missing compiler fails the test.
        pub(crate) fn library(&self, name: &str, symbols: &[&str]) -> &'static str {
            let src = self.0.join(format!("{name}.c"));
            let lib = self.0.join(format!("{name}.so"));
            let body: String = symbols
                .iter()
                .map(|s| format!("void {s}(void) {{}}\n"))
                .collect();
            std::fs::write(&src, body).expect("writing the stub source");
            let out = Command::new("cc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(&lib)
                .arg(&src)
                .output()
                .unwrap_or_else(|e| panic!("cannot run cc (a C toolchain is required): {e}"));
            assert!(
                out.status.success(),
                "cc failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // dl::open_first keeps names for the life of the process.
            Box::leak(lib.to_string_lossy().into_owned().into_boxed_str())
        }
    }

    impl Drop for StubDir {
        fn drop(&mut self) {
            // Unmapped or not, the files may go (Linux keeps mapped pages).
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
