//! The production platform: libibverbs, librdmacm and the GPU runtimes (HIP,
//! the CUDA driver), loaded on first use, and the topology read from `/sys`.
//!
//! An application that never calls `hipObjInit` never loads any of them.
//! A successful load is kept for the rest of the process; a failed one is
//! tried again at the next init, so installing a missing package does not
//! need a restart.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::cm::{self, LoadedCm};
use super::gpu::{self, LoadedCuda, LoadedHip};
use super::topology::SysfsTopology;
use super::verbs::{self, LoadedVerbs};
use super::{Cm, Gpu, GpuRuntime, Platform, Topology, Verbs};
use crate::error::{Error, Result};

/// The production platform.
#[derive(Default)]
pub struct SystemPlatform {
    verbs: Mutex<Option<Arc<LoadedVerbs>>>,
    cm: Mutex<Option<Arc<LoadedCm>>>,
    hip: Mutex<Option<Arc<LoadedHip>>>,
    cuda: Mutex<Option<Arc<LoadedCuda>>>,
}

/// Returns `Some(cached)` or loads with `open` and caches a success.
fn load_once<T>(slot: &Mutex<Option<Arc<T>>>, open: impl FnOnce() -> Result<T>) -> Result<Arc<T>> {
    let mut slot = slot.lock();
    if let Some(loaded) = slot.as_ref() {
        return Ok(loaded.clone());
    }
    let loaded = Arc::new(open()?);
    *slot = Some(loaded.clone());
    Ok(loaded)
}

impl Platform for SystemPlatform {
    fn verbs(&self) -> Result<Arc<dyn Verbs>> {
        let loaded = load_once(&self.verbs, || LoadedVerbs::open(verbs::loader::SONAMES))?;
        Ok(loaded)
    }

    fn cm(&self) -> Result<Arc<dyn Cm>> {
        let loaded = load_once(&self.cm, || LoadedCm::open(cm::SONAMES))?;
        Ok(loaded)
    }

    fn topology(&self) -> Result<Arc<dyn Topology>> {
        Ok(Arc::new(SysfsTopology::system()))
    }

    fn gpu(&self, runtime: GpuRuntime) -> Result<Arc<dyn Gpu>> {
        let hip = || -> Result<Arc<dyn Gpu>> {
            Ok(load_once(&self.hip, || {
                LoadedHip::open(gpu::loader::SONAMES)
            })?)
        };
        let cuda = || -> Result<Arc<dyn Gpu>> {
            Ok(load_once(&self.cuda, || {
                LoadedCuda::open(gpu::cuda::SONAMES)
            })?)
        };
        match runtime {
            GpuRuntime::Hip => hip(),
            GpuRuntime::Cuda => cuda(),
            GpuRuntime::Auto => choose(hip(), cuda),
        }
    }
}

/// [`GpuRuntime::Auto`]: HIP when it loads and sees a GPU; else CUDA when
/// it does (loaded only then); else the first that loaded, HIP before CUDA,
/// so that a host without a GPU gets its runtime's own answer; else both
/// failures in one.
pub fn choose(
    hip: Result<Arc<dyn Gpu>>,
    cuda: impl FnOnce() -> Result<Arc<dyn Gpu>>,
) -> Result<Arc<dyn Gpu>> {
    let sees_a_gpu = |gpu: &Arc<dyn Gpu>| gpu.device_count().is_ok_and(|n| n > 0);
    if let Ok(hip) = &hip {
        if sees_a_gpu(hip) {
            return Ok(Arc::clone(hip));
        }
    }
    let cuda = cuda();
    match (hip, cuda) {
        (_, Ok(cuda)) if sees_a_gpu(&cuda) => Ok(cuda),
        (Ok(hip), _) => Ok(hip),
        (Err(_), Ok(cuda)) => Ok(cuda),
        (Err(hip), Err(cuda)) => Err(Error::HipMissing(format!(
            "no GPU runtime: {}; {}",
            missing(&hip),
            missing(&cuda)
        ))),
    }
}

/// The text of a runtime's load failure.
fn missing(e: &Error) -> String {
    match e {
        Error::HipMissing(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The process's one production platform, never destroyed.
pub fn system() -> Arc<dyn Platform> {
    static SYSTEM: OnceLock<Arc<SystemPlatform>> = OnceLock::new();
    SYSTEM
        .get_or_init(|| Arc::new(SystemPlatform::default()))
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::gpu::{FakeGpu, FakeGpuDevice};
    use crate::testing::{Counters, Faults};

    /// A fake runtime with `gpus` devices, named by its first bus id.
    fn runtime(gpus: usize, bus: &str) -> Arc<dyn Gpu> {
        let devices = (0..gpus)
            .map(|_| FakeGpuDevice {
                pci_bus_id: bus.to_owned(),
            })
            .collect();
        Arc::new(FakeGpu::new(
            devices,
            Arc::new(Faults::new()),
            Arc::new(Counters::new()),
        ))
    }

    fn missing(name: &str) -> Result<Arc<dyn Gpu>> {
        Err(Error::HipMissing(format!("none of {name} could be loaded")))
    }

    /// Which fake `choose` returned: its device 0's bus id.
    fn which(gpu: Result<Arc<dyn Gpu>>) -> String {
        match gpu {
            Ok(gpu) => gpu.pci_bus_id(0).unwrap_or_else(|_| "no device".into()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn auto_takes_hip_when_it_sees_a_gpu_and_never_loads_cuda() {
        let chosen = choose(Ok(runtime(1, "hip")), || panic!("CUDA was loaded"));
        assert_eq!(which(chosen), "hip");
    }

    #[test]
    fn auto_takes_cuda_when_only_cuda_sees_a_gpu() {
        assert_eq!(
            which(choose(Ok(runtime(0, "hip")), || Ok(runtime(1, "cuda")))),
            "cuda"
        );
        assert_eq!(
            which(choose(missing("libamdhip64.so.6"), || Ok(runtime(
                2, "cuda"
            )))),
            "cuda"
        );
    }

    #[test]
    fn auto_without_a_gpu_keeps_the_first_runtime_that_loaded() {
        let hip = runtime(0, "hip");
        let chosen = choose(Ok(Arc::clone(&hip)), || Ok(runtime(0, "cuda"))).unwrap();
        assert!(Arc::ptr_eq(&chosen, &hip));
        let cuda = runtime(0, "cuda");
        let chosen = choose(missing("libamdhip64.so.6"), || Ok(Arc::clone(&cuda))).unwrap();
        assert!(Arc::ptr_eq(&chosen, &cuda));
    }

    #[test]
    fn a_missing_cuda_driver_is_not_called_a_hip_runtime() {
        let text = missing("libcuda.so.1").err().unwrap().to_string();
        assert!(!text.contains("HIP"), "{text}");
        assert!(text.contains("libcuda.so.1"), "{text}");
    }

    #[test]
    fn auto_with_neither_runtime_names_both() {
        let err = choose(missing("libamdhip64.so.6"), || missing("libcuda.so.1"))
            .err()
            .unwrap();
        assert_eq!(err.hip_error(), crate::error::HIP_ERROR_NO_DEVICE);
        let text = err.to_string();
        assert!(
            text.contains("libamdhip64.so.6") && text.contains("libcuda.so.1"),
            "{text}"
        );
    }
}
